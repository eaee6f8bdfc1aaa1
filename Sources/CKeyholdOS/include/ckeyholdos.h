#ifndef CKEYHOLDOS_H
#define CKEYHOLDOS_H
#include <stdint.h>
#include <sys/types.h>
#include <spawn.h>

/* Kernel-verified credentials of a Unix-socket peer. 0 on success, -1 with errno. */
int ckh_peercred(int fd, int32_t *pid, uint32_t *uid, uint32_t *gid);
/* prctl(PR_SET_DUMPABLE) and PR_GET_DUMPABLE (variadic prctl is not callable from Swift). */
int ckh_set_dumpable(int on);
int ckh_get_dumpable(void);
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
   along are closed. Bytes read, 0 at end of stream, -1 with errno (no pidfd then).
   dontwait: MSG_DONTWAIT (-1 with EAGAIN when nothing is there yet). */
long ckh_recv_cred(int fd, void *buf, unsigned long len, int dontwait, int32_t *pid, uint32_t *uid, uint32_t *gid,
                   int32_t *pidfd);
/* ckh_recv_cred into two buffers in turn (len bytes into buf, then up to len2 into buf2): a
   frame's header and its payload with one message's credentials and pidfd. */
long ckh_recv_cred2(int fd, void *buf, unsigned long len, void *buf2, unsigned long len2, int dontwait, int32_t *pid,
                    uint32_t *uid, uint32_t *gid, int32_t *pidfd);
/* recv(MSG_PEEK | MSG_DONTWAIT) without a control buffer: the next bytes, left in the socket,
   at no pidfd's cost. -1 with errno (EAGAIN when nothing is there). */
long ckh_peek(int fd, void *buf, unsigned long len);
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
int ckh_thread_nice_get(int *nice);
int ckh_thread_nice_set(int nice);
/* The real, effective and saved user ids, then group ids, of the calling process: two system
   calls (getresuid, getresgid) where asking for each id is six. 0, or -1 with errno. */
int ckh_process_ids(uint32_t ids[6]);

/* A 32-bit word one thread waits on and another sets (the group commit's members): an
   acquire load, a release store, a compare-and-swap (1 when it swapped), and the futex wait
   (while the word is `expected`) and wake (one waiter). */
uint32_t ckh_word_load(const uint32_t *word);
void ckh_word_store(uint32_t *word, uint32_t value);
int ckh_word_swap_if(uint32_t *word, uint32_t expected, uint32_t desired);
void ckh_word_wait(uint32_t *word, uint32_t expected);
void ckh_word_wake(uint32_t *word);


/* The broker's event loop (EventLoop.swift). */
int ckh_epoll_create(void);
/* op: 0 add, 1 modify, 2 delete; armed for input, one-shot when asked, with an id. */
int ckh_epoll_arm(int epfd, int fd, int op, int oneshot, uint64_t id);
int ckh_epoll_wait_one(int epfd, uint64_t *id);
int ckh_eventfd_create(void);
void ckh_eventfd_signal(int fd);
void ckh_eventfd_drain(int fd);
int ckh_frame_waiting(int fd, uint32_t max_payload, unsigned char header[4]);
/* readlink of /proc/<pid>/exe into buf (not terminated): its length, or -1 with errno. */
long ckh_read_exe_link(int pid, char *buf, unsigned long size);
/* Sends without waiting: the bytes taken, or -errno. */
long ckh_send_nowait(int fd, const void *buf, unsigned long len);

/* glibc malloc: at most `arenas` arenas for the process (the broker asks for two). */
void ckh_limit_malloc_arenas(int arenas);

#endif
