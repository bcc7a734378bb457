/* roam real-program suite: force-included (-include) into the zstd CLI
 * build. WASI preview 1 has no file ownership or permission bits, and
 * wasi-libc declares neither chmod nor chown; zstd only calls them to copy
 * the source file's attributes onto the output file, which the suite never
 * asks for (it streams stdin to stdout). programs/util.h also needs <stdio.h>
 * before it. */
#include <stdio.h>
#include <errno.h>
#include <sys/types.h>
static inline int chmod(const char *path, mode_t mode) { (void)path; (void)mode; errno = ENOTSUP; return -1; }
static inline int chown(const char *path, uid_t uid, gid_t gid) { (void)path; (void)uid; (void)gid; errno = ENOTSUP; return -1; }
