#ifndef CKEYHOLDOS_H
#define CKEYHOLDOS_H
#include <stdint.h>
#include <sys/types.h>
#include <spawn.h>

/* Kernel-verified credentials of a Unix-socket peer. 0 on success, -1 with errno. */
int ckh_peercred(int fd, int32_t *pid, uint32_t *uid, uint32_t *gid);
/* prctl(PR_SET_DUMPABLE) (variadic prctl is not callable from Swift). */
int ckh_set_dumpable(int on);
/* accept4(..., SOCK_CLOEXEC). */
int ckh_accept_cloexec(int fd);
/* pipe2(fds, O_CLOEXEC): neither end leaks into a child the CLI spawns. */
int ckh_pipe_cloexec(int fds[2]);
/* posix_spawn_file_actions_addclosefrom_np: the child keeps no descriptor from `from` up. */
int ckh_spawn_closefrom(posix_spawn_file_actions_t *actions, int from);
/* Block or unblock SIGINT in the calling thread (pam_fprintd cancels on a blocked SIGINT via signalfd). */
int ckh_block_sigint(int block);
/* Ask the kernel to SIGKILL this process when its parent dies (PAM helper processes). */
int ckh_set_parent_death_kill(void);
/* Unix-socket addressing by path, so no Swift code fills a sockaddr_un by hand. Each returns
   -1 with errno ENAMETOOLONG when the path does not fit sun_path. */
int ckh_connect_unix(int fd, const char *path);
int ckh_bind_unix(int fd, const char *path);
/* dup3(fresh, fd, O_CLOEXEC): puts the socket behind `fresh` at number `fd` in one step (a
   thread using `fd` meanwhile sees the old socket or the new one), close-on-exec throughout. */
int ckh_replace_fd(int fresh, int fd);
/* recvmsg of up to len bytes with the sender's SCM_CREDENTIALS (pid -1 when none came with
   them) and SCM_PIDFD: *pidfd is the sender's pidfd, which the caller must close; -1 when none
   came (a kernel before 6.5), -2 when the kernel said it could make none. Any descriptors passed
   along are closed. Bytes read, 0 at end of stream, -1 with errno (no pidfd then). */
long ckh_recv_cred(int fd, void *buf, unsigned long len, int32_t *pid, uint32_t *uid, uint32_t *gid, int32_t *pidfd);
/* SO_PASSCRED on, and SO_PASSPIDFD where the kernel has it: every message carries its sender's
   credentials and a pidfd of it (both inherited by accepted sockets). 0, or -1 with errno when
   SO_PASSCRED could not be set. */
int ckh_set_passcred(int fd);
/* A pidfd for the socket's peer (SO_PEERPIDFD), else -errno: -ENOPROTOOPT where the kernel
   has no such option (before Linux 6.5). */
int ckh_peer_pidfd(int fd);
/* pidfd_open(pid, 0). */
int ckh_pidfd_open(int32_t pid);
/* A close-on-exec duplicate of fd, or -1. */
int ckh_dup_cloexec(int fd);
/* Whether this kernel has SO_PEERPIDFD: 1 yes, 0 no (ENOPROTOOPT), -1 unknown (probe failed). */
int ckh_kernel_has_peer_pidfd(void);
/* 1 while the process of a pidfd is alive, 0 once it has exited (or on error). */
int ckh_pidfd_alive(int pidfd);
/* poll of one descriptor: revents, 0 on timeout, -1 with errno (EINTR retried). */
int ckh_poll1(int fd, int events, int timeout_ms);
/* The inode of the other end of a connected Unix socket, from sock_diag. 0, or -1 with errno. */
int ckh_unix_peer_inode(int fd, uint64_t *peer);
/* Processes holding socket `inode` (from /proc/PID/fd): how many (pids stores the first max), -1 on error. */
int ckh_socket_holders(uint64_t inode, int32_t *pids, int max);
/* Raise RLIMIT_NOFILE's soft limit to want (capped by the hard limit). */
int ckh_raise_nofile(uint64_t want);

#endif
