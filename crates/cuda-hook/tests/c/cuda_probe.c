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

static void ctx(void) {
    CUcontext c;
    if (cuInit(0) || cuCtxCreate_v2(&c, 0, 0)) { printf("no context\n"); exit(3); }
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
