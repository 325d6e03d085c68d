/* Stands for a part of the runtime that reads the slice's variables (ROCr): the hook knows
 * such an object by its defining hsa_init, and answers its getenv/secure_getenv calls itself
 * (pinned values). The hip probe opens it with "part <path>". */
#define _GNU_SOURCE
#include <stdlib.h>

int hsa_init(void) { return 0; }
const char *part_getenv(const char *name) { return getenv(name); }
const char *part_secure_getenv(const char *name) { return secure_getenv(name); }
