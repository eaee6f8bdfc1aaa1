#define _GNU_SOURCE
#include "ckeyholdspawn.h"

#include <errno.h>
#include <signal.h>
#include <termios.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/wait.h>

/* The warden's word from the kernel that keyhold died (PR_SET_PDEATHSIG); keyhold never sends it. */
#define WARDEN_PARENT_DIED SIGUSR1

/* COMMAND itself, in the warden's group: stdin/stdout from the pipes, nothing else open,
 * signals as a freshly started program has them. Never returns. */
static void exec_command(const char *path, char *const argv[], char *const envp[], int in_fd, int out_fd,
                         const sigset_t *mask) {
    /* The warden never dies before COMMAND except by the group's SIGKILL; this is for the rest. */
    prctl(PR_SET_PDEATHSIG, (unsigned long)SIGKILL, 0UL, 0UL, 0UL);
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0) _exit(127);
    close_range(3, ~0U, 0);
    int reset[] = { SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD, WARDEN_PARENT_DIED };
    for (unsigned i = 0; i < sizeof reset / sizeof reset[0]; i++) signal(reset[i], SIG_DFL);
    sigprocmask(SIG_SETMASK, mask, NULL);
    execve(path, argv, envp);
    _exit(127);
}

/* The group's leader: starts COMMAND, passes on its exit status, and kills the whole group
 * (COMMAND and whatever it started there) when keyhold dies, even by SIGKILL. A fork of
 * keyhold that never execs: only async-signal-safe calls, all signals blocked (waited for). */
static void warden(pid_t keyhold, const char *path, char *const argv[], char *const envp[], int in_fd, int out_fd,
                   const sigset_t *mask) {
    signal(SIGCHLD, SIG_DFL);
    if (prctl(PR_SET_PDEATHSIG, (unsigned long)WARDEN_PARENT_DIED, 0UL, 0UL, 0UL) != 0) _exit(127);
    /* keyhold may have died before prctl: then no signal would come. */
    if (getppid() != keyhold) kill(0, SIGKILL);
    pid_t command = fork();
    if (command == 0) exec_command(path, argv, envp, in_fd, out_fd, mask);
    if (command < 0) _exit(127);
    /* The pipes' ends must be COMMAND's alone (its output ends when it and its children close it). */
    close_range(0, ~0U, 0);
    sigset_t wanted;
    sigemptyset(&wanted);
    sigaddset(&wanted, SIGCHLD);
    sigaddset(&wanted, WARDEN_PARENT_DIED);
    for (;;) {
        int sig = sigwaitinfo(&wanted, NULL);
        if (sig == WARDEN_PARENT_DIED) kill(0, SIGKILL);
        if (sig != SIGCHLD) continue;
        int status;
        if (waitpid(command, &status, WNOHANG) != command) continue;
        if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
        kill(getpid(), SIGKILL);  /* COMMAND was killed: so is its warden, as keyhold sees it */
    }
}

/* fork rather than posix_spawn: PR_SET_PDEATHSIG must be set in the child. */
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
        warden(parent, path, argv, envp, in_fd, out_fd, &old);
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
