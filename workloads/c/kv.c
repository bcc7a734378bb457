/*
 * kv - an in-memory key-value store serving a paced request stream, for
 * live-migration benchmarks.
 *
 * Why this exists: `dirty` rewrites whole pages uniformly; a service
 * dirties memory in small scattered writes with a hot set, which is what
 * pre-copy sees from real servers. This store holds KEYS records of
 * VALUE bytes in an open-addressing hash table and serves RATE requests per
 * second for SECONDS seconds: 80 % GET, 20 % PUT, 90 % of them on a hot 10 %
 * of the keys. GETs feed the checksum, PUTs rewrite the value with content
 * derived from (key, version), so the end check can regenerate every value.
 *
 * As in `dirty`, the request stream is fixed by the arguments and the clock
 * only paces it (100 ticks per second, re-based when the clock jumps), so a
 * migrated run prints the same output as an uninterrupted one. The pacing
 * helpers are copied from dirty.c rather than moved into common.h, which
 * the Rust workloads mirror and which has no clock use by design.
 */
#include "common.h"
#include "pace.h"

enum { KEY_LEN = 16 };

typedef struct {
    char key[KEY_LEN];
    uint32_t version;
    uint32_t id;
} kv_head;

static uint64_t mix(uint64_t v) {
    v ^= v >> 33;
    v *= 0xff51afd7ed558ccdULL;
    v ^= v >> 33;
    v *= 0xc4ceb9fe1a85ec53ULL;
    return v ^ (v >> 33);
}

static void make_key(char *k, uint32_t id) { snprintf(k, KEY_LEN, "user:%010u", id); }

static uint64_t key_hash(const char *k) { return wl_hash_bytes(WL_FNV_OFFSET, k, KEY_LEN); }

/* Value of version `ver` of record `id`: text-like with some random bytes. */
static void fill_value(unsigned char *v, uint32_t len, uint32_t id, uint32_t ver) {
    static const char text[] = "{\"name\":\"user\",\"visits\":0,\"tags\":[\"a\",\"b\"],\"active\":true} ";
    wl_rng rng = wl_rng_new(mix(((uint64_t)id << 32) ^ ver ^ 0x6b76ULL));
    for (uint32_t i = 0; i < len; i++) v[i] = (unsigned char)text[i % (sizeof text - 1)];
    for (uint32_t i = 0; i + 8 <= len; i += 32) {
        uint64_t w = wl_next(&rng);
        for (int b = 0; b < 8; b++) v[i + b] = (unsigned char)(w >> (8 * b));
    }
}

static _Noreturn void usage(void) {
    fprintf(stderr,
            "usage: kv S|M|L\n"
            "       kv KEYS VALUE RATE SECONDS\n"
            "  KEYS     number of records (10..50000000)\n"
            "  VALUE    value size in bytes (8..65536)\n"
            "  RATE     requests per second (0..10000000); 80%% GET, 20%% PUT\n"
            "  SECONDS  run time (1..86400); the requests are fixed, the clock only paces them\n"
            "  S = 10000 256 20000 1, M = 200000 512 100000 5, L = 1000000 256 200000 30\n");
    exit(2);
}

int main(int argc, char **argv) {
    static const long presets[3][4] = {
        { 10000, 256, 20000, 1 }, { 200000, 512, 100000, 5 }, { 1000000, 256, 200000, 30 } };
    long nkeys = 0, vlen = 0, rate = 0, secs = 0;
    if (argc >= 2 && argc <= 3 && (!strcmp(argv[1], "S") || !strcmp(argv[1], "M") || !strcmp(argv[1], "L"))) {
        enum wl_size size = wl_parse_size(2, argv, "kv"); /* argv[2]: check.sh's data dir, unused */
        nkeys = presets[size][0], vlen = presets[size][1], rate = presets[size][2], secs = presets[size][3];
    } else if (argc == 5) {
        nkeys = parse_arg(argv[1], 10, 50000000);
        vlen = parse_arg(argv[2], 8, 65536);
        rate = parse_arg(argv[3], 0, 10000000);
        secs = parse_arg(argv[4], 1, 86400);
        if (nkeys < 0 || vlen < 0 || rate < 0 || secs < 0) usage();
    } else {
        usage();
    }
    if ((uint64_t)nkeys * (uint64_t)(vlen + sizeof(kv_head)) > (3ULL << 30)) {
        fprintf(stderr, "kv: %ld records of %ld bytes exceed 3 GiB\n", nkeys, vlen);
        return 2;
    }

    const uint32_t n = (uint32_t)nkeys, len = (uint32_t)vlen;
    uint32_t slots = 1;
    while (slots < 2 * n) slots <<= 1;
    kv_head *head = malloc(sizeof(kv_head) * n);
    unsigned char *values = malloc((size_t)n * len);
    uint32_t *table = malloc(sizeof(uint32_t) * slots); /* record index + 1, 0 = empty */
    unsigned char *scratch = malloc(len);
    if (!head || !values || !table || !scratch) {
        fprintf(stderr, "kv: out of memory for %u records of %u bytes\n", n, len);
        return 1;
    }
    memset(table, 0, sizeof(uint32_t) * slots);
    printf("kv: %u records of %u bytes, %ld requests/s for %ld s\n", n, len, rate, secs);

    /* Record i has key "user:<i>"; the hash table maps keys to records. */
    wl_rng rng = wl_rng_new(271828);
    for (uint32_t i = 0; i < n; i++) {
        make_key(head[i].key, i);
        head[i].version = 0;
        head[i].id = i;
        fill_value(values + (size_t)i * len, len, i, 0);
        uint32_t s = (uint32_t)key_hash(head[i].key) & (slots - 1);
        while (table[s]) s = (s + 1) & (slots - 1);
        table[s] = i + 1;
    }

    uint64_t h = WL_FNV_OFFSET, gets = 0, puts = 0, misses = 0;
    const uint32_t hot = n / 10 ? n / 10 : 1;
    const int64_t ticks = secs * TICKS_PER_SEC;
    int64_t done = 0, base = now_ns();
    char key[KEY_LEN];
    for (int64_t t = 0; t < ticks; t++) {
        int64_t due = rate * (t + 1) / TICKS_PER_SEC;
        for (; done < due; done++) {
            uint64_t r = wl_next(&rng);
            uint32_t id = (r % 10) < 9 ? (uint32_t)(mix(wl_below(&rng, hot)) % n) : wl_below(&rng, n);
            /* Now and then a key that does not exist. */
            if ((r >> 8) % 1000 == 0) id = n + wl_below(&rng, n);
            make_key(key, id);
            uint32_t s = (uint32_t)key_hash(key) & (slots - 1);
            while (table[s] && memcmp(head[table[s] - 1].key, key, KEY_LEN) != 0) s = (s + 1) & (slots - 1);
            if (!table[s]) {
                misses++;
                h = wl_hash_u64(h, ~(uint64_t)id);
                continue;
            }
            uint32_t rec = table[s] - 1;
            unsigned char *v = values + (size_t)rec * len;
            if (((r >> 4) % 5) == 0) {
                fill_value(v, len, rec, ++head[rec].version);
                puts++;
                h = wl_hash_u64(h, ((uint64_t)rec << 32) | head[rec].version);
            } else {
                gets++;
                h = wl_hash_bytes(h, v, len < 64 ? len : 64);
                h = wl_hash_u64(h, head[rec].version);
            }
        }
        if (t + 1 == ticks / 2) printf("kv: half-way, %lld requests\n", (long long)done);
        pace(&base, t);
    }

    uint32_t bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        fill_value(scratch, len, i, head[i].version);
        if (memcmp(scratch, values + (size_t)i * len, len) != 0 && bad++ < 5)
            wl_fail("record %u does not hold version %u", i, head[i].version);
        h = wl_hash_bytes(h, values + (size_t)i * len, len < 64 ? len : 64);
    }
    if (bad) wl_fail("%u of %u records differ from their last PUT", bad, n);
    if (gets + puts + misses != (uint64_t)done) wl_fail("request counts do not add up");
    printf("kv: %llu GET, %llu PUT, %llu misses, all %u records verified\n",
           (unsigned long long)gets, (unsigned long long)puts, (unsigned long long)misses, n);
    return wl_finish(h);
}
