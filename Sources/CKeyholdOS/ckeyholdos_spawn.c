#define _GNU_SOURCE
#include "ckeyholdos_spawn.h"

#include <errno.h>
#include <signal.h>
#include <termios.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/wait.h>

/* fork + exec rather than posix_spawn: PR_SET_PDEATHSIG must be set in the child. Between
 * fork and exec the child makes only async-signal-safe calls. */
pid_t ckh_spawn_bound(const char *path, char *const argv[], char *const envp[], int in_fd, int out_fd,
                      int tty_fd, volatile pid_t *group) {
    sigset_t all, old;
    sigfillset(&all);
    /* No handler runs between fork and `*group` being set (nor in the child before exec). */
    if (pthread_sigmask(SIG_BLOCK, &all, &old) != 0) return -1;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        if (setpgid(0, 0) != 0) _exit(127);
        /* SIGTTOU is blocked here, so a background group may take the terminal. */
        if (tty_fd >= 0) tcsetpgrp(tty_fd, getpid());
        if (prctl(PR_SET_PDEATHSIG, (unsigned long)SIGKILL, 0UL, 0UL, 0UL) != 0) _exit(127);
        /* The parent may have died before prctl: then nobody would kill us later. */
        if (getppid() != parent) _exit(127);
        if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0) _exit(127);
        close_range(3, ~0U, 0);
        signal(SIGPIPE, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        execve(path, argv, envp);
        _exit(127);
    }
    int saved = errno;
    if (pid > 0) {
        /* Also from this side, so the group exists before a handler could kill it. */
        setpgid(pid, pid);
        if (tty_fd >= 0) tcsetpgrp(tty_fd, pid);
        *group = pid;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = saved;
    return pid;
}

int ckh_exited_unreaped(pid_t pid) {
    siginfo_t info;
    info.si_pid = 0;
    if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == EINTR ? 0 : -1;
    return info.si_pid == pid ? 1 : 0;
}

int ckh_take_terminal_back(int tty_fd) {
    sigset_t ttou, old;
    sigemptyset(&ttou);
    sigaddset(&ttou, SIGTTOU);
    /* From a background group tcsetpgrp raises SIGTTOU unless it is blocked. */
    if (pthread_sigmask(SIG_BLOCK, &ttou, &old) != 0) return -1;
    int rc = tcsetpgrp(tty_fd, getpgrp());
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
