/*
 * ep - "embarrassingly parallel", modelled on NAS Parallel Benchmarks EP.
 *
 * Generates pairs of uniform deviates with the NPB-style multiplicative LCG
 * x' = 5^13 x mod 2^46, turns accepted pairs into Gaussian deviates with the
 * Marsaglia polar method and counts them in square annuli. Work is split into
 * batches whose seeds are obtained by jumping ahead in the LCG (a^k mod 2^46),
 * which is verified against the sequentially generated stream.
 */
#include "common.h"
#include <math.h>

#define MASK46 ((1ULL << 46) - 1)
#define A46 1220703125ULL /* 5^13 */
#define NQ 10

static uint64_t mulmod46(uint64_t a, uint64_t b) { return (a * b) & MASK46; }

static uint64_t powmod46(uint64_t a, uint64_t k) {
    uint64_t r = 1;
    while (k) {
        if (k & 1) r = mulmod46(r, a);
        a = mulmod46(a, a);
        k >>= 1;
    }
    return r;
}

int main(int argc, char **argv) {
    enum wl_size size = wl_parse_size(argc, argv, "ep");
    static const int log2_pairs[] = { 19, 26, 29 };
    const int nbatch = 16;
    const uint64_t pairs = 1ULL << log2_pairs[size];
    const uint64_t per_batch = pairs / nbatch;
    const uint64_t seed = 271828183ULL;
    const double r46 = 1.0 / (double)(1ULL << 46);

    /* libm cross-check of the portable log (not hashed: libm may differ by an ulp). */
    static const double probes[] = { 1e-9, 0.001, 0.3, 0.7071, 0.999999, 1.0 };
    for (unsigned i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        double a = wl_log(probes[i]), b = log(probes[i]);
        if (fabs(a - b) > 4e-16 * (fabs(b) + 1e-300) + 1e-300)
            wl_fail("wl_log(%g) = %.17g, libm says %.17g", probes[i], a, b);
    }

    printf("ep: %llu pairs in %d batches\n", (unsigned long long)pairs, nbatch);
    uint64_t q[NQ] = { 0 };
    double sx = 0.0, sy = 0.0;
    uint64_t accepted = 0, x = seed, stepped = seed;
    const uint64_t jump = powmod46(A46, 2 * per_batch);
    for (int b = 0; b < nbatch; b++) {
        uint64_t expect = mulmod46(seed, powmod46(A46, 2 * per_batch * (uint64_t)b));
        if (x != expect || x != stepped)
            wl_fail("batch %d seed %llx != jump-ahead %llx / %llx", b, (unsigned long long)x, (unsigned long long)expect,
                    (unsigned long long)stepped);
        stepped = mulmod46(stepped, jump);
        double bx = 0.0, by = 0.0;
        for (uint64_t i = 0; i < per_batch; i++) {
            x = mulmod46(x, A46);
            double x1 = 2.0 * (double)x * r46 - 1.0;
            x = mulmod46(x, A46);
            double x2 = 2.0 * (double)x * r46 - 1.0;
            double t = x1 * x1 + x2 * x2;
            if (t <= 1.0 && t > 0.0) {
                double f = sqrt(-2.0 * wl_log(t) / t);
                double gx = x1 * f, gy = x2 * f;
                double m = fabs(gx) > fabs(gy) ? fabs(gx) : fabs(gy);
                int l = (int)m;
                if (l < NQ) q[l]++;
                bx += gx;
                by += gy;
                accepted++;
            }
        }
        sx += bx;
        sy += by;
        if (b == nbatch / 2 - 1) wl_pause();
        if ((b + 1) % (nbatch / 4) == 0) printf("ep: batch %d/%d done, %llu accepted\n", b + 1, nbatch, (unsigned long long)accepted);
    }
    if (x != mulmod46(seed, powmod46(A46, 2 * pairs))) wl_fail("final LCG state disagrees with jump-ahead");

    uint64_t qsum = 0;
    for (int l = 0; l < NQ; l++) qsum += q[l];
    if (qsum != accepted) wl_fail("annulus counts %llu != accepted %llu", (unsigned long long)qsum, (unsigned long long)accepted);
    double p = 0.7853981633974483, frac = (double)accepted / (double)pairs;
    if (fabs(frac - p) > 6.0 * sqrt(p * (1 - p) / (double)pairs)) wl_fail("acceptance %.6f far from pi/4", frac);
    double tol = 6.0 * sqrt((double)accepted);
    if (fabs(sx) > tol || fabs(sy) > tol) wl_fail("Gaussian sums %g %g exceed %g", sx, sy, tol);
    for (int l = 0; l + 1 < 4; l++)
        if (q[l] < q[l + 1]) wl_fail("annulus %d count below annulus %d", l, l + 1);

    uint64_t h = WL_FNV_OFFSET;
    for (int l = 0; l < NQ; l++) {
        printf("ep: q[%d] = %llu\n", l, (unsigned long long)q[l]);
        h = wl_hash_u64(h, q[l]);
    }
    printf("ep: sx = %.15e sy = %.15e\n", sx, sy);
    h = wl_hash_f64(wl_hash_f64(h, sx), sy);
    h = wl_hash_u64(h, accepted);
    return wl_finish(h);
}
