#ifndef CKEYHOLDSPAWN_H
#define CKEYHOLDSPAWN_H

#include <sys/types.h>

/* A child bound to the calling thread's life (issue 36 item 1, `keyhold rotate`'s COMMAND).
 * The pid returned is a warden: a fork of the caller that leads a new process group, runs
 * COMMAND in it (stdin/stdout from `in_fd`/`out_fd`, stderr inherited, nothing else open,
 * signals at their defaults), exits with COMMAND's exit status (or dies by SIGKILL when COMMAND
 * died by a signal), and kills the whole group when the calling thread dies, even by SIGKILL
 * (PR_SET_PDEATHSIG). The caller kills the group (kill(-pid, SIGKILL)) to stop it. With
 * `tty_fd` (the controlling terminal, ours in the foreground; else -1) the group becomes the
 * terminal's foreground group, so COMMAND can still prompt on /dev/tty (a background group
 * reading it would be stopped) and a Ctrl-C reaches it. `*group` is set to the pid before any
 * signal can be handled, so a handler that kills the group never misses it. Returns the pid,
 * or -1 with errno set. */
pid_t ckh_spawn_bound(const char *path, char *const argv[], char *const envp[], int in_fd, int out_fd,
                      int tty_fd, volatile pid_t *group);

/* Makes the caller's process group the terminal's foreground group again. */
int ckh_take_terminal_back(int tty_fd);

/* 1 once `pid` has exited (left a zombie, not reaped: its process group cannot be reused
 * while the caller kills what is left of it), 0 while it runs, -1 on an error. */
int ckh_exited_unreaped(pid_t pid);

#endif
