/*
 * is - integer sort, modelled on NAS Parallel Benchmarks IS.
 *
 * Keys are roughly Gaussian (the mean of four uniform integers). Each of the
 * ranking iterations modifies two keys, then ranks all keys with a counting
 * sort; a few test keys are checked against a direct count. Finally the keys
 * are fully sorted and verified as sorted and as a permutation of the input
 * (order-independent multiset checksums).
 */
#include "common.h"

static uint64_t mix(uint64_t v) {
    v ^= v >> 33;
    v *= 0xff51afd7ed558ccdULL;
    v ^= v >> 33;
    v *= 0xc4ceb9fe1a85ec53ULL;
    return v ^ (v >> 33);
}

int main(int argc, char **argv) {
    enum wl_size size = wl_parse_size(argc, argv, "is");
    static const uint32_t log2_keys[] = { 16, 24, 24 };
    static const uint32_t log2_max[] = { 11, 19, 21 };
    static const int iters_by_size[] = { 10, 10, 120 };
    const uint32_t n = 1u << log2_keys[size], maxkey = 1u << log2_max[size];
    const int iters = iters_by_size[size];
    enum { NTEST = 5 };

    uint32_t *key = malloc(sizeof(uint32_t) * n), *sorted = malloc(sizeof(uint32_t) * n);
    uint32_t *count = malloc(sizeof(uint32_t) * (maxkey + 1));
    if (!key || !sorted || !count) {
        fprintf(stderr, "is: out of memory\n");
        return 1;
    }
    wl_rng rng = wl_rng_new(314159265);
    const uint32_t q = maxkey / 4;
    for (uint32_t i = 0; i < n; i++)
        key[i] = wl_below(&rng, q) + wl_below(&rng, q) + wl_below(&rng, q) + wl_below(&rng, q);
    printf("is: %u keys in [0, %u), %d ranking iterations\n", n, maxkey, iters);

    uint32_t test_idx[NTEST];
    for (int t = 0; t < NTEST; t++) test_idx[t] = wl_below(&rng, n);

    uint64_t h = WL_FNV_OFFSET;
    for (int it = 1; it <= iters; it++) {
        key[it] = (uint32_t)it;
        key[it + iters] = maxkey - (uint32_t)it;
        memset(count, 0, sizeof(uint32_t) * (maxkey + 1));
        for (uint32_t i = 0; i < n; i++) count[key[i] + 1]++;
        for (uint32_t k = 0; k < maxkey; k++) count[k + 1] += count[k];
        /* count[k] is now the number of keys < k: the rank of key k. */
        for (int t = 0; t < NTEST; t++) {
            uint32_t k = key[test_idx[t]], direct = 0;
            for (uint32_t i = 0; i < n; i++) direct += key[i] < k;
            if (direct != count[k]) wl_fail("iteration %d: rank of key %u is %u, direct count %u", it, k, count[k], direct);
            h = wl_hash_u64(h, count[k]);
        }
        if (it == iters / 2) wl_pause();
        if (it % (iters / 2) == 0) printf("is: iteration %d ranks verified\n", it);
    }

    /* Full sort: scatter by the final ranks (stable counting sort). */
    for (uint32_t i = 0; i < n; i++) sorted[count[key[i]]++] = key[i];
    uint64_t sum_in = 0, sum_out = 0, xor_in = 0, xor_out = 0;
    for (uint32_t i = 0; i < n; i++) {
        sum_in += mix(key[i]);
        xor_in ^= mix(key[i] + 0x9e37u);
        sum_out += mix(sorted[i]);
        xor_out ^= mix(sorted[i] + 0x9e37u);
    }
    uint32_t unsorted = 0;
    for (uint32_t i = 1; i < n; i++) unsorted += sorted[i - 1] > sorted[i];
    if (unsorted) wl_fail("%u adjacent pairs out of order", unsorted);
    if (sum_in != sum_out || xor_in != xor_out) wl_fail("sorted keys are not a permutation of the input");
    printf("is: fully sorted, min %u median %u max %u\n", sorted[0], sorted[n / 2], sorted[n - 1]);

    for (uint32_t i = 0; i < n; i += 1 + (n >> 12)) h = wl_hash_u64(h, sorted[i]);
    h = wl_hash_u64(wl_hash_u64(h, sum_out), xor_out);
    free(key);
    free(sorted);
    free(count);
    return wl_finish(h);
}
