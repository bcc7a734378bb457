/*
 * matmul - dense matrix multiplication, modelled on Phoenix matrix_multiply.
 *
 * C = A * B for square double matrices, computed with a cache-blocked i-k-j
 * loop nest. The blocking keeps every C[i][j] accumulating over k in
 * increasing order, so sampled entries must equal a naive dot product bit
 * for bit; row sums are also checked against A * (B * 1).
 */
#include "common.h"
#include <math.h>

#define BLK 64

int main(int argc, char **argv) {
    enum wl_size size = wl_parse_size(argc, argv, "matmul");
    static const uint32_t ns[] = { 160, 1500, 3000 };
    const uint32_t n = ns[size];
    double *a = malloc(sizeof(double) * n * n), *b = malloc(sizeof(double) * n * n);
    double *c = calloc((size_t)n * n, sizeof(double));
    if (!a || !b || !c) {
        fprintf(stderr, "matmul: out of memory\n");
        return 1;
    }
    wl_rng rng = wl_rng_new(141421356);
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = wl_unit(&rng) * 2.0 - 1.0;
    for (size_t i = 0; i < (size_t)n * n; i++) b[i] = wl_unit(&rng) * 2.0 - 1.0;
    printf("matmul: %u x %u, block %d\n", n, n, BLK);

    uint32_t nblocks = (n + BLK - 1) / BLK;
    for (uint32_t bi = 0; bi < nblocks; bi++) {
        uint32_t i0 = bi * BLK, i1 = i0 + BLK < n ? i0 + BLK : n;
        for (uint32_t k0 = 0; k0 < n; k0 += BLK) {
            uint32_t k1 = k0 + BLK < n ? k0 + BLK : n;
            for (uint32_t j0 = 0; j0 < n; j0 += BLK) {
                uint32_t j1 = j0 + BLK < n ? j0 + BLK : n;
                for (uint32_t i = i0; i < i1; i++)
                    for (uint32_t k = k0; k < k1; k++) {
                        double aik = a[(size_t)i * n + k];
                        double *ci = &c[(size_t)i * n];
                        const double *bk = &b[(size_t)k * n];
                        for (uint32_t j = j0; j < j1; j++) ci[j] += aik * bk[j];
                    }
            }
        }
        if (bi == nblocks / 2) {
            wl_pause();
            printf("matmul: %u of %u row blocks done\n", bi + 1, nblocks);
        }
    }

    /* Exact cross-check of sampled entries against a naive dot product. */
    uint32_t mismatches = 0;
    for (int s = 0; s < 256; s++) {
        uint32_t i = wl_below(&rng, n), j = wl_below(&rng, n);
        double ref = 0.0;
        for (uint32_t k = 0; k < n; k++) ref += a[(size_t)i * n + k] * b[(size_t)k * n + j];
        if (ref != c[(size_t)i * n + j]) mismatches++;
    }
    if (mismatches) wl_fail("%u of 256 sampled entries differ from the naive product", mismatches);

    /* Row sums: C * 1 must equal A * (B * 1) up to rounding. */
    double *b1 = malloc(sizeof(double) * n), worst = 0.0;
    for (uint32_t k = 0; k < n; k++) {
        double s = 0.0;
        for (uint32_t j = 0; j < n; j++) s += b[(size_t)k * n + j];
        b1[k] = s;
    }
    for (uint32_t i = 0; i < n; i++) {
        double s1 = 0.0, s2 = 0.0;
        for (uint32_t j = 0; j < n; j++) s1 += c[(size_t)i * n + j];
        for (uint32_t k = 0; k < n; k++) s2 += a[(size_t)i * n + k] * b1[k];
        double d = fabs(s1 - s2);
        if (d > worst) worst = d;
    }
    if (!(worst <= 1e-10 * n * n)) wl_fail("row-sum check off by %.3e", worst);
    free(b1);

    uint64_t h = WL_FNV_OFFSET;
    double trace = 0.0;
    for (uint32_t i = 0; i < n; i++) trace += c[(size_t)i * n + i];
    for (size_t i = 0; i < (size_t)n * n; i++) h = wl_hash_f64(h, c[i]);
    printf("matmul: trace = %.15e, worst row-sum deviation %.3e\n", trace, worst);
    free(a), free(b), free(c);
    return wl_finish(h);
}
