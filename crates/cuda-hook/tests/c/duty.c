/* duty <percent>: a CUDA workload busy <percent> of the time, until killed. Kernels of
 * 1000 blocks (1 ms on the stand-in at 1 us/block) are launched whenever the process's busy
 * time since start is below <percent> of the wall time, else it sleeps the difference: the
 * long-run share is exact whatever the scheduler does, a 100 ms window is within a burst. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUcontext;
CUresult cuInit(unsigned);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, int);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    double share = argc > 1 ? atof(argv[1]) / 100.0 : 0.5;
    CUcontext ctx;
    if (cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0)) { printf("no context\n"); return 3; }
    printf("started\n");
    double start = now(), busy = 0;
    for (;;) {
        double wall = now() - start;
        if (busy < share * wall) {
            double t = now();
            if (cuLaunchKernel((void *)1, 1000, 1, 1, 128, 1, 1, 0, 0, 0, 0)) { printf("launch failed\n"); return 1; }
            busy += now() - t;
        } else {
            double wait = busy / share - wall;
            if (wait > 0) usleep((useconds_t)(wait * 1e6));
        }
    }
}
