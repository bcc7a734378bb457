/*
 * common.h - shared helpers for the roam C workloads.
 *
 * Why this exists: every workload must be deterministic (same stdout on every
 * ISA and engine), parse the same size-class argument, end with the same
 * `checksum:` line and perform exactly one short blocking call half-way through,
 * where roam's tests take a checkpoint "during a blocking call". Keeping those
 * rules in one header keeps the workloads consistent with each other and with
 * the Rust crate `workloads/rust/common`, which implements the same contract.
 *
 * Only IEEE-exact floating-point operations (+ - * / sqrt) are used by the
 * workloads; `wl_log` below is written with those so that native builds (glibc)
 * and wasm builds (wasi-libc) produce bit-identical results.
 */
#ifndef ROAM_WORKLOADS_COMMON_H
#define ROAM_WORKLOADS_COMMON_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- size classes ------------------------------------------------------ */

enum wl_size { WL_S = 0, WL_M = 1, WL_L = 2 };

/* Parses argv[1] as S, M or L; prints usage and exits 2 otherwise. */
static inline enum wl_size wl_parse_size(int argc, char **argv, const char *name) {
    if (argc >= 2 && argv[1][0] != '\0' && argv[1][1] == '\0') {
        switch (argv[1][0]) {
        case 'S': return WL_S;
        case 'M': return WL_M;
        case 'L': return WL_L;
        default: break;
        }
    }
    fprintf(stderr, "usage: %s S|M|L\n  S: small (tests), M: medium (~1-3 s), L: large (~10-15 s)\n", name);
    exit(2);
}

/* ---- deterministic PRNG (SplitMix64) ------------------------------------ */

typedef struct { uint64_t s; } wl_rng;

static inline wl_rng wl_rng_new(uint64_t seed) { wl_rng r = { seed }; return r; }

static inline uint64_t wl_next(wl_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform integer in [0, n) for n < 2^32 (multiply-high, no modulo bias worth noting). */
static inline uint32_t wl_below(wl_rng *r, uint32_t n) {
    return (uint32_t)(((wl_next(r) >> 32) * (uint64_t)n) >> 32);
}

/* Uniform double in [0, 1) with 53 random bits. */
static inline double wl_unit(wl_rng *r) {
    return (double)(wl_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- checksum: FNV-1a 64 over little-endian result bytes ---------------- */

#define WL_FNV_OFFSET 0xcbf29ce484222325ULL
#define WL_FNV_PRIME 0x100000001b3ULL

static inline uint64_t wl_hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= WL_FNV_PRIME;
    }
    return h;
}

/* Hashes v as 8 little-endian bytes, independent of host byte order and word size. */
static inline uint64_t wl_hash_u64(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= WL_FNV_PRIME;
    }
    return h;
}

static inline uint64_t wl_hash_f64(uint64_t h, double d) {
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return wl_hash_u64(h, bits);
}

/* ---- the blocking-call window ------------------------------------------ */

/*
 * One 1 ms sleep, called once roughly half-way through every workload. Under
 * WASI it becomes a single `poll_oneoff`; roam's tests checkpoint there.
 */
static inline void wl_pause(void) {
    struct timespec ts = { 0, 1000000 };
    nanosleep(&ts, NULL);
}

/* ---- verification and the final line ----------------------------------- */

static int wl_failed = 0;

/* Records a verification failure; the workload still prints its checksum. */
static inline void wl_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("VERIFICATION FAILED: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    wl_failed = 1;
}

/* Prints the final `checksum:` line; returns the process exit status. */
static inline int wl_finish(uint64_t checksum) {
    printf("checksum: %016llx\n", (unsigned long long)checksum);
    fflush(stdout);
    return wl_failed ? 1 : 0;
}

/* ---- portable math ------------------------------------------------------ */

/*
 * Natural logarithm for finite x > 0 built from + - * / only, so that it
 * rounds identically under glibc, wasi-libc and every ISA (libm `log` may
 * differ in the last bit between C libraries). Accurate to a few ulp.
 */
static inline double wl_log(double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    int e = (int)((bits >> 52) & 0x7ff) - 1023;
    bits = (bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL; /* m in [1,2) */
    double m;
    memcpy(&m, &bits, sizeof m);
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e += 1;
    }
    double s = (m - 1.0) / (m + 1.0), s2 = s * s, term = s, sum = 0.0;
    for (int k = 1; k <= 27; k += 2) {
        sum += term / k;
        term *= s2;
    }
    return 2.0 * sum + e * 0.6931471805599453;
}

#endif
