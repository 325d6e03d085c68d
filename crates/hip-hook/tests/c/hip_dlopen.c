/* A program that links no HIP runtime and opens runtimes by path with dlopen (RTLD_LOCAL),
 * as Python wheels with vendored, renamed copies do; it may open several. Each operation
 * uses the runtime opened last and prints "<op> <hip error> [values]". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
typedef int (*meminfo_fn)(size_t *, size_t *);
static malloc_fn hip_malloc;
static free_fn hip_free;
static meminfo_fn hip_meminfo;
/* Referencing environ gives this program its own copy of it (a copy relocation), which
 * every object then uses instead of libc's: the hook must rewrite that one. */
extern char **environ;
static void *stack[256];
static int depth;

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int i = 1; i < argc; i++) {
    const char *op = argv[i];
    if (!strcmp(op, "open")) {
      void *lib = dlopen(argv[++i], RTLD_NOW | RTLD_LOCAL);
      if (!lib) { fprintf(stderr, "hip_dlopen: %s\n", dlerror()); printf("open 1\n"); continue; }
      hip_malloc = (malloc_fn)dlsym(lib, "hipMalloc");
      hip_free = (free_fn)dlsym(lib, "hipFree");
      hip_meminfo = (meminfo_fn)dlsym(lib, "hipMemGetInfo");
      printf("open %d\n", hip_malloc && hip_free && hip_meminfo ? 0 : 1);
    } else if (!strcmp(op, "malloc")) {
      void *p = NULL;
      int rc = hip_malloc(&p, (size_t)strtoull(argv[++i], NULL, 0));
      if (rc == 0 && depth < 256) stack[depth++] = p;
      printf("malloc %d\n", rc);
    } else if (!strcmp(op, "free")) {
      void *p = depth ? stack[--depth] : NULL;
      int rc = hip_free(p);
      if (rc != 0 && p) stack[depth++] = p; /* still allocated */
      printf("free %d\n", rc);
    } else if (!strcmp(op, "meminfo")) {
      size_t free = 0, total = 0;
      int rc = hip_meminfo(&free, &total);
      printf("meminfo %d %zu %zu\n", rc, free, total);
    } else if (!strcmp(op, "setenv")) {
      printf("setenv %d\n", setenv(argv[i + 1], argv[i + 2], 1));
      i += 2;
    } else if (!strcmp(op, "walkenv")) {
      /* what a reader walking environ (HIP's flag parser) finds */
      const char *name = argv[++i];
      size_t len = strlen(name);
      const char *found = "(unset)";
      for (char **e = environ; e && *e; e++)
        if (!strncmp(*e, name, len) && (*e)[len] == '=') found = *e + len + 1;
      printf("walkenv 0 %s\n", found);
    } else {
      fprintf(stderr, "hip_dlopen: unknown operation %s\n", op);
      return 2;
    }
  }
  return 0;
}
