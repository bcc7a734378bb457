/*
 * bigfiles - a program whose state is mostly files: migrating it moves
 * tens of MiB of sandbox files and little memory.
 *
 * Works only under <root>/bigfiles, where <root> is the preopened directory
 * /data (argv[4] may name another root for native runs; it is never
 * printed). It writes MIB MiB of files (4 MiB each, the last one smaller),
 * then for SECONDS seconds, paced by the clock, rewrites one 4 KiB block of
 * a hot file per tick (the last file, and the one created half-way) and
 * appends a line to a journal; half-way it deletes the first file and
 * creates another. The other files stay as first written. LOGKIB KiB of progress lines go to stdout
 * over the run. At the end every file is read back and checked block by
 * block against what it must hold, and a checksum of all file bytes (in
 * name order) is printed. The work is fixed by the arguments; the clock
 * only paces it, so a migrated run prints what an uninterrupted one prints
 * and leaves the same files.
 */
#include "common.h"
#include "pace.h"
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define BLOCK 4096
#define FILE_BLOCKS 1024 /* 4 MiB */
#define MAXFILES 1024

static char base[400];
static uint32_t nfiles, blocks[MAXFILES + 1];
static uint32_t *version[MAXFILES + 1];
static int alive[MAXFILES + 1];

static void die(const char *what, const char *name) {
    fprintf(stderr, "bigfiles: %s %s: %s\n", what, name, strerror(errno));
    exit(1);
}

static void path_of(char *out, uint32_t f) {
    snprintf(out, 512, "%s/f%04u.dat", base, f);
}

/* The bytes of block b of file f at version v. */
static void fill_block(unsigned char *p, uint32_t f, uint32_t b, uint32_t v) {
    wl_rng r = wl_rng_new(((uint64_t)f << 40) ^ ((uint64_t)b << 20) ^ v ^ 0xb16f11e5ULL);
    for (int i = 0; i < BLOCK; i += 8) {
        uint64_t w = wl_next(&r);
        for (int k = 0; k < 8; k++) p[i + k] = (unsigned char)(w >> (8 * k));
    }
}

static void write_file(uint32_t f) {
    char path[512];
    static unsigned char buf[BLOCK * 16];
    path_of(path, f);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("cannot create", "a file");
    for (uint32_t b = 0; b < blocks[f]; b += 16) {
        uint32_t n = blocks[f] - b < 16 ? blocks[f] - b : 16;
        for (uint32_t k = 0; k < n; k++) fill_block(buf + k * BLOCK, f, b + k, 0);
        if (write(fd, buf, (size_t)n * BLOCK) != (ssize_t)(n * BLOCK)) die("cannot write", "a file");
    }
    close(fd);
    alive[f] = 1;
}

static _Noreturn void usage(void) {
    fprintf(stderr,
            "usage: bigfiles S|M|L [ROOT]\n"
            "       bigfiles MIB SECONDS [LOGKIB [ROOT]]\n"
            "  MIB      MiB of files (1..4000)\n"
            "  SECONDS  run time (1..86400); the work is fixed, the clock only paces it\n"
            "  LOGKIB   KiB of progress lines printed over the run (default 1)\n"
            "  S = 8 1, M = 64 5, L = 256 20\n");
    exit(2);
}

static long arg(const char *s, long lo, long hi) {
    long v = parse_arg(s, lo, hi);
    if (v < 0) usage();
    return v;
}

int main(int argc, char **argv) {
    static const long presets[3][2] = { { 8, 1 }, { 64, 5 }, { 256, 20 } };
    long mib, secs, logkib = 1;
    const char *root = "/data";
    if (argc >= 2 && argc <= 3 && (!strcmp(argv[1], "S") || !strcmp(argv[1], "M") || !strcmp(argv[1], "L"))) {
        enum wl_size size = wl_parse_size(2, argv, "bigfiles");
        mib = presets[size][0], secs = presets[size][1];
        if (argc == 3) root = argv[2];
    } else if (argc >= 3 && argc <= 5) {
        mib = arg(argv[1], 1, 4000), secs = arg(argv[2], 1, 86400);
        if (argc > 3) logkib = arg(argv[3], 0, 4 << 20);
        if (argc > 4) root = argv[4];
    } else {
        usage();
    }
    snprintf(base, sizeof base, "%s/bigfiles", root);
    if (mkdir(base, 0755) != 0 && errno != EEXIST) die("cannot create", "bigfiles");

    uint32_t total_blocks = (uint32_t)(mib * ((1 << 20) / BLOCK));
    nfiles = (total_blocks + FILE_BLOCKS - 1) / FILE_BLOCKS;
    for (uint32_t f = 0; f < nfiles; f++) {
        uint32_t left = total_blocks - f * FILE_BLOCKS;
        blocks[f] = left < FILE_BLOCKS ? left : FILE_BLOCKS;
        version[f] = calloc(blocks[f], sizeof(uint32_t));
        if (!version[f]) die("out of memory", "");
        write_file(f);
    }
    /* The file created half-way: as large as the first. */
    blocks[nfiles] = blocks[0];
    version[nfiles] = calloc(blocks[nfiles], sizeof(uint32_t));
    printf("bigfiles: %ld MiB in %u files, %ld s\n", mib, nfiles, secs);

    char jpath[512];
    snprintf(jpath, sizeof jpath, "%s/journal.txt", base);
    int journal = open(jpath, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (journal < 0) die("cannot create", "journal.txt");

    const int64_t ticks = secs * TICKS_PER_SEC;
    const int64_t log_lines = logkib * 1024 / 64;
    int64_t printed = 0, base_ns = now_ns();
    wl_rng rng = wl_rng_new(20261122);
    uint32_t writes = 0;
    unsigned char blk[BLOCK];
    for (int64_t t = 0; t < ticks; t++) {
        if (t == ticks / 2) {
            char p[512];
            path_of(p, 0);
            if (unlink(p) != 0) die("cannot remove", "f0000.dat");
            alive[0] = 0;
            write_file(nfiles);
        }
        /* The hot files: the last one written at the start, and the one
         * created half-way once it exists; the others stay as written. */
        uint32_t f = nfiles - 1;
        if (alive[nfiles] && (!alive[f] || (wl_next(&rng) & 1))) f = nfiles;
        uint32_t b = wl_below(&rng, blocks[f]);
        version[f][b] = ++writes;
        fill_block(blk, f, b, version[f][b]);
        char p[512];
        path_of(p, f);
        int fd = open(p, O_WRONLY);
        if (fd < 0 || pwrite(fd, blk, BLOCK, (off_t)b * BLOCK) != BLOCK) die("cannot rewrite", "a block");
        close(fd);
        char line[64];
        int n = snprintf(line, sizeof line, "tick %08lld file %04u block %04u v%u\n", (long long)t, f, b,
                         writes);
        if (write(journal, line, (size_t)n) != n) die("cannot append to", "journal.txt");
        /* Progress lines due by the end of this tick, 64 bytes each. */
        for (int64_t due = log_lines * (t + 1) / ticks; printed < due; printed++)
            printf("progress %010lld of %010lld, %08u writes .................\n", (long long)printed,
                   (long long)log_lines, writes);
        pace(&base_ns, t);
    }
    close(journal);

    /* Every live file must hold exactly its last writes; hash them in name order. */
    uint64_t h = WL_FNV_OFFSET;
    uint32_t bad = 0;
    unsigned char got[BLOCK];
    for (uint32_t f = 0; f <= nfiles; f++) {
        char p[512];
        path_of(p, f);
        int fd = open(p, O_RDONLY);
        if (!alive[f]) {
            if (fd >= 0) wl_fail("file %u should have been removed", f);
            continue;
        }
        if (fd < 0) die("cannot open", "a file");
        for (uint32_t b = 0; b < blocks[f]; b++) {
            if (read(fd, got, BLOCK) != BLOCK) die("cannot read", "a file");
            fill_block(blk, f, b, version[f][b]);
            if (memcmp(blk, got, BLOCK) != 0 && bad++ < 5) wl_fail("file %u block %u is not write %u", f, b, version[f][b]);
            h = wl_hash_bytes(h, got, BLOCK);
        }
        if (read(fd, got, 1) != 0) wl_fail("file %u is longer than written", f);
        close(fd);
    }
    struct stat st;
    if (stat(jpath, &st) != 0) die("cannot stat", "journal.txt");
    h = wl_hash_u64(h, (uint64_t)st.st_size);
    if (bad) wl_fail("%u blocks differ from their last write", bad);
    printf("bigfiles: %u block writes, %lld progress lines, journal %lld bytes, all verified\n", writes,
           (long long)printed, (long long)st.st_size);
    return wl_finish(h);
}
