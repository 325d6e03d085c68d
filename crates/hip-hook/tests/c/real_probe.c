/* A C program built against the REAL ROCm headers (Debian's libamdhip64-dev, ROCm 5.2.3) with
 * -D__HIP_PLATFORM_AMD__ and linked against the real libamdhip64.so.5, for the hook's tests
 * against the real runtime (no GPU: the runtime answers hipErrorNoDevice/InvalidDevice once
 * a call reaches it). Prints "<op> <hip error> [values]" per operation. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hip/hip_runtime_api.h>

static size_t num(const char *s) { return (size_t)strtoull(s, NULL, 0); }

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int i = 1; i < argc; i++) {
    const char *op = argv[i];
    void *p = NULL;
    if (!strcmp(op, "layout")) {
      /* where the real header puts the fields the hook reads */
      printf("layout 0 %zu %zu %zu\n", offsetof(hipMemAllocationProp, location.id),
             offsetof(hipMemAllocationProp, requestedHandleType),
             offsetof(hipMemPoolProps, location.id));
    } else if (!strcmp(op, "version")) {
      int v = 0;
      hipError_t rc = hipRuntimeGetVersion(&v);
      printf("version %d %d\n", rc, v);
    } else if (!strcmp(op, "malloc")) {
      printf("malloc %d\n", hipMalloc(&p, num(argv[++i])));
    } else if (!strcmp(op, "free")) {
      printf("free %d\n", hipFree((void *)0x1000));
    } else if (!strcmp(op, "dlsym")) {
      void *lib = dlopen("libamdhip64.so.5", RTLD_NOW | RTLD_NOLOAD);
      hipError_t (*fn)(void **, size_t) = lib ? (hipError_t (*)(void **, size_t))dlsym(lib, "hipMalloc") : NULL;
      printf("dlsym %d\n", fn ? fn(&p, num(argv[++i])) : -1);
    } else if (!strcmp(op, "dlopen")) {
      /* a runtime opened by the program itself, RTLD_LOCAL */
      void *lib = dlopen("libamdhip64.so.5", RTLD_NOW | RTLD_LOCAL);
      hipError_t (*fn)(void **, size_t) = lib ? (hipError_t (*)(void **, size_t))dlsym(lib, "hipMalloc") : NULL;
      printf("dlopen %d\n", fn ? fn(&p, num(argv[++i])) : -1);
    } else if (!strcmp(op, "memcreate")) {
      hipMemAllocationProp prop;
      hipMemGenericAllocationHandle_t handle;
      memset(&prop, 0, sizeof prop);
      prop.type = hipMemAllocationTypePinned;
      prop.location.type = hipMemLocationTypeDevice;
      prop.location.id = (int)num(argv[++i]);
      prop.requestedHandleType = hipMemHandleTypePosixFileDescriptor;
      printf("memcreate %d\n", hipMemCreate(&handle, num(argv[++i]), &prop, 0));
    } else if (!strcmp(op, "pitch")) {
      size_t pitch = 0, w = num(argv[i + 1]), h = num(argv[i + 2]);
      i += 2;
      printf("pitch %d\n", hipMallocPitch(&p, &pitch, w, h));
    } else if (!strcmp(op, "mipmalloc")) {
      hipChannelFormatDesc desc = hipCreateChannelDesc(32, 0, 0, 0, hipChannelFormatKindFloat);
      hipMipmappedArray_t m;
      printf("mipmalloc %d\n", hipMallocMipmappedArray(&m, &desc, make_hipExtent(num(argv[i + 1]), num(argv[i + 2]), 0), 4, 0));
      i += 2;
    } else if (!strcmp(op, "meminfo")) {
      size_t free = 0, total = 0;
      hipError_t rc = hipMemGetInfo(&free, &total);
      printf("meminfo %d\n", rc);
    } else if (!strcmp(op, "env")) {
      /* After the runtime started (its flag parser walks environ, ROCr calls getenv):
       * "env <getenv value> <environ value>" of one variable, (unset) when absent. */
      extern char **environ;
      int n = -1;
      (void)hipGetDeviceCount(&n);
      const char *name = argv[++i], *walked = NULL;
      size_t len = strlen(name);
      for (char **e = environ; e && *e; e++)
        if (!strncmp(*e, name, len) && (*e)[len] == '=') walked = *e + len + 1;
      const char *got = getenv(name);
      printf("env %s %s\n", got ? got : "(unset)", walked ? walked : "(unset)");
    } else if (!strcmp(op, "count")) {
      int n = -1;
      hipError_t rc = hipGetDeviceCount(&n);
      printf("count %d %d\n", rc, n);
    } else {
      fprintf(stderr, "real_probe: unknown operation %s\n", op);
      return 2;
    }
  }
  return 0;
}
