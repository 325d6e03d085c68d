/* A HIP application for the hook's tests: runs the operations named on its command line
 * against libamdhip64 (linked dynamically, as ROCm applications are) and prints one line
 * per operation, "<op> <hip error> [values]". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <hip/hip_stand_in.h>

extern char **environ;
/* The legacy (R0000) entry point, under its own symbol name: the header maps the name to R0600. */
extern hipError_t legacy_get_device_properties(void *props, int device) __asm__("hipGetDeviceProperties");
/* A part of the runtime (tests/c/rocr_part.c, opened with "part <path>"): its getenv calls are
 * the runtime's own, which the hook answers with the pinned values. */
static void *part;
static void *stack[4096];
static int depth;
static void push(void *p) { if (depth < 4096) stack[depth++] = p; }
static void *pop(void) { return depth ? stack[--depth] : NULL; }
static size_t num(const char *s) { return (size_t)strtoull(s, NULL, 0); }

struct stress { size_t size; int iterations; long ok, oom, other; };
static int stress_started; /* threads past their first allocation: "storm" says "storming" then */
static void *stress_thread(void *arg) {
  struct stress *s = arg;
  if (s->iterations == 0) __atomic_add_fetch(&stress_started, 1, __ATOMIC_RELAXED);
  for (int i = 0; i < s->iterations; i++) {
    if (i == 1) __atomic_add_fetch(&stress_started, 1, __ATOMIC_RELAXED);
    if (i == 0 && s->iterations == 1) __atomic_add_fetch(&stress_started, 1, __ATOMIC_RELAXED);
    void *p = NULL;
    hipError_t rc = hipMalloc(&p, s->size);
    if (rc == hipSuccess) {
      s->ok++;
      /* hold it briefly so that allocations overlap */
      for (volatile int spin = 0; spin < 200; spin++) {}
      if (hipFree(p) != hipSuccess) s->other++;
    } else if (rc == hipErrorOutOfMemory) {
      s->oom++;
    } else {
      s->other++;
    }
  }
  return NULL;
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int i = 1; i < argc; i++) {
    const char *op = argv[i];
    void *p = NULL;
    hipError_t rc;
    if (!strcmp(op, "malloc")) {
      rc = hipMalloc(&p, num(argv[++i]));
      if (rc == hipSuccess) push(p);
      printf("malloc %d\n", rc);
    } else if (!strcmp(op, "free")) {
      printf("free %d\n", hipFree(pop()));
    } else if (!strcmp(op, "ext")) {
      rc = hipExtMallocWithFlags(&p, num(argv[++i]), 0);
      if (rc == hipSuccess) push(p);
      printf("ext %d\n", rc);
    } else if (!strcmp(op, "managed")) {
      rc = hipMallocManaged(&p, num(argv[++i]), 1);
      if (rc == hipSuccess) push(p);
      printf("managed %d\n", rc);
    } else if (!strcmp(op, "async")) {
      rc = hipMallocAsync(&p, num(argv[++i]), NULL);
      if (rc == hipSuccess) push(p);
      printf("async %d\n", rc);
    } else if (!strcmp(op, "freeasync")) {
      printf("freeasync %d\n", hipFreeAsync(pop(), NULL));
    } else if (!strcmp(op, "pool")) {
      hipMemPool_t pool = NULL;
      int device = (int)num(argv[++i]);
      hipDeviceGetDefaultMemPool(&pool, device);
      rc = hipMallocFromPoolAsync(&p, num(argv[++i]), pool, NULL);
      if (rc == hipSuccess) push(p);
      printf("pool %d\n", rc);
    } else if (!strcmp(op, "pitch")) {
      size_t pitch = 0, w = num(argv[i + 1]), h = num(argv[i + 2]);
      i += 2;
      rc = hipMallocPitch(&p, &pitch, w, h);
      if (rc == hipSuccess) push(p);
      printf("pitch %d %zu\n", rc, pitch);
    } else if (!strcmp(op, "3d")) {
      hipPitchedPtr pp;
      hipExtent e = {num(argv[i + 1]), num(argv[i + 2]), num(argv[i + 3])};
      i += 3;
      rc = hipMalloc3D(&pp, e);
      if (rc == hipSuccess) push(pp.ptr);
      printf("3d %d %zu\n", rc, rc == hipSuccess ? pp.pitch : 0);
    } else if (!strcmp(op, "array")) {
      hipChannelFormatDesc desc = {32, 0, 0, 0, 2};
      size_t w = num(argv[i + 1]), h = num(argv[i + 2]);
      i += 2;
      rc = hipMallocArray(&p, &desc, w, h, 0);
      if (rc == hipSuccess) push(p);
      printf("array %d\n", rc);
    } else if (!strcmp(op, "freearray")) {
      printf("freearray %d\n", hipFreeArray(pop()));
    } else if (!strcmp(op, "memcreate")) {
      hipMemAllocationProp prop;
      memset(&prop, 0, sizeof prop);
      prop.type = 1;
      prop.location.type = 1;
      prop.location.id = (int)num(argv[++i]);
      rc = hipMemCreate(&p, num(argv[++i]), &prop, 0);
      if (rc == hipSuccess) push(p);
      printf("memcreate %d\n", rc);
    } else if (!strcmp(op, "memcreate5")) {
      /* ROCm 5.x's hipMemAllocationProp (hip_runtime_api.h of 5.2.3), by hand */
      struct {
        unsigned char compressionType;
        struct { int type; int id; } location;
        int requestedHandleType; int type; unsigned short usage; void *win32HandleMetaData;
      } prop5;
      memset(&prop5, 0, sizeof prop5);
      prop5.type = 1;
      prop5.location.type = 1;
      prop5.location.id = (int)num(argv[++i]);
      prop5.requestedHandleType = 1; /* hipMemHandleTypePosixFileDescriptor */
      rc = hipMemCreate(&p, num(argv[++i]), (const hipMemAllocationProp *)(void *)&prop5, 0);
      if (rc == hipSuccess) push(p);
      printf("memcreate5 %d\n", rc);
    } else if (!strcmp(op, "release")) {
      printf("release %d\n", hipMemRelease(pop()));
    } else if (!strcmp(op, "setdevice")) {
      printf("setdevice %d\n", hipSetDevice((int)num(argv[++i])));
    } else if (!strcmp(op, "meminfo")) {
      size_t free = 0, total = 0;
      rc = hipMemGetInfo(&free, &total);
      printf("meminfo %d %zu %zu\n", rc, free, total);
    } else if (!strcmp(op, "props")) {
      hipDeviceProp_t props;
      int device = (int)num(argv[++i]);
      rc = hipGetDeviceProperties(&props, device);
      printf("props %d %zu %d\n", rc, props.totalGlobalMem, props.multiProcessorCount);
    } else if (!strcmp(op, "attr")) {
      int total = 0, cus = 0;
      int device = (int)num(argv[++i]);
      rc = hipDeviceGetAttribute(&total, hipDeviceAttributeTotalGlobalMem, device);
      hipDeviceGetAttribute(&cus, hipDeviceAttributeMultiprocessorCount, device);
      printf("attr %d %d %d\n", rc, total, cus);
    } else if (!strcmp(op, "totalmem")) {
      size_t total = 0;
      rc = hipDeviceTotalMem(&total, (int)num(argv[++i]));
      printf("totalmem %d %zu\n", rc, total);
    } else if (!strcmp(op, "procaddr")) {
      /* hipMalloc obtained through hipGetProcAddress, as HIP-aware libraries do */
      hipError_t (*fn)(void **, size_t) = NULL;
      int status = -1;
      size_t size = num(argv[++i]);
      rc = hipGetProcAddress("hipMalloc", (void **)&fn, 600, 0, &status);
      hipError_t rc2 = fn ? fn(&p, size) : -1;
      if (rc2 == hipSuccess) push(p);
      printf("procaddr %d %d\n", rc, rc2);
    } else if (!strcmp(op, "dlsym")) {
      void *lib = dlopen("libamdhip64.so.6", RTLD_NOW | RTLD_NOLOAD);
      hipError_t (*fn)(void **, size_t) = lib ? (hipError_t (*)(void **, size_t))dlsym(lib, "hipMalloc") : NULL;
      rc = fn ? fn(&p, num(argv[++i])) : -1;
      if (rc == hipSuccess) push(p);
      printf("dlsym %d\n", rc);
    } else if (!strcmp(op, "setenv")) {
      rc = setenv(argv[i + 1], argv[i + 2], 1);
      i += 2;
      printf("setenv %d\n", rc);
    } else if (!strcmp(op, "allocpitch")) {
      size_t pitch = 0, w = num(argv[i + 1]), h = num(argv[i + 2]);
      i += 2;
      rc = hipMemAllocPitch(&p, &pitch, w, h, 4);
      if (rc == hipSuccess) push(p);
      printf("allocpitch %d %zu\n", rc, pitch);
    } else if (!strcmp(op, "arraycreate")) {
      HIP_ARRAY_DESCRIPTOR d = {num(argv[i + 1]), num(argv[i + 2]), HIP_AD_FORMAT_FLOAT, 1};
      i += 2;
      rc = hipArrayCreate(&p, &d);
      if (rc == hipSuccess) push(p);
      printf("arraycreate %d\n", rc);
    } else if (!strcmp(op, "array3dcreate")) {
      HIP_ARRAY3D_DESCRIPTOR d = {num(argv[i + 1]), num(argv[i + 2]), num(argv[i + 3]), HIP_AD_FORMAT_FLOAT, 1, 0};
      i += 3;
      rc = hipArray3DCreate(&p, &d);
      if (rc == hipSuccess) push(p);
      printf("array3dcreate %d\n", rc);
    } else if (!strcmp(op, "arraydestroy")) {
      printf("arraydestroy %d\n", hipArrayDestroy(pop()));
    } else if (!strcmp(op, "mipmalloc")) {
      hipChannelFormatDesc desc = {32, 0, 0, 0, 2};
      hipExtent e = {num(argv[i + 1]), num(argv[i + 2]), 0};
      unsigned levels = (unsigned)num(argv[i + 3]);
      i += 3;
      rc = hipMallocMipmappedArray(&p, &desc, e, levels, 0);
      if (rc == hipSuccess) push(p);
      printf("mipmalloc %d\n", rc);
    } else if (!strcmp(op, "mipfree")) {
      printf("mipfree %d\n", hipFreeMipmappedArray(pop()));
    } else if (!strcmp(op, "mipcreate")) {
      HIP_ARRAY3D_DESCRIPTOR d = {num(argv[i + 1]), num(argv[i + 2]), 0, HIP_AD_FORMAT_FLOAT, 1, 0};
      unsigned levels = (unsigned)num(argv[i + 3]);
      i += 3;
      rc = hipMipmappedArrayCreate(&p, &d, levels);
      if (rc == hipSuccess) push(p);
      printf("mipcreate %d\n", rc);
    } else if (!strcmp(op, "mipdestroy")) {
      printf("mipdestroy %d\n", hipMipmappedArrayDestroy(pop()));
    } else if (!strcmp(op, "graphmem")) {
      hipMemAllocNodeParams params;
      hipGraphNode_t node = NULL;
      memset(&params, 0, sizeof params);
      params.poolProps.allocType = 1;
      params.poolProps.location.type = 1;
      params.poolProps.location.id = (int)num(argv[++i]);
      params.bytesize = num(argv[++i]);
      printf("graphmem %d\n", hipGraphAddMemAllocNode(&node, NULL, NULL, 0, &params));
    } else if (!strcmp(op, "defaultpool")) {
      hipMemPool_t pool = NULL;
      printf("defaultpool %d\n", hipDeviceGetDefaultMemPool(&pool, (int)num(argv[++i])));
    } else if (!strcmp(op, "poolcreate")) {
      hipMemPoolProps props;
      hipMemPool_t pool = NULL;
      memset(&props, 0, sizeof props);
      props.allocType = 1;
      props.location.type = 1;
      props.location.id = (int)num(argv[++i]);
      printf("poolcreate %d\n", hipMemPoolCreate(&pool, &props));
    } else if (!strcmp(op, "3darray")) {
      hipChannelFormatDesc desc = {32, 0, 0, 0, 2};
      hipExtent e = {num(argv[i + 1]), num(argv[i + 2]), num(argv[i + 3])};
      i += 3;
      rc = hipMalloc3DArray(&p, &desc, e, 0);
      if (rc == hipSuccess) push(p);
      printf("3darray %d\n", rc);
    } else if (!strcmp(op, "propslegacy")) {
      static char props[4096];
      printf("propslegacy %d\n", legacy_get_device_properties(props, (int)num(argv[++i])));
    } else if (!strcmp(op, "part")) {
      part = dlopen(argv[++i], RTLD_NOW);
      printf("part %d\n", part ? 0 : -1);
    } else if (!strcmp(op, "partgetenv") || !strcmp(op, "partsecure")) {
      const char *(*read)(const char *) = part ? (const char *(*)(const char *))dlsym(part,
          !strcmp(op, "partgetenv") ? "part_getenv" : "part_secure_getenv") : NULL;
      const char *v = read ? read(argv[++i]) : NULL;
      printf("%s %d %s\n", op, read ? 0 : -1, v ? v : "(unset)");
    } else if (!strcmp(op, "unsetenv")) {
      printf("unsetenv %d\n", unsetenv(argv[++i]));
    } else if (!strcmp(op, "putenv")) {
      printf("putenv %d\n", putenv(argv[++i]));
    } else if (!strcmp(op, "clearenv")) {
      printf("clearenv %d\n", clearenv());
    } else if (!strcmp(op, "getenv")) {
      const char *v = getenv(argv[++i]);
      printf("getenv 0 %s\n", v ? v : "(unset)");
    } else if (!strcmp(op, "wait")) {
      /* say so, then wait for a line on stdin */
      char line[16];
      printf("waiting\n");
      if (!fgets(line, sizeof line, stdin)) return 3;
    } else if (!strcmp(op, "hold")) {
      /* say so, then wait to be killed */
      printf("ready\n");
      for (;;) pause();
    } else if (!strcmp(op, "stress") || !strcmp(op, "storm")) {
      /* storm: stress that first says "storming" once every thread is past its first
       * allocation, so that a test can kill it mid-allocation without guessing when */
      int threads = (int)num(argv[i + 1]), iterations = (int)num(argv[i + 2]);
      size_t size = num(argv[i + 3]);
      i += 3;
      pthread_t t[64];
      struct stress s[64];
      if (threads > 64) threads = 64;
      for (int k = 0; k < threads; k++) {
        s[k] = (struct stress){size, iterations, 0, 0, 0};
        pthread_create(&t[k], NULL, stress_thread, &s[k]);
      }
      if (!strcmp(op, "storm")) {
        while (__atomic_load_n(&stress_started, __ATOMIC_RELAXED) < threads) sched_yield();
        printf("storming\n");
      }
      long ok = 0, oom = 0, other = 0;
      for (int k = 0; k < threads; k++) {
        pthread_join(t[k], NULL);
        ok += s[k].ok; oom += s[k].oom; other += s[k].other;
      }
      printf("stress %ld %ld %ld\n", ok, oom, other);
    } else if (!strcmp(op, "bench")) {
      /* ns per hipMalloc+hipFree pair, single thread */
      long iterations = (long)num(argv[++i]);
      double start = now_ns();
      for (long k = 0; k < iterations; k++) {
        if (hipMalloc(&p, 4096) != hipSuccess || hipFree(p) != hipSuccess) { printf("bench failed\n"); return 1; }
      }
      printf("bench %.0f\n", (now_ns() - start) / iterations);
    } else if (!strcmp(op, "fork_malloc")) {
      /* a forked child allocates and exits without freeing */
      size_t size = num(argv[++i]);
      pid_t pid = fork();
      if (pid == 0) {
        printf("child %d\n", hipMalloc(&p, size));
        fflush(stdout);
        _exit(0);
      }
      int status = 0;
      waitpid(pid, &status, 0);
      printf("fork %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    } else if (!strcmp(op, "spawn_clean")) {
      /* a child with a cleaned environment that keeps only LD_AUDIT (what vLLM engines do) */
      char audit[4096], path[4096];
      snprintf(audit, sizeof audit, "LD_AUDIT=%s", getenv("LD_AUDIT") ? getenv("LD_AUDIT") : "");
      snprintf(path, sizeof path, "LD_LIBRARY_PATH=%s", getenv("LD_LIBRARY_PATH") ? getenv("LD_LIBRARY_PATH") : "");
      char *envp[] = {audit, path, NULL};
      char *args[] = {argv[0], "malloc", argv[++i], NULL};
      pid_t pid = fork();
      if (pid == 0) { execve("/proc/self/exe", args, envp); _exit(127); }
      int status = 0;
      waitpid(pid, &status, 0);
      printf("spawn_clean %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    } else {
      fprintf(stderr, "hip_probe: unknown operation %s\n", op);
      return 2;
    }
  }
  return 0;
}
