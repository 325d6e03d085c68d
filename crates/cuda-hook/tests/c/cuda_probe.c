/* Drives the CUDA driver API like an application: linked with -lcuda, run under LD_PRELOAD.
 * Usage: cuda_probe <command> [args]; prints "rc=<n>" lines the tests read. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
CUresult cuInit(unsigned);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, int);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
CUresult cuGraphCreate(void **, unsigned);
CUresult cuGraphInstantiateWithFlags(void **, void *, unsigned long long);
CUresult cuGraphLaunch(void *, void *);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxDestroy_v2(CUcontext);

static CUcontext context;

static void ctx(void) {
    if (cuInit(0) || cuCtxCreate_v2(&context, 0, 0)) { printf("no context\n"); exit(3); }
}

/* One thread of "threads": alloc/free pairs racing the other threads. */
static size_t thread_bytes, thread_rounds;
static int thread_bad;
static int racers_started; /* racers past their first round: "threads" says "racing" then */
static void *racer(void *arg) {
    /* Thread i allocates (i+1)/8 of the size: mixed sizes share cached blocks. */
    size_t bytes = thread_bytes / 8 * (1 + (size_t)arg % 8);
    cuCtxSetCurrent(context);
    for (size_t r = 0; r < thread_rounds; r++) {
        CUdeviceptr p = 0;
        CUresult rc = cuMemAlloc_v2(&p, bytes);
        if (rc == 0) {
            sched_yield(); /* hold it while others run */
            if (cuMemFree_v2(p)) __atomic_store_n(&thread_bad, 1, __ATOMIC_RELAXED);
        } else if (rc != 2) {
            __atomic_store_n(&thread_bad, 1, __ATOMIC_RELAXED);
        }
        if (r == 0) __atomic_add_fetch(&racers_started, 1, __ATOMIC_RELAXED);
    }
    if (thread_rounds == 0) __atomic_add_fetch(&racers_started, 1, __ATOMIC_RELAXED);
    return 0;
}

typedef struct { unsigned pid; unsigned long long used; } ProcInfoV1;

/* "syscalls": every system call of this thread but write/exit/sigreturn traps (SIGSYS)
 * and is counted instead of run; the count with and without the hook is compared. */
static volatile long trapped;
static void on_sigsys(int sig, siginfo_t *info, void *context) {
    (void)sig; (void)info; (void)context;
    trapped++;
}
static int trap_syscalls(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO;
    if (sigaction(SIGSYS, &sa, 0)) return -1;
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rt_sigreturn, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_write, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_exit_group, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { sizeof filter / sizeof filter[0], filter };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

static size_t arg(char **argv, int i) { return strtoull(argv[i], 0, 0); }

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *cmd = argc > 1 ? argv[1] : "";
    ctx();
    if (!strcmp(cmd, "alloc")) { /* alloc <bytes>: one allocation, then free */
        CUdeviceptr p = 0;
        CUresult rc = cuMemAlloc_v2(&p, arg(argv, 2));
        printf("rc=%d\n", rc);
        if (!rc) printf("free=%d\n", cuMemFree_v2(p));
    } else if (!strcmp(cmd, "meminfo")) { /* meminfo <hold bytes> */
        CUdeviceptr p = 0;
        size_t f = 0, t = 0;
        printf("rc=%d\n", cuMemAlloc_v2(&p, arg(argv, 2)));
        CUresult info = cuMemGetInfo_v2(&f, &t);
        printf("info=%d free=%zu total=%zu\n", info, f, t);
        printf("null=%d\n", cuMemGetInfo_v2(NULL, &t));
    } else if (!strcmp(cmd, "hold")) { /* hold <bytes>: allocate, say so, sleep forever */
        CUdeviceptr p = 0;
        printf("rc=%d\n", cuMemAlloc_v2(&p, arg(argv, 2)));
        for (;;) pause();
    } else if (!strcmp(cmd, "race")) { /* race <threads> <bytes> <rounds> */
        int ok = 0, oom = 0;
        for (size_t r = 0; r < arg(argv, 4); r++) {
            CUdeviceptr p = 0;
            CUresult rc = cuMemAlloc_v2(&p, arg(argv, 3));
            if (rc == 0) { ok++; usleep(200); cuMemFree_v2(p); }
            else if (rc == 2) oom++;
            else { printf("bad rc=%d\n", rc); return 1; }
        }
        printf("ok=%d oom=%d\n", ok, oom);
    } else if (!strcmp(cmd, "threads")) { /* threads <threads> <bytes> <rounds> */
        int n = (int)arg(argv, 2);
        pthread_t t[64];
        thread_bytes = arg(argv, 3);
        thread_rounds = arg(argv, 4);
        if (n > 64) n = 64;
        for (int i = 0; i < n; i++) pthread_create(&t[i], 0, racer, (void *)(size_t)i);
        /* Every racer is mid-storm from here on: a test may kill the process at any instant. */
        while (__atomic_load_n(&racers_started, __ATOMIC_RELAXED) < n) sched_yield();
        printf("racing\n");
        for (int i = 0; i < n; i++) pthread_join(t[i], 0);
        size_t f = 0, total = 0;
        cuMemGetInfo_v2(&f, &total);
        printf("bad=%d free=%zu total=%zu\n", thread_bad, f, total);
    } else if (!strcmp(cmd, "fork")) { /* fork <bytes>: parent and child each allocate */
        CUdeviceptr p = 0;
        printf("parent rc=%d\n", cuMemAlloc_v2(&p, arg(argv, 2)));
        pid_t child = fork();
        if (child == 0) {
            CUdeviceptr q = 0;
            printf("child rc=%d pid=%d\n", cuMemAlloc_v2(&q, 2 * arg(argv, 2)), (int)getpid());
            _exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        printf("parent pid=%d child_status=%d\n", (int)getpid(), status);
    } else if (!strcmp(cmd, "unseen")) { /* unseen <bytes>: a free the hook does not see */
        CUdeviceptr p = 0, q = 0;
        printf("rc=%d\n", cuMemAlloc_v2(&p, arg(argv, 2)));
        /* Destroying the context frees its memory inside the driver (not wrapped). */
        printf("destroy=%d\n", cuCtxDestroy_v2(context));
        if (cuCtxCreate_v2(&context, 0, 0)) { printf("no context\n"); return 1; }
        CUresult again = cuMemAlloc_v2(&q, arg(argv, 2));
        printf("again rc=%d same=%d\n", again, p == q);
        size_t f = 0, t = 0;
        cuMemGetInfo_v2(&f, &t);
        printf("free=%zu total=%zu\n", f, t);
    } else if (!strcmp(cmd, "leak")) { /* leak <bytes>: allocate and exit without freeing */
        CUdeviceptr p = 0;
        printf("rc=%d\n", cuMemAlloc_v2(&p, arg(argv, 2)));
    } else if (!strcmp(cmd, "devinfo")) { /* the driver's memory figures */
        size_t f = 0, t = 0;
        CUresult info = cuMemGetInfo_v2(&f, &t);
        printf("info=%d free=%zu total=%zu\n", info, f, t);
    } else if (!strcmp(cmd, "nvmlprocs")) { /* nvmlprocs [hold bytes]: compute processes */
        CUdeviceptr p = 0;
        if (argc > 2) printf("rc=%d\n", cuMemAlloc_v2(&p, arg(argv, 2)));
        void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        int (*init)(void) = (int (*)(void))dlsym(nv, "nvmlInit_v2");
        int (*handle)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(nv, "nvmlDeviceGetHandleByIndex_v2");
        int (*procs)(void *, unsigned *, ProcInfoV1 *) =
            (int (*)(void *, unsigned *, ProcInfoV1 *))dlsym(nv, "nvmlDeviceGetComputeRunningProcesses");
        void *dev = 0;
        if (!init || !handle || !procs || init() || handle(0, &dev)) { printf("no nvml\n"); return 1; }
        unsigned count = 0;
        int first = procs(dev, &count, 0);
        ProcInfoV1 infos[64];
        unsigned room = 64;
        int second = procs(dev, &room, infos);
        printf("first=%d count=%u second=%d n=%u\n", first, count, second, room);
        for (unsigned i = 0; i < room; i++) printf("proc pid=%u used=%llu\n", infos[i].pid, infos[i].used);
    } else if (!strcmp(cmd, "syscalls")) { /* syscalls <pairs>: system calls of pairs+launches */
        size_t pairs = arg(argv, 2);
        CUdeviceptr p = 0;
        for (int i = 0; i < 10; i++) { /* warm: state, region, tables */
            cuMemAlloc_v2(&p, 1 << 20); cuMemFree_v2(p);
            cuLaunchKernel((void *)1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
        }
        if (trap_syscalls()) { printf("no seccomp\n"); return 1; }
        int failed = 0;
        for (size_t i = 0; i < pairs; i++) {
            failed |= cuMemAlloc_v2(&p, 1 << 20) || cuMemFree_v2(p);
            failed |= cuLaunchKernel((void *)1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
        }
        printf("syscalls=%ld failed=%d\n", trapped, failed);
    } else if (!strcmp(cmd, "bench")) { /* bench <pairs> <bytes> [alive]: ns per pair */
        size_t pairs = arg(argv, 2), bytes = arg(argv, 3), alive = argc > 4 ? arg(argv, 4) : 0;
        struct timespec a, b;
        CUdeviceptr p = 0;
        for (size_t i = 0; i < alive; i++) {
            if (cuMemAlloc_v2(&p, 4096)) { printf("bench setup failed\n"); return 1; }
        }
        cuMemAlloc_v2(&p, bytes); cuMemFree_v2(p);
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (size_t i = 0; i < pairs; i++) {
            if (cuMemAlloc_v2(&p, bytes) || cuMemFree_v2(p)) { printf("bench failed\n"); return 1; }
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)pairs;
        printf("pair_ns %.1f\n", ns);
    } else if (!strcmp(cmd, "procaddress")) { /* entry points through cuGetProcAddress_v2 */
        CUresult (*alloc)(CUdeviceptr *, size_t) = 0;
        int status = -1;
        CUresult rc = cuGetProcAddress_v2("cuMemAlloc", (void **)&alloc, 12000, 0, &status);
        printf("lookup=%d status=%d\n", rc, status);
        CUdeviceptr p = 0;
        printf("rc=%d\n", alloc(&p, arg(argv, 2)));
        void *old = 0;
        printf("old=%d\n", cuGetProcAddress_v2("cuMemAllocAsync", &old, 11000, 0, &status));
        void *h = dlopen("libcuda.so.1", RTLD_NOW);
        CUresult (*viadl)(CUdeviceptr *, size_t) = (CUresult (*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
        printf("dlsym_rc=%d\n", viadl(&p, arg(argv, 2)));
        printf("missing=%p\n", dlsym(h, "cuMemAllocNotThere"));
    } else if (!strcmp(cmd, "others")) { /* pitch and managed */
        CUdeviceptr p = 0; size_t pitch = 0;
        printf("pitch=%d\n", cuMemAllocPitch_v2(&p, &pitch, arg(argv, 2), 1, 4));
        printf("managed=%d\n", cuMemAllocManaged(&p, arg(argv, 2), 1));
    } else if (!strcmp(cmd, "busy")) { /* busy <seconds> <blocks> [graph] */
        void *g = 0, *exec = 0;
        int graph = argc > 4;
        if (graph) { cuGraphCreate(&g, 0); cuGraphInstantiateWithFlags(&exec, g, 0); }
        printf("started\n");
        long long end = (long long)time(NULL) + (long long)arg(argv, 2);
        long launches = 0;
        while ((long long)time(NULL) < end) {
            CUresult rc = graph ? cuGraphLaunch(exec, 0)
                                : cuLaunchKernel((void *)1, arg(argv, 3), 1, 1, 128, 1, 1, 0, 0, 0, 0);
            if (rc) { printf("launch rc=%d\n", rc); return 1; }
            launches++;
        }
        printf("launches=%ld\n", launches);
    } else {
        printf("unknown command\n");
        return 2;
    }
    return 0;
}
