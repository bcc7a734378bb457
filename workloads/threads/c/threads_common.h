/* Shared contract of the C multi-threaded workloads, the same as the Rust
 * ones' (common/src/lib.rs): `<program> [THREADS 1..8, default 4] [S|M,
 * default M]`; the thread count goes to stderr only, so stdout is identical
 * for every thread count; the last line is `check: ok`, or `check: FAILED`
 * and exit status 1. Header-only: each program is one translation unit
 * (plus third-party code), built for wasm32-wasi-threads and natively. */
#ifndef THREADS_COMMON_H
#define THREADS_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum size { SIZE_S, SIZE_M };

struct args {
    int threads;
    enum size size;
};

/* Parses argv; anything else prints usage and exits 2. */
static struct args parse_args(const char *name, int argc, char **argv)
{
    struct args a = { 4, SIZE_M };
    int ok = argc <= 3;
    if (ok && argc > 1) {
        char *end;
        long t = strtol(argv[1], &end, 10);
        ok = *argv[1] != '\0' && *end == '\0' && t >= 1 && t <= 8;
        a.threads = (int)t;
    }
    if (ok && argc > 2) {
        if (strcmp(argv[2], "S") == 0)
            a.size = SIZE_S;
        else
            ok = strcmp(argv[2], "M") == 0;
    }
    if (!ok) {
        fprintf(stderr, "usage: %s [THREADS 1..8, default 4] [S|M, default M]\n", name);
        exit(2);
    }
    fprintf(stderr, "threads: %d\n", a.threads);
    return a;
}

/* The SplitMix64 finaliser (common::mix): a bijective 64-bit mixer. */
static inline uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Order-sensitive hash of 64-bit words, the same as common::Hash, so that
 * a value means the same in the C and the Rust programs. */
#define HASH_INIT 0xcbf29ce484222325ull
static inline uint64_t hash_add(uint64_t h, uint64_t v)
{
    h = (h ^ v) * 0x100000001b3ull;
    return h ^ (h >> 32);
}

/* Plain FNV-1a over bytes, for byte streams (compressed data). */
static inline uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Prints the check line and returns the exit status for main. */
static int finish(int ok)
{
    puts(ok ? "check: ok" : "check: FAILED");
    return ok ? 0 : 1;
}

/* A failed pthread or allocation call is a broken environment, not a wrong
 * result: say which and stop, rather than print a misleading check line. */
static void need(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fatal: %s failed\n", what);
        exit(3);
    }
}

#endif
