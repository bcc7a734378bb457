/* roam real-program suite: the operating-system layer for SQLite built with
 * SQLITE_OS_OTHER=1 on WASI preview 1. speedtest1 runs with --memdb
 * (":memory:" database, temp_store=memory), so the VFS never opens a file;
 * it only supplies randomness (fixed, so runs are deterministic), sleep and
 * the clock (speedtest1 times its tests with xCurrentTimeInt64; the timings
 * are not part of the compared output). */
#include <string.h>
#include <time.h>
#include "sqlite3.h"

static int vOpen(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out) {
    (void)v; (void)name; (void)flags; (void)out;
    f->pMethods = 0;
    return SQLITE_CANTOPEN;
}
static int vDelete(sqlite3_vfs *v, const char *name, int sync) {
    (void)v; (void)name; (void)sync;
    return SQLITE_IOERR_DELETE;
}
static int vAccess(sqlite3_vfs *v, const char *name, int flags, int *res) {
    (void)v; (void)name; (void)flags;
    *res = 0;
    return SQLITE_OK;
}
static int vFullPathname(sqlite3_vfs *v, const char *name, int n, char *out) {
    (void)v;
    sqlite3_snprintf(n, out, "%s", name);
    return SQLITE_OK;
}
static int vRandomness(sqlite3_vfs *v, int n, char *out) {
    (void)v;
    unsigned x = 0x2545F491u;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        out[i] = (char)(x >> 16);
    }
    return n;
}
static int vSleep(sqlite3_vfs *v, int us) {
    (void)v;
    return us;
}
static int vCurrentTimeInt64(sqlite3_vfs *v, sqlite3_int64 *t) {
    (void)v;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* Julian day number in milliseconds. */
    *t = (sqlite3_int64)210866760000000LL + (sqlite3_int64)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    return SQLITE_OK;
}
static int vCurrentTime(sqlite3_vfs *v, double *t) {
    sqlite3_int64 ms;
    vCurrentTimeInt64(v, &ms);
    *t = ms / 86400000.0;
    return SQLITE_OK;
}
static int vGetLastError(sqlite3_vfs *v, int n, char *buf) {
    (void)v;
    if (n > 0) buf[0] = 0;
    return 0;
}

static sqlite3_vfs wasi_vfs = {
    2, sizeof(sqlite3_file), 512, 0, "wasi-memonly", 0,
    vOpen, vDelete, vAccess, vFullPathname,
    0, 0, 0, 0, /* no dynamic loading */
    vRandomness, vSleep, vCurrentTime, vGetLastError, vCurrentTimeInt64,
    0, 0, 0,
};

int sqlite3_os_init(void) { return sqlite3_vfs_register(&wasi_vfs, 1); }
int sqlite3_os_end(void) { return SQLITE_OK; }
