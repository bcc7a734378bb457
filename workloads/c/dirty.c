/*
 * dirty - a memory-dirtying workload for live-migration benchmarks.
 *
 * Why this exists: pre-copy migration converges only if the link carries
 * pages faster than the program dirties them, so its benchmarks need a
 * program whose state size and dirty rate are parameters. This one keeps
 * MIB MiB of state, rewrites randomly chosen 4 KiB pages at RATE MiB/s for
 * SECONDS seconds, and proves at the end that every page still holds what
 * was last written to it, which is exactly what a migration must preserve.
 *
 * Timing never changes the result: the work is fixed by the arguments
 * (SECONDS * 100 ticks, each writing the pages due by its end), and the
 * clock only paces the ticks with sleeps. A run that was migrated, paused or
 * starved of CPU prints the same output as an uninterrupted one. The
 * schedule re-bases itself when the monotonic clock jumps (a restore on
 * another host has an unrelated clock) instead of sleeping for the jump or
 * racing to catch up.
 *
 * Page contents are pseudo-random but compressible like real heaps: each
 * page is 64 lines of 64 bytes; an eighth of the lines are random bytes,
 * the rest are words from a 32-word vocabulary. zstd -3 compresses it about
 * 2.9x (2.7x at -1, 3.5x at -19; gzip 2.9x). Content is a function of (page,
 * write number), so the final check regenerates every page.
 */
#include "common.h"
#include "pace.h"

enum { PAGE = 4096, LINE = 64 };

static const char *const WORDS[32] = {
    "the", "page", "memory", "state", "dirty", "write", "value", "node",
    "link", "of", "and", "to", "in", "is", "checkpoint", "restore",
    "migrate", "wasm", "stack", "heap", "buffer", "record", "index", "key",
    "data", "frame", "table", "count", "next", "list", "error", "ok",
};

static uint64_t mix(uint64_t v) {
    v ^= v >> 33;
    v *= 0xff51afd7ed558ccdULL;
    v ^= v >> 33;
    v *= 0xc4ceb9fe1a85ec53ULL;
    return v ^ (v >> 33);
}

/* Fills one page with the content of write number `version` of `page`. */
static void fill_page(unsigned char *p, uint32_t page, uint32_t version) {
    wl_rng rng = wl_rng_new(mix(((uint64_t)page << 32) ^ version ^ 0x6469727479ULL));
    for (int line = 0; line < PAGE / LINE; line++) {
        unsigned char *l = p + line * LINE;
        uint64_t r = wl_next(&rng);
        if ((r & 7) == 0) {
            for (int i = 0; i < LINE; i += 8) {
                uint64_t w = wl_next(&rng);
                for (int b = 0; b < 8; b++) l[i + b] = (unsigned char)(w >> (8 * b));
            }
            continue;
        }
        int n = 0;
        while (n < LINE - 1) {
            const char *w = WORDS[wl_next(&rng) & 31];
            while (*w && n < LINE - 1) l[n++] = (unsigned char)*w++;
            if (n < LINE - 1) l[n++] = ' ';
        }
        l[LINE - 1] = '\n';
    }
}

/* Digest of a page: 64-bit words read as little-endian on every host. */
static uint64_t page_digest(const unsigned char *p) {
    uint64_t h = WL_FNV_OFFSET;
    for (int i = 0; i < PAGE; i += 8) {
        uint64_t w = 0;
        for (int b = 0; b < 8; b++) w |= (uint64_t)p[i + b] << (8 * b);
        h = (h ^ w) * WL_FNV_PRIME;
        h ^= h >> 29;
    }
    return h;
}

static _Noreturn void usage(void) {
    fprintf(stderr,
            "usage: dirty S|M|L\n"
            "       dirty MIB RATE SECONDS\n"
            "  MIB      state size in MiB (1..3072)\n"
            "  RATE     pages rewritten per second, in MiB/s (0..4096)\n"
            "  SECONDS  run time (1..86400); the work is fixed, the clock only paces it\n"
            "  S = 8 16 1, M = 64 32 5, L = 256 20 30\n");
    exit(2);
}

int main(int argc, char **argv) {
    static const long presets[3][3] = { { 8, 16, 1 }, { 64, 32, 5 }, { 256, 20, 30 } };
    long mib, rate, secs;
    if (argc >= 2 && argc <= 3 && (!strcmp(argv[1], "S") || !strcmp(argv[1], "M") || !strcmp(argv[1], "L"))) {
        /* argv[2], if any, is the data directory check.sh passes to every
         * workload; this one has no files. */
        enum wl_size size = wl_parse_size(2, argv, "dirty");
        mib = presets[size][0], rate = presets[size][1], secs = presets[size][2];
    } else if (argc == 4) {
        mib = parse_arg(argv[1], 1, 3072);
        rate = parse_arg(argv[2], 0, 4096);
        secs = parse_arg(argv[3], 1, 86400);
        if (mib < 0 || rate < 0 || secs < 0) usage();
    } else {
        usage();
    }

    const uint32_t npages = (uint32_t)(mib * (1 << 20) / PAGE);
    const int64_t ticks = secs * TICKS_PER_SEC;
    /* Page writes due by the end of tick t: floor(rate MiB/s * (t+1) ticks). */
    const int64_t pages_per_sec = rate * ((1 << 20) / PAGE);
    unsigned char *mem = malloc((size_t)npages * PAGE);
    uint32_t *version = calloc(npages, sizeof(uint32_t));
    unsigned char *scratch = malloc(PAGE);
    if (!mem || !version || !scratch) {
        fprintf(stderr, "dirty: out of memory for %ld MiB\n", mib);
        return 1;
    }
    printf("dirty: %ld MiB of state, %ld MiB/s rewritten in %d-byte pages for %ld s (%lld ticks)\n",
           mib, rate, PAGE, secs, (long long)ticks);

    uint64_t h = WL_FNV_OFFSET;
    for (uint32_t p = 0; p < npages; p++) {
        fill_page(mem + (size_t)p * PAGE, p, 0);
        h = wl_hash_u64(h, page_digest(mem + (size_t)p * PAGE));
    }
    printf("dirty: initial state written\n");

    wl_rng rng = wl_rng_new(20260521);
    uint32_t writes = 0;
    int64_t done = 0, base = now_ns();
    for (int64_t t = 0; t < ticks; t++) {
        int64_t due = pages_per_sec * (t + 1) / TICKS_PER_SEC;
        for (; done < due; done++) {
            uint32_t p = wl_below(&rng, npages);
            version[p] = ++writes;
            unsigned char *page = mem + (size_t)p * PAGE;
            fill_page(page, p, version[p]);
            h = wl_hash_u64(h, ((uint64_t)p << 32) | version[p]);
            h = wl_hash_u64(h, page_digest(page));
        }
        if (t + 1 == ticks / 2) printf("dirty: half-way, %lld page writes\n", (long long)done);
        pace(&base, t);
    }

    /* Every page must hold exactly its last write. */
    uint32_t bad = 0, untouched = 0;
    for (uint32_t p = 0; p < npages; p++) {
        fill_page(scratch, p, version[p]);
        if (memcmp(scratch, mem + (size_t)p * PAGE, PAGE) != 0 && bad++ < 5)
            wl_fail("page %u does not hold write %u", p, version[p]);
        untouched += version[p] == 0;
        h = wl_hash_u64(h, page_digest(mem + (size_t)p * PAGE));
    }
    if (bad) wl_fail("%u of %u pages differ from their last write", bad, npages);
    if ((int64_t)writes != done) wl_fail("%u writes recorded, %lld expected", writes, (long long)done);
    printf("dirty: %lld page writes (%lld MiB), %u of %u pages never rewritten, all verified\n",
           (long long)done, (long long)(done * PAGE >> 20), untouched, npages);
    return wl_finish(h);
}
