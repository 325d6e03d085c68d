/* Calls one export of libvgpu.so, named on the command line, the way an application would,
 * and prints "<export> <result>" then "survived": tests/internal_errors.rs runs it with the
 * hook's fault switch set on that export (VGPU_TEST_PANIC_IN) and checks the fallback.
 * The exports are looked up with glibc's own dlsym (found with dlvsym), so that a fault in
 * the hook's dlsym does not stop the probe from reaching the others; RTLD_DEFAULT finds the
 * preloaded hook's definition first. Exit 4: an export it cannot find; 5: one it does not
 * know (a new export needs a line here and in the test's table). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long u64;
typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn glibc_dlsym;

static void *export_of(const char *name) {
    void *f = glibc_dlsym(RTLD_DEFAULT, name);
    if (!f) { printf("missing %s\n", name); exit(4); }
    return f;
}
#define FN(type, name) ((type)export_of(name))

/* Heads of the structs the exports read (cuda.h). */
struct alloc_prop { int type, handle_types, location_type, location_id; char rest[32]; };
struct array_desc { size_t width, height; unsigned format, channels; };
struct array3d_desc { size_t width, height, depth; unsigned format, channels, flags; };
struct launch_config { unsigned grid[3], block[3], shared; void *stream; char rest[32]; };
struct nvml_memory { u64 total, free, used; };
struct nvml_memory_v2 { unsigned version; u64 total, reserved, free, used; };

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    glibc_dlsym = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
    if (!glibc_dlsym) glibc_dlsym = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
    if (!glibc_dlsym || argc < 2) return 3;
    const char *name = argv[1];

    int init = FN(int (*)(unsigned), "cuInit")(0);
    void *context = NULL;
    if (init == 0) FN(int (*)(void **, unsigned, int), "cuCtxCreate_v2")(&context, 0, 0);
    /* Something for the frees to free, allocated before the faulted call. */
    u64 held = 0;
    int held_rc = init == 0 ? FN(int (*)(u64 *, size_t), "cuMemAlloc_v2")(&held, 4096) : -1;

    long rc;
    u64 out = 0;
    size_t pitch = 0, free_bytes = 0, total = 0;
    void *pfn = NULL;
    int status = 0;
    if (!strcmp(name, "dlsym")) {
        rc = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2") != NULL; /* the hook's dlsym */
    } else if (!strcmp(name, "cuInit")) {
        rc = init;
    } else if (!strcmp(name, "cuGetProcAddress")) {
        rc = FN(int (*)(const char *, void **, int, u64), name)("cuMemAlloc", &pfn, 12000, 0);
    } else if (!strcmp(name, "cuGetProcAddress_v2")) {
        rc = FN(int (*)(const char *, void **, int, u64, int *), name)("cuMemAlloc", &pfn, 12000, 0,
                                                                       &status);
    } else if (!strcmp(name, "cuMemAlloc_v2")) {
        rc = FN(int (*)(u64 *, size_t), name)(&out, 1 << 20);
    } else if (!strcmp(name, "cuMemAllocManaged")) {
        rc = FN(int (*)(u64 *, size_t, unsigned), name)(&out, 1 << 20, 1);
    } else if (!strcmp(name, "cuMemAllocPitch_v2")) {
        rc = FN(int (*)(u64 *, size_t *, size_t, size_t, unsigned), name)(&out, &pitch, 1024, 64, 4);
    } else if (!strcmp(name, "cuMemAllocAsync") || !strcmp(name, "cuMemAllocAsync_ptsz")) {
        rc = FN(int (*)(u64 *, size_t, void *), name)(&out, 1 << 20, NULL);
    } else if (!strcmp(name, "cuMemAllocFromPoolAsync") ||
               !strcmp(name, "cuMemAllocFromPoolAsync_ptsz")) {
        rc = FN(int (*)(u64 *, size_t, void *, void *), name)(&out, 1 << 20, NULL, NULL);
    } else if (!strcmp(name, "cuMemCreate")) {
        struct alloc_prop prop;
        memset(&prop, 0, sizeof prop);
        prop.type = 1;
        prop.location_type = 1;
        rc = FN(int (*)(u64 *, size_t, const void *, u64), name)(&out, 1 << 21, &prop, 0);
    } else if (!strcmp(name, "cuArrayCreate_v2")) {
        struct array_desc d = {256, 256, 0x20, 1};
        rc = FN(int (*)(u64 *, const void *), name)(&out, &d);
    } else if (!strcmp(name, "cuArray3DCreate_v2")) {
        struct array3d_desc d = {64, 64, 64, 0x20, 1, 0};
        rc = FN(int (*)(u64 *, const void *), name)(&out, &d);
    } else if (!strcmp(name, "cuMemFree_v2") || !strcmp(name, "cuMemRelease") ||
               !strcmp(name, "cuArrayDestroy")) {
        rc = FN(int (*)(u64), name)(held);
    } else if (!strcmp(name, "cuMemFreeAsync") || !strcmp(name, "cuMemFreeAsync_ptsz")) {
        rc = FN(int (*)(u64, void *), name)(held, NULL);
    } else if (!strcmp(name, "cuMemGetInfo_v2")) {
        rc = FN(int (*)(size_t *, size_t *), name)(&free_bytes, &total);
    } else if (!strcmp(name, "cuDeviceTotalMem_v2")) {
        rc = FN(int (*)(size_t *, int), name)(&total, 0);
    } else if (!strcmp(name, "nvmlDeviceGetMemoryInfo")) {
        struct nvml_memory m;
        rc = FN(int (*)(void *, void *), name)(NULL, &m);
    } else if (!strcmp(name, "nvmlDeviceGetMemoryInfo_v2")) {
        struct nvml_memory_v2 m = {0};
        rc = FN(int (*)(void *, void *), name)(NULL, &m);
    } else if (!strcmp(name, "cuLaunchKernel") || !strcmp(name, "cuLaunchKernel_ptsz")) {
        rc = FN(int (*)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **),
                name)(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    } else if (!strcmp(name, "cuLaunchCooperativeKernel") ||
               !strcmp(name, "cuLaunchCooperativeKernel_ptsz")) {
        rc = FN(int (*)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **),
                name)(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL);
    } else if (!strcmp(name, "cuLaunchKernelEx") || !strcmp(name, "cuLaunchKernelEx_ptsz")) {
        struct launch_config config;
        memset(&config, 0, sizeof config);
        config.grid[0] = config.grid[1] = config.grid[2] = 1;
        rc = FN(int (*)(const void *, void *, void **, void **), name)(&config, NULL, NULL, NULL);
    } else if (!strcmp(name, "cuGraphLaunch") || !strcmp(name, "cuGraphLaunch_ptsz")) {
        rc = FN(int (*)(void *, void *), name)(NULL, NULL);
    } else if (!strcmp(name, "allocations")) {
        /* Not an export: the hook's allocation records, poisoned by a panic while locked
         * ("allocations#1": the 4 KiB above). The calls after it must still work. */
        int alloc = FN(int (*)(u64 *, size_t), "cuMemAlloc_v2")(&out, 1 << 20);
        int freed = FN(int (*)(u64), "cuMemFree_v2")(out);
        int info = FN(int (*)(size_t *, size_t *), "cuMemGetInfo_v2")(&free_bytes, &total);
        printf("held=%d alloc=%d free=%d info=%d free=%zu total=%zu\n", held_rc, alloc, freed,
               info, free_bytes, total);
        rc = 0;
    } else {
        printf("unknown %s\n", name);
        return 5;
    }
    printf("%s %ld\n", name, rc);
    if (!strncmp(name, "cuGetProcAddress", 16)) printf("entry %s\n", pfn ? "set" : "null");
    printf("survived\n");
    return 0;
}
