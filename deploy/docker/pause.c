/*
 * pause: PID 1 of a pod sandbox, as Kubernetes' pause image runs it. It holds the pod's
 * namespaces, reaps every child it inherits (with `shareProcessNamespace: true` the pod's
 * orphaned processes are re-parented to it), sleeps until SIGTERM or SIGINT and then exits 0.
 *
 * Built static (`gcc -static -Os -s`), so its image needs nothing but this file
 * (deploy/docker/pause.Dockerfile; scripts/build-images.sh compiles it the same way).
 *
 * The three signals stay blocked except inside sigsuspend(), so a signal can never arrive
 * between the check of `stop` and the wait (a plain pause() loop could sleep through it).
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig) {
    (void)sig;
    stop = 1;
}

/* A handler, not SIG_DFL: a default-ignored SIGCHLD would not end sigsuspend(). */
static void on_child(int sig) { (void)sig; }

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("hami-rs pause");
        return 0;
    }
    if (getpid() != 1)
        fprintf(stderr, "pause: warning: not PID 1; orphans of the pod are not reaped here\n");

    sigset_t blocked, during_wait;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigaddset(&blocked, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &blocked, &during_wait) != 0) {
        perror("pause: sigprocmask");
        return 1;
    }
    sigdelset(&during_wait, SIGTERM);
    sigdelset(&during_wait, SIGINT);
    sigdelset(&during_wait, SIGCHLD);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_stop;
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0) {
        perror("pause: sigaction");
        return 1;
    }
    sa.sa_handler = on_child;
    sa.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &sa, NULL) != 0) {
        perror("pause: sigaction");
        return 1;
    }

    for (;;) {
        /* Reap whatever exited; ECHILD (no children) ends the loop too. */
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        if (stop)
            return 0;
        sigsuspend(&during_wait);
    }
}
