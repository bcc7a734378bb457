/*
 * filework - file-system workload for checkpointing with open files.
 *
 * Works only under <root>/filework, where <root> is the preopened directory
 * /data (a different root may be given as argv[2] for native baselines; it
 * is never printed). It first removes and recreates that subdirectory, then
 * for many iterations creates, writes, appends, seeks, preads, pwrites,
 * truncates, renames, unlinks and lists files and subdirectories, while a
 * journal and a record file stay open for the whole run and a third file is
 * open mid-write across the blocking call. An in-memory model of what every
 * file must contain is kept, and at the end every file, the journal, the
 * record file and the sorted directory tree are read back and checked.
 */
#include "common.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define NDIR 4
#define NREC 256
#define RECSZ 64
#define KEEP_EVERY 16
#define LIFETIME 40

typedef struct {
    uint32_t len, orig;
    uint8_t dir, renamed, alive;
} fmodel;

static char base[400];
static fmodel *files;
static int32_t records[NREC];

static void die(const char *what, const char *path) {
    /* Paths under a native root are not deterministic; only print the relative part. */
    const char *rel = strstr(path, "/filework");
    fprintf(stderr, "filework: %s %s: %s\n", what, rel ? rel + 1 : path, strerror(errno));
    exit(1);
}

static void file_path(char *out, uint32_t i) {
    snprintf(out, 512, "%s/d%u/%c%u.dat", base, files[i].dir, files[i].renamed ? 'r' : 'f', i);
}

/* The bytes file i had after creation (*created of them) and append, before any truncation. */
static uint32_t file_bytes(uint32_t i, unsigned char *out, uint32_t *created) {
    wl_rng r = wl_rng_new(0xf11e0000ULL + i);
    uint32_t n = 64 + wl_below(&r, 2048);
    for (uint32_t j = 0; j < n; j++) out[j] = (unsigned char)('a' + wl_below(&r, 26));
    *created = n;
    return n + (uint32_t)sprintf((char *)out + n, "\nappended by iteration %u\n", i);
}

static void make_record(unsigned char *rec, int32_t iter, uint32_t slot) {
    memset(rec, '.', RECSZ);
    int n = snprintf((char *)rec, RECSZ, "slot %03u written by iteration %08d", slot, (int)iter);
    rec[n] = '.';
    rec[RECSZ - 1] = '\n';
}

static void write_all(int fd, const void *p, size_t n, const char *path) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) die("cannot write", path);
        c += w, n -= (size_t)w;
    }
}

static uint32_t read_file(const char *path, unsigned char *buf, uint32_t cap) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("cannot open", path);
    uint32_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0) die("cannot read", path);
        if (r == 0 || n + (uint32_t)r == cap) { n += (uint32_t)r; break; }
        n += (uint32_t)r;
    }
    close(fd);
    return n;
}

static void rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) die("cannot open directory", path);
        struct dirent *e;
        char sub[512];
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            rm_rf(sub);
        }
        closedir(d);
        if (rmdir(path) != 0) die("cannot remove directory", path);
    } else if (unlink(path) != 0) {
        die("cannot remove", path);
    }
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted names in dir (without . and ..); caller frees. */
static uint32_t list_dir(const char *dir, char ***names_out) {
    DIR *d = opendir(dir);
    if (!d) die("cannot list", dir);
    uint32_t n = 0, cap = 64;
    char **names = malloc(cap * sizeof(char *));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (n == cap) names = realloc(names, (cap *= 2) * sizeof(char *));
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(char *), cmp_str);
    *names_out = names;
    return n;
}


static void expect_record(unsigned char *out, uint32_t slot) {
    if (records[slot] < 0)
        memset(out, 0, RECSZ);
    else
        make_record(out, records[slot], slot);
}

/* Recursively hashes the sorted tree under dir (names relative to base, sizes, kinds); returns the entry count. */
static uint32_t walk(const char *dir, uint64_t *h) {
    char **names, sub[512];
    uint32_t n = list_dir(dir, &names), total = n;
    for (uint32_t k = 0; k < n; k++) {
        struct stat st;
        snprintf(sub, sizeof sub, "%s/%s", dir, names[k]);
        if (stat(sub, &st) != 0) die("cannot stat", sub);
        *h = wl_hash_bytes(*h, sub + strlen(base), strlen(sub) - strlen(base) + 1);
        *h = wl_hash_u64(*h, S_ISDIR(st.st_mode) ? 0xd1d1d1d1ULL : (uint64_t)st.st_size);
        if (S_ISDIR(st.st_mode)) total += walk(sub, h);
        free(names[k]);
    }
    free(names);
    return total;
}

static int subdir_exists(uint32_t k, uint32_t iters) {
    return k % 11 == 10 && !(k + 44 < iters && (k / 11) % 4 != 0);
}

int main(int argc, char **argv) {
    enum wl_size size = wl_parse_size(argc, argv, "filework");
    static const uint32_t iters_by_size[] = { 240, 20000, 100000 };
    static const uint32_t list_every_by_size[] = { 10, 50, 200 };
    const uint32_t iters = iters_by_size[size], list_every = list_every_by_size[size];
    const char *root = argc >= 3 ? argv[2] : "/data";
    struct stat st;
    if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "filework: %s is missing or not a directory; run it with a host directory preopened as /data\n",
                argc >= 3 ? "the given data directory" : "/data");
        return 1;
    }
    snprintf(base, sizeof base, "%s/filework", root);
    rm_rf(base);
    char path[512], path2[512];
    if (mkdir(base, 0755) != 0) die("cannot create", base);
    uint32_t count[NDIR] = { 0 };
    for (int d = 0; d < NDIR; d++) {
        snprintf(path, sizeof path, "%s/d%d", base, d);
        if (mkdir(path, 0755) != 0) die("cannot create", path);
    }
    files = calloc(iters, sizeof *files);
    unsigned char *buf = malloc(8192), *got = malloc(8192), rec[RECSZ], want[RECSZ];
    snprintf(path, sizeof path, "%s/journal.log", base);
    int jfd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (jfd < 0) die("cannot create", path);
    snprintf(path, sizeof path, "%s/records.bin", base);
    int dfd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (dfd < 0 || ftruncate(dfd, NREC * RECSZ) != 0) die("cannot create", path);
    for (int s = 0; s < NREC; s++) records[s] = -1;
    printf("filework: %u iterations over %d directories\n", iters, NDIR);

    uint64_t h = WL_FNV_OFFSET, written = 0;
    uint32_t live = 0, mid_len = 0, mid_created = 0;
    int mid_fd = -1;
    for (uint32_t i = 0; i < iters; i++) {
        fmodel *f = &files[i];
        f->dir = (uint8_t)(i % NDIR), f->alive = 1;
        uint32_t created, total = file_bytes(i, buf, &created), half = created / 2;
        file_path(path, i);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) die("cannot create", path);
        write_all(fd, buf, half, path);
        if (lseek(fd, 0, SEEK_CUR) != (off_t)half) wl_fail("iteration %u: offset after first write is not %u", i, half);
        write_all(fd, buf + half, created - half, path);
        close(fd);
        if ((fd = open(path, O_WRONLY | O_APPEND)) < 0) die("cannot reopen", path);
        write_all(fd, buf + created, total - created, path);
        close(fd);
        f->len = f->orig = total, live++, count[f->dir]++, written += total;

        uint32_t slot = (i * 7) % NREC, other = (i * 3 + 1) % NREC;
        make_record(rec, (int32_t)i, slot);
        if (pwrite(dfd, rec, RECSZ, (off_t)slot * RECSZ) != RECSZ) die("cannot pwrite", "records.bin");
        records[slot] = (int32_t)i;
        expect_record(want, other);
        if (pread(dfd, got, RECSZ, (off_t)other * RECSZ) != RECSZ || memcmp(got, want, RECSZ))
            wl_fail("iteration %u: pread of slot %u returned wrong bytes", i, other);
        if (lseek(dfd, (off_t)slot * RECSZ, SEEK_SET) < 0 || read(dfd, got, RECSZ) != RECSZ || memcmp(got, rec, RECSZ))
            wl_fail("iteration %u: seek+read of slot %u returned wrong bytes", i, slot);
        int n = snprintf((char *)got, 128, "iteration %u: %u bytes, slot %u\n", i, total, slot);
        write_all(jfd, got, (size_t)n, "journal.log");

        if (i % 5 == 4 && files[i - 3].alive) { /* truncate a recent file to half */
            uint32_t j = i - 3, len = files[j].len / 2;
            file_path(path2, j);
            if (i % 10 == 4) {
                if (truncate(path2, len) != 0) die("cannot truncate", path2);
            } else {
                if ((fd = open(path2, O_RDWR)) < 0 || ftruncate(fd, len) != 0) die("cannot ftruncate", path2);
                if (fstat(fd, &st) != 0 || st.st_size != (off_t)len) wl_fail("iteration %u: fstat size after ftruncate", i);
                close(fd);
            }
            files[j].len = len;
        }
        if (i % 7 == 6 && files[i - 5].alive) { /* move a recent file to the next directory */
            uint32_t j = i - 5;
            file_path(path2, j);
            count[files[j].dir]--;
            files[j].dir = (uint8_t)((files[j].dir + 1) % NDIR), files[j].renamed = 1;
            count[files[j].dir]++;
            file_path(path, j);
            if (rename(path2, path) != 0) die("cannot rename", path2);
        }
        if (i % 11 == 10) { /* a subdirectory with a note; drop most of them later */
            snprintf(path, sizeof path, "%s/d%u/sub%u", base, i % NDIR, i);
            if (mkdir(path, 0755) != 0) die("cannot create", path);
            count[i % NDIR]++;
            strcat(path, "/note.txt");
            if ((fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644)) < 0) die("cannot create", path);
            n = snprintf((char *)got, 128, "note of subdirectory %u\n", i);
            write_all(fd, got, (size_t)n, path);
            close(fd);
            uint32_t k = i - 44;
            if (i >= 44 && !subdir_exists(k, iters)) {
                snprintf(path, sizeof path, "%s/d%u/sub%u/note.txt", base, k % NDIR, k);
                if (unlink(path) != 0) die("cannot unlink", path);
                path[strlen(path) - strlen("/note.txt")] = '\0';
                if (rmdir(path) != 0) die("cannot rmdir", path);
                count[k % NDIR]--;
            }
        }
        if (i >= LIFETIME && (i - LIFETIME) % KEEP_EVERY != 0 && files[i - LIFETIME].alive) {
            uint32_t j = i - LIFETIME;
            file_path(path, j);
            if (unlink(path) != 0) die("cannot unlink", path);
            files[j].alive = 0, live--, count[files[j].dir]--;
        }
        if (i % list_every == list_every - 1) { /* list a directory and compare with the model */
            char **names;
            snprintf(path, sizeof path, "%s/d%u", base, i % NDIR);
            uint32_t m = list_dir(path, &names);
            if (m != count[i % NDIR]) wl_fail("iteration %u: d%u lists %u entries, model says %u", i, i % NDIR, m, count[i % NDIR]);
            for (uint32_t k = 0; k < m; k++) h = wl_hash_bytes(h, names[k], strlen(names[k]) + 1), free(names[k]);
            free(names);
        }
        if (i == iters / 2) { /* a file is open mid-write across the blocking call */
            snprintf(path, sizeof path, "%s/open-across-pause.dat", base);
            if ((mid_fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644)) < 0) die("cannot create", path);
            mid_len = file_bytes(iters + 1, buf, &mid_created);
            write_all(mid_fd, buf, mid_len / 2, path);
            wl_pause();
            write_all(mid_fd, buf + mid_len / 2, mid_len - mid_len / 2, path);
        }
        if ((i + 1) % (iters / 4) == 0) printf("filework: iteration %u, %u live files, %llu bytes written\n", i + 1, live, (unsigned long long)written);
    }

    /* Read everything back against the model. */
    uint32_t bad = 0;
    for (uint32_t j = 0; j < iters; j++) {
        if (!files[j].alive) continue;
        uint32_t created;
        file_bytes(j, buf, &created);
        file_path(path, j);
        uint32_t n = read_file(path, got, 8192);
        if (n != files[j].len || memcmp(got, buf, n)) bad++;
        h = wl_hash_bytes(wl_hash_bytes(h, path + strlen(base), strlen(path) - strlen(base)), got, n);
    }
    if (bad) wl_fail("%u files differ from the model", bad);
    for (uint32_t s = 0; s < NREC; s++) {
        expect_record(want, s);
        if (pread(dfd, got, RECSZ, (off_t)s * RECSZ) != RECSZ || memcmp(got, want, RECSZ)) wl_fail("record slot %u differs", s);
        h = wl_hash_bytes(h, got, RECSZ);
    }
    file_bytes(iters + 1, buf, &mid_created);
    if (pread(mid_fd, got, mid_len, 0) != (ssize_t)mid_len || memcmp(got, buf, mid_len)) wl_fail("file written across the pause differs");
    close(mid_fd);
    close(dfd);
    close(jfd);
    snprintf(path, sizeof path, "%s/journal.log", base);
    if (stat(path, &st) != 0) die("cannot stat", path);
    unsigned char *journal = malloc((size_t)st.st_size + 1);
    uint32_t jlen = read_file(path, journal, (uint32_t)st.st_size + 1), jpos = 0;
    for (uint32_t i = 0; i < iters && !bad; i++) {
        int n = snprintf((char *)got, 128, "iteration %u: %u bytes, slot %u\n", i, files[i].orig, (i * 7) % NREC);
        if (jpos + (uint32_t)n > jlen || memcmp(journal + jpos, got, (size_t)n)) bad = 1;
        jpos += (uint32_t)n;
    }
    if (bad || jpos != jlen) wl_fail("journal differs from the expected %u lines", iters);
    h = wl_hash_bytes(h, journal, jlen);
    free(journal);
    uint32_t subdirs = 0, expect_entries = 2 + 1 + NDIR;
    for (uint32_t k = 0; k < iters; k++) subdirs += subdir_exists(k, iters);
    expect_entries += live + 2 * subdirs;
    uint32_t entries = walk(base, &h);
    if (entries != expect_entries) wl_fail("tree has %u entries, model says %u", entries, expect_entries);
    printf("filework: %u live files, %u subdirectories, %u tree entries verified\n", live, subdirs, entries);
    free(files), free(buf), free(got);
    return wl_finish(h);
}
