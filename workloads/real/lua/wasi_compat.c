/* roam real-program suite: the two libc functions Lua 5.4's standard library
 * links against that wasi-libc does not provide. Neither is used by the
 * benchmark script. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

FILE *tmpfile(void) {
    errno = ENOTSUP;
    return NULL;
}

int system(const char *command) {
    /* No command processor: system(NULL) reports 0, anything else fails. */
    if (command == NULL) return 0;
    errno = ENOTSUP;
    return -1;
}
