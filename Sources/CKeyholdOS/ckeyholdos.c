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
#include <spawn.h>
#include <unistd.h>
#include "ckeyholdos.h"

int ckh_peercred(int fd, int32_t *pid, uint32_t *uid, uint32_t *gid) {
    struct ucred c;
    socklen_t len = sizeof(c);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) return -1;
    *pid = c.pid; *uid = c.uid; *gid = c.gid;
    return 0;
}
int ckh_set_dumpable(int on) { return prctl(PR_SET_DUMPABLE, (unsigned long)on, 0UL, 0UL, 0UL); }
int ckh_get_dumpable(void) { return prctl(PR_GET_DUMPABLE, 0UL, 0UL, 0UL, 0UL); }
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
long ckh_sendto_unix(int fd, const void *buf, unsigned long len, int flags, const char *path) {
    struct sockaddr_un a; socklen_t alen;
    if (unix_address(path, &a, &alen) != 0) return -1;
    return (long)sendto(fd, buf, len, flags, (struct sockaddr *)&a, alen);
}
