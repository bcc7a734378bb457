/* Exercises the WASI file, args, env and clock calls through wasi-libc.
 * argv[1] is the directory to work in, argv[2] an arbitrary word.
 * Output must not depend on the host: names are sorted, no paths printed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char base[512];

static const char *p(const char *rel) {
    static char bufs[4][700];
    static int i;
    i = (i + 1) % 4;
    snprintf(bufs[i], sizeof bufs[i], "%s/%s", base, rel);
    return bufs[i];
}

static int cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void put(const char *rel, const char *text) {
    int fd = open(p(rel), O_CREAT | O_WRONLY | O_EXCL, 0644);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
        perror(rel);
        exit(1);
    }
    close(fd);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    snprintf(base, sizeof base, "%s", argv[1]);
    printf("argc=%d arg2=%s\n", argc, argv[2]);
    const char *e = getenv("ROAM_GREETING");
    printf("env=%s\n", e ? e : "(unset)");

    struct timespec t1, t2, rt;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    clock_gettime(CLOCK_MONOTONIC, &t2);
    clock_gettime(CLOCK_REALTIME, &rt);
    int mono_ok = t2.tv_sec > t1.tv_sec || (t2.tv_sec == t1.tv_sec && t2.tv_nsec >= t1.tv_nsec);
    printf("clock mono_ok=%d realtime_after_2020=%d\n", mono_ok, rt.tv_sec > 1577836800);

    if (mkdir(p("dir"), 0755) != 0) { perror("mkdir"); return 1; }
    int fd = open(p("dir/a.txt"), O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (fd < 0) { perror("open"); return 1; }
    const char *msg = "hello, roam world\n";
    printf("wrote=%zd\n", write(fd, msg, strlen(msg)));
    char buf[64] = {0};
    ssize_t r = pread(fd, buf, 5, 7);
    printf("pread=%zd '%.*s'\n", r, (int)r, buf);
    printf("offset=%lld\n", (long long)lseek(fd, 0, SEEK_CUR));
    lseek(fd, -6, SEEK_END);
    memset(buf, 0, sizeof buf);
    r = read(fd, buf, sizeof buf - 1);
    printf("tail=%zd '%.*s'\n", r, (int)r - 1, buf);
    if (ftruncate(fd, 5) != 0) { perror("ftruncate"); return 1; }
    struct stat st;
    fstat(fd, &st);
    printf("size_after_truncate=%lld\n", (long long)st.st_size);
    close(fd);

    put("dir/c.txt", "c");
    put("dir/b.txt", "bb");
    if (mkdir(p("dir/sub"), 0755) != 0) { perror("mkdir sub"); return 1; }
    if (rename(p("dir/a.txt"), p("dir/z.txt")) != 0) { perror("rename"); return 1; }

    DIR *d = opendir(p("dir"));
    if (!d) { perror("opendir"); return 1; }
    char *names[16];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 16)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            names[n++] = strdup(de->d_name);
    closedir(d);
    qsort(names, n, sizeof names[0], cmp);
    printf("entries:");
    for (int i = 0; i < n; i++) printf(" %s", names[i]);
    printf("\n");

    struct stat zs, ss;
    stat(p("dir/z.txt"), &zs);
    stat(p("dir/sub"), &ss);
    printf("z.size=%lld z.reg=%d sub.dir=%d\n", (long long)zs.st_size, S_ISREG(zs.st_mode) != 0,
           S_ISDIR(ss.st_mode) != 0);
    fd = open(p("dir/z.txt"), O_RDONLY);
    memset(buf, 0, sizeof buf);
    r = read(fd, buf, sizeof buf - 1);
    printf("z=%s\n", buf);
    printf("write_to_rdonly_fails=%d\n", write(fd, "x", 1) < 0);
    close(fd);

    errno = 0;
    printf("missing: %s\n", open(p("dir/nope"), O_RDONLY) < 0 && errno == ENOENT ? "ENOENT" : "?");
    errno = 0;
    printf("rmdir nonempty: %s\n", rmdir(p("dir")) < 0 && errno == ENOTEMPTY ? "ENOTEMPTY" : "?");

    int bad = unlink(p("dir/b.txt")) | unlink(p("dir/c.txt")) | unlink(p("dir/z.txt")) |
              rmdir(p("dir/sub")) | rmdir(p("dir"));
    printf("cleanup %s\n", bad == 0 && stat(p("dir"), &st) < 0 && errno == ENOENT ? "ok" : "FAILED");
    fflush(stdout);
    fprintf(stderr, "to stderr\n");
    printf("done\n");
    return 0;
}
