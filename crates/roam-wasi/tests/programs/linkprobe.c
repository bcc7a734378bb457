/* Exercises hard links (path_link) and O_TRUNC on existing files through
 * wasi-libc. argv[1] is the directory to work in. Output must not depend on
 * the host: errno values are printed by name, no paths or inode numbers. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char base[512];

static const char *p(const char *rel) {
    static char bufs[4][700];
    static int i;
    i = (i + 1) % 4;
    snprintf(bufs[i], sizeof bufs[i], "%s/%s", base, rel);
    return bufs[i];
}

static const char *ename(int e) {
    switch (e) {
    case 0: return "ok";
    case EEXIST: return "EEXIST";
    case ENOENT: return "ENOENT";
    case EPERM: return "EPERM";
    case EISDIR: return "EISDIR";
    case EINVAL: return "EINVAL";
    case ENOTSUP: return "ENOTSUP";
    case EXDEV: return "EXDEV";
    case EACCES: return "EACCES";
    case ENOTDIR: return "ENOTDIR";
    default: return "other";
    }
}

static const char *res(int r) { return ename(r == 0 ? 0 : errno); }

static void put(const char *rel, const char *text, int flags) {
    int fd = open(p(rel), O_WRONLY | flags, 0644);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
        printf("put %s: %s\n", rel, ename(errno));
        exit(1);
    }
    close(fd);
}

static void show(const char *rel) {
    char buf[64] = {0};
    int fd = open(p(rel), O_RDONLY);
    if (fd < 0) {
        printf("%s: %s\n", rel, ename(errno));
        return;
    }
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    printf("%s=%zd '%s'\n", rel, n, buf);
}

static long nlink(const char *rel) {
    struct stat st;
    return lstat(p(rel), &st) == 0 ? (long)st.st_nlink : -1;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    snprintf(base, sizeof base, "%s", argv[1]);

    /* O_TRUNC on an existing file empties it. */
    put("a.txt", "hello world", O_CREAT | O_EXCL);
    int fd = open(p("a.txt"), O_WRONLY | O_TRUNC);
    printf("open_trunc=%s\n", ename(fd >= 0 ? 0 : errno));
    struct stat st;
    fstat(fd, &st);
    printf("size_after_open_trunc=%lld\n", (long long)st.st_size);
    write(fd, "fresh", 5);
    close(fd);
    put("a.txt", "!", O_APPEND | O_TRUNC);
    show("a.txt");
    put("a.txt", "fresh", O_CREAT | O_TRUNC);
    fd = open(p("a.txt"), O_RDWR | O_TRUNC);
    fstat(fd, &st);
    printf("rdwr_trunc=%s size=%lld\n", ename(fd >= 0 ? 0 : errno), (long long)st.st_size);
    write(fd, "fresh", 5);
    close(fd);

    /* Read-only with O_TRUNC truncates too, as Linux does. */
    put("r.txt", "data", O_CREAT | O_EXCL);
    fd = open(p("r.txt"), O_RDONLY | O_TRUNC);
    fstat(fd, &st);
    printf("rdonly_trunc=%s size=%lld\n", ename(fd >= 0 ? 0 : errno), (long long)st.st_size);
    close(fd);
    unlink(p("r.txt"));

    /* A hard link shares the file. */
    printf("link=%s\n", res(link(p("a.txt"), p("b.txt"))));
    printf("nlink a=%ld b=%ld\n", nlink("a.txt"), nlink("b.txt"));
    struct stat sa, sb;
    stat(p("a.txt"), &sa);
    stat(p("b.txt"), &sb);
    printf("same_inode=%d\n", sa.st_ino == sb.st_ino);
    put("b.txt", "FRESH", 0);
    show("a.txt");

    /* Failures. */
    printf("link_onto_existing=%s\n", res(link(p("a.txt"), p("b.txt"))));
    printf("link_missing=%s\n", res(link(p("missing"), p("c.txt"))));
    mkdir(p("d"), 0755);
    printf("link_dir=%s\n", res(link(p("d"), p("d2"))));
    printf("link_into_missing_dir=%s\n", res(link(p("a.txt"), p("nodir/x"))));
    printf("link_into_subdir=%s\n", res(link(p("a.txt"), p("d/a.txt"))));
    printf("nlink a=%ld\n", nlink("a.txt"));

    /* Symlinks: link() links the symlink itself; AT_SYMLINK_FOLLOW its target. */
    symlink("a.txt", p("s"));
    printf("link_symlink=%s\n", res(link(p("s"), p("s2"))));
    struct stat ls;
    lstat(p("s2"), &ls);
    printf("s2_is_symlink=%d\n", S_ISLNK(ls.st_mode));
    printf("linkat_follow=%s\n",
           res(linkat(AT_FDCWD, p("s"), AT_FDCWD, p("f"), AT_SYMLINK_FOLLOW)));
    lstat(p("f"), &ls);
    printf("f_is_reg=%d nlink a=%ld\n", S_ISREG(ls.st_mode), nlink("a.txt"));
    show("f");

    /* Unlinking one name leaves the others. */
    int bad = unlink(p("a.txt"));
    printf("after_unlink nlink b=%ld\n", nlink("b.txt"));
    show("b.txt");
    bad |= unlink(p("b.txt")) | unlink(p("d/a.txt")) | unlink(p("f")) | unlink(p("s")) |
           unlink(p("s2")) | rmdir(p("d"));
    printf("cleanup %s\n", bad ? "failed" : "ok");
    return 0;
}
