/* gpu-check probe: drives the CUDA driver API like an application, on a real GPU or on the
 * workspace's stand-in libcuda. No CUDA headers or nvcc needed: the few prototypes are
 * declared here and the kernel is PTX JIT-compiled by the driver.
 * Usage: probe meminfo | alloc <bytes> | pairs <count> <bytes> | busy <seconds>
 * Prints key=value lines that run.sh reads. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
CUresult cuInit(unsigned);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, int);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);

/* A kernel that spins for about `cycles` clock ticks. */
static const char *PTX =
    ".version 6.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry spin(.param .u64 cycles) {\n"
    "  .reg .pred %p; .reg .u64 %start, %now, %limit, %diff;\n"
    "  ld.param.u64 %limit, [cycles];\n"
    "  mov.u64 %start, %clock64;\n"
    "LOOP:\n"
    "  mov.u64 %now, %clock64;\n"
    "  sub.u64 %diff, %now, %start;\n"
    "  setp.lt.u64 %p, %diff, %limit;\n"
    "  @%p bra LOOP;\n"
    "  ret;\n}\n";

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *kernel(void) {
    /* Looked up at run time: the stand-in runtime has no modules and takes any handle. */
    CUresult (*load)(void **, const void *) = (CUresult(*)(void **, const void *))dlsym(RTLD_DEFAULT, "cuModuleLoadData");
    CUresult (*get)(void **, void *, const char *) = (CUresult(*)(void **, void *, const char *))dlsym(RTLD_DEFAULT, "cuModuleGetFunction");
    void *module = 0, *function = 0;
    if (load && get && load(&module, PTX) == 0 && get(&function, module, "spin") == 0) return function;
    return (void *)1;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *cmd = argc > 1 ? argv[1] : "";
    CUcontext ctx;
    if (cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0)) { printf("error=no CUDA context\n"); return 3; }
    if (!strcmp(cmd, "meminfo")) {
        size_t f = 0, t = 0;
        CUresult rc = cuMemGetInfo_v2(&f, &t);
        printf("rc=%d free=%zu total=%zu\n", rc, f, t);
    } else if (!strcmp(cmd, "alloc") && argc > 2) {
        CUdeviceptr p = 0;
        CUresult rc = cuMemAlloc_v2(&p, strtoull(argv[2], 0, 0));
        printf("rc=%d\n", rc);
        if (!rc) cuMemFree_v2(p);
    } else if (!strcmp(cmd, "pairs") && argc > 3) {
        size_t n = strtoull(argv[2], 0, 0), bytes = strtoull(argv[3], 0, 0), failed = 0;
        double start = now_s();
        for (size_t i = 0; i < n; i++) {
            CUdeviceptr p = 0;
            if (cuMemAlloc_v2(&p, bytes)) failed++; else cuMemFree_v2(p);
        }
        printf("ns_per_pair=%.0f failed=%zu\n", (now_s() - start) * 1e9 / (double)n, failed);
    } else if (!strcmp(cmd, "busy") && argc > 2) {
        double until = now_s() + strtod(argv[2], 0);
        void *f = kernel();
        unsigned long long cycles = 20000000ULL;
        void *params[] = {&cycles};
        size_t launches = 0;
        while (now_s() < until) {
            if (cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, params, 0) == 0) launches++;
            cuCtxSynchronize();
        }
        printf("launches=%zu\n", launches);
    } else {
        printf("error=usage: probe meminfo | alloc <bytes> | pairs <count> <bytes> | busy <seconds>\n");
        return 2;
    }
    return 0;
}
