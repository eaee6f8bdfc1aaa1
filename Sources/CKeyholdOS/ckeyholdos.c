#define _GNU_SOURCE
#include <stddef.h>
#include <signal.h>
#include <pthread.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/un.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <spawn.h>
#include <unistd.h>
#include <sys/syscall.h>
#include "ckeyholdos.h"

int ckh_peercred(int fd, int32_t *pid, uint32_t *uid, uint32_t *gid) {
    struct ucred c;
    socklen_t len = sizeof(c);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) return -1;
    *pid = c.pid; *uid = c.uid; *gid = c.gid;
    return 0;
}
int ckh_set_dumpable(int on) { return prctl(PR_SET_DUMPABLE, (unsigned long)on, 0UL, 0UL, 0UL); }
int ckh_accept_cloexec(int fd) { return accept4(fd, NULL, NULL, SOCK_CLOEXEC); }
int ckh_pipe_cloexec(int fds[2]) { return pipe2(fds, O_CLOEXEC); }
int ckh_spawn_closefrom(posix_spawn_file_actions_t *actions, int from) {
    return posix_spawn_file_actions_addclosefrom_np(actions, from);
}
int ckh_block_sigint(int block) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    return pthread_sigmask(block ? SIG_BLOCK : SIG_UNBLOCK, &set, NULL);
}
int ckh_set_parent_death_kill(void) { return prctl(PR_SET_PDEATHSIG, (unsigned long)SIGKILL, 0UL, 0UL, 0UL); }

static int unix_address(const char *path, struct sockaddr_un *addr, socklen_t *len) {
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(addr->sun_path)) { errno = ENAMETOOLONG; return -1; }
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    memcpy(addr->sun_path, path, n + 1);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    return 0;
}
int ckh_connect_unix(int fd, const char *path) {
    struct sockaddr_un a; socklen_t len;
    if (unix_address(path, &a, &len) != 0) return -1;
    return connect(fd, (struct sockaddr *)&a, len);
}
int ckh_bind_unix(int fd, const char *path) {
    struct sockaddr_un a; socklen_t len;
    if (unix_address(path, &a, &len) != 0) return -1;
    return bind(fd, (struct sockaddr *)&a, len);
}
int ckh_replace_fd(int fresh, int fd) { return dup3(fresh, fd, O_CLOEXEC); }

/* ---- Who sent a request (issue 8, item 3) and bounded waits (item 1). ---- */
#include <poll.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <linux/rtnetlink.h>
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
/* Linux 6.5's values, for headers older than the kernel (glibc 2.36's). */
#ifndef SO_PASSPIDFD
#define SO_PASSPIDFD 76
#endif
#ifndef SCM_PIDFD
#define SCM_PIDFD 0x04
#endif

long ckh_recv_cred(int fd, void *buf, unsigned long len, int32_t *pid, uint32_t *uid, uint32_t *gid, int32_t *pidfd) {
    /* Room for the credentials, the sender's pidfd and a few descriptors: any descriptor a peer
       passes is closed. */
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int)) + CMSG_SPACE(16 * sizeof(int))];
    } control;
    struct iovec iov = { .iov_base = buf, .iov_len = len };
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov; msg.msg_iovlen = 1;
    msg.msg_control = control.bytes; msg.msg_controllen = sizeof(control.bytes);
    *pid = -1; *uid = (uint32_t)-1; *gid = (uint32_t)-1; *pidfd = -1;
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET) continue;
        if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
            struct ucred u;
            memcpy(&u, CMSG_DATA(c), sizeof(u));
            *pid = u.pid; *uid = u.uid; *gid = u.gid;
        } else if (c->cmsg_type == SCM_PIDFD && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            /* The kernel's pidfd of the sender, or its error (a negative number) when it could
               not make one, as for a sender already reaped on kernels before 6.16. */
            int got;
            memcpy(&got, CMSG_DATA(c), sizeof(int));
            if (*pidfd >= 0) close(*pidfd);  /* never two; kept safe all the same */
            *pidfd = got >= 0 ? got : -2;
        } else if (c->cmsg_type == SCM_RIGHTS) {
            size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count; i++) {
                int passed;
                memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                close(passed);
            }
        }
    }
    return (long)n;
}

int ckh_set_passcred(int fd) {
    int on = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) != 0) return -1;
    /* Where the kernel has it (6.5+); without it the credentials alone name the sender. */
    int saved = errno;
    (void)setsockopt(fd, SOL_SOCKET, SO_PASSPIDFD, &on, sizeof(on));
    errno = saved;
    return 0;
}

int ckh_peer_pidfd(int fd) {
    int pidfd = -1;
    socklen_t len = sizeof(pidfd);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) != 0) return errno > 0 ? -errno : -EIO;
    return pidfd;
}

int ckh_pidfd_open(int32_t pid) { return (int)syscall(SYS_pidfd_open, (pid_t)pid, 0); }

int ckh_dup_cloexec(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }

int ckh_kernel_has_peer_pidfd(void) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return -1;
    int pidfd = ckh_peer_pidfd(pair[0]);
    close(pair[0]);
    close(pair[1]);
    if (pidfd >= 0) { close(pidfd); return 1; }
    return pidfd == -ENOPROTOOPT ? 0 : -1;
}

int ckh_pidfd_alive(int pidfd) {
    struct pollfd p = { .fd = pidfd, .events = POLLIN, .revents = 0 };
    int r = poll(&p, 1, 0);
    if (r < 0) return 0;
    return r == 0 ? 1 : 0; /* readable: the process has exited */
}

int ckh_poll1(int fd, int events, int timeout_ms) {
    struct pollfd p = { .fd = fd, .events = (short)events, .revents = 0 };
    int r;
    do { r = poll(&p, 1, timeout_ms); } while (r < 0 && errno == EINTR);
    if (r <= 0) return r;
    return p.revents;
}

int ckh_unix_peer_inode(int fd, uint64_t *peer) {
    struct stat st;
    if (fstat(fd, &st) != 0) return -1;
    int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl < 0) return -1;
    struct { struct nlmsghdr nlh; struct unix_diag_req req; } q;
    memset(&q, 0, sizeof(q));
    q.nlh.nlmsg_len = sizeof(q);
    q.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    q.nlh.nlmsg_flags = NLM_F_REQUEST;
    q.req.sdiag_family = AF_UNIX;
    q.req.udiag_states = -1;
    q.req.udiag_ino = (uint32_t)st.st_ino;
    q.req.udiag_show = UDIAG_SHOW_PEER;
    q.req.udiag_cookie[0] = q.req.udiag_cookie[1] = (uint32_t)-1;
    struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
    if (sendto(nl, &q, sizeof(q), 0, (struct sockaddr *)&sa, sizeof(sa)) < 0) { close(nl); return -1; }
    union { struct nlmsghdr align; char bytes[8192]; } reply;
    ssize_t n = recv(nl, reply.bytes, sizeof(reply.bytes), 0);
    close(nl);
    if (n < 0) return -1;
    for (struct nlmsghdr *h = (struct nlmsghdr *)reply.bytes; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) { errno = ENOENT; return -1; }
        struct unix_diag_msg *m = NLMSG_DATA(h);
        if (m->udiag_ino != (uint32_t)st.st_ino) continue;
        int alen = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));
        for (struct rtattr *a = (struct rtattr *)(m + 1); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
            if (a->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(a) >= sizeof(uint32_t)) {
                uint32_t v;
                memcpy(&v, RTA_DATA(a), sizeof(v));
                *peer = v;
                return 0;
            }
        }
    }
    errno = ENOENT;
    return -1;
}

int ckh_socket_holders(uint64_t inode, int32_t *pids, int max) {
    char want[64];
    snprintf(want, sizeof(want), "socket:[%llu]", (unsigned long long)inode);
    DIR *proc = opendir("/proc");
    if (proc == NULL) return -1;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(proc)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0) continue;
        char path[64];
        snprintf(path, sizeof(path), "/proc/%ld/fd", pid);
        DIR *fds = opendir(path);
        if (fds == NULL) continue;
        struct dirent *f;
        int holds = 0;
        while (!holds && (f = readdir(fds)) != NULL) {
            if (f->d_name[0] == '.') continue;
            char link[320], target[64];
            snprintf(link, sizeof(link), "/proc/%ld/fd/%s", pid, f->d_name);
            ssize_t n = readlink(link, target, sizeof(target) - 1);
            if (n <= 0) continue;
            target[n] = '\0';
            if (strcmp(target, want) == 0) holds = 1;
        }
        closedir(fds);
        if (holds) {
            if (found < max) pids[found] = (int32_t)pid;
            found++;
        }
    }
    closedir(proc);
    return found;
}

int ckh_raise_nofile(uint64_t want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
    rlim_t target = want;
    if (rl.rlim_max != RLIM_INFINITY && target > rl.rlim_max) target = rl.rlim_max;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= target) return 0;
    rl.rlim_cur = target;
    return setrlimit(RLIMIT_NOFILE, &rl);
}
