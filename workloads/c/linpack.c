/*
 * linpack - dense LU solve, modelled on the LINPACK benchmark (dgefa/dgesl).
 *
 * Factors a random column-major matrix with partial pivoting using column
 * axpy updates, solves A x = b for b = A * 1 and checks the normalised
 * residual ||A x - b|| / (n ||A|| ||x|| eps) and ||x - 1|| as LINPACK does.
 * The solve is repeated for several independently generated matrices.
 */
#include "common.h"
#include <math.h>

/* LU with partial pivoting in place (column-major, leading dimension n). Returns 0, or k+1 if singular at k. */
static int factor(double *a, uint32_t n, uint32_t *piv) {
    for (uint32_t k = 0; k + 1 < n; k++) {
        double *ck = &a[(size_t)k * n];
        uint32_t p = k;
        for (uint32_t i = k + 1; i < n; i++)
            if (fabs(ck[i]) > fabs(ck[p])) p = i;
        piv[k] = p;
        if (ck[p] == 0.0) return (int)k + 1;
        if (p != k) {
            double t = ck[p];
            ck[p] = ck[k];
            ck[k] = t;
        }
        double inv = -1.0 / ck[k];
        for (uint32_t i = k + 1; i < n; i++) ck[i] *= inv;
        for (uint32_t j = k + 1; j < n; j++) {
            double *cj = &a[(size_t)j * n];
            double t = cj[p];
            if (p != k) {
                cj[p] = cj[k];
                cj[k] = t;
            }
            for (uint32_t i = k + 1; i < n; i++) cj[i] += t * ck[i];
        }
    }
    piv[n - 1] = n - 1;
    return a[(size_t)(n - 1) * n + n - 1] == 0.0 ? (int)n : 0;
}

static void solve(const double *a, uint32_t n, const uint32_t *piv, double *b) {
    for (uint32_t k = 0; k + 1 < n; k++) {
        uint32_t p = piv[k];
        double t = b[p];
        if (p != k) {
            b[p] = b[k];
            b[k] = t;
        }
        for (uint32_t i = k + 1; i < n; i++) b[i] += t * a[(size_t)k * n + i];
    }
    for (uint32_t k = n; k-- > 0;) {
        b[k] /= a[(size_t)k * n + k];
        double t = -b[k];
        for (uint32_t i = 0; i < k; i++) b[i] += t * a[(size_t)k * n + i];
    }
}

int main(int argc, char **argv) {
    enum wl_size size = wl_parse_size(argc, argv, "linpack");
    static const uint32_t ns[] = { 200, 1500, 2000 };
    static const int reps_by_size[] = { 2, 3, 5 };
    const uint32_t n = ns[size];
    const int reps = reps_by_size[size];
    double *a = malloc(sizeof(double) * n * n), *lu = malloc(sizeof(double) * n * n);
    double *b = malloc(sizeof(double) * n), *x = malloc(sizeof(double) * n);
    uint32_t *piv = malloc(sizeof(uint32_t) * n);
    if (!a || !lu || !b || !x || !piv) {
        fprintf(stderr, "linpack: out of memory\n");
        return 1;
    }
    printf("linpack: n = %u, %d solves\n", n, reps);
    const double eps = 2.220446049250313e-16;
    uint64_t h = WL_FNV_OFFSET;
    for (int r = 0; r < reps; r++) {
        wl_rng rng = wl_rng_new(1732050807u + (uint64_t)r);
        for (size_t i = 0; i < (size_t)n * n; i++) a[i] = wl_unit(&rng) - 0.5;
        for (uint32_t i = 0; i < n; i++) b[i] = 0.0;
        for (uint32_t j = 0; j < n; j++)
            for (uint32_t i = 0; i < n; i++) b[i] += a[(size_t)j * n + i];
        memcpy(lu, a, sizeof(double) * n * n);
        memcpy(x, b, sizeof(double) * n);
        int sing = factor(lu, n, piv);
        if (sing) wl_fail("solve %d: matrix singular at column %d", r, sing - 1);
        solve(lu, n, piv, x);

        /* Residual r = A x - b, and the norms LINPACK reports. */
        double anorm = 0.0, xnorm = 0.0, rnorm = 0.0, err = 0.0;
        double *res = malloc(sizeof(double) * n);
        for (uint32_t i = 0; i < n; i++) res[i] = -b[i];
        for (uint32_t j = 0; j < n; j++)
            for (uint32_t i = 0; i < n; i++) res[i] += a[(size_t)j * n + i] * x[j];
        for (uint32_t i = 0; i < n; i++) {
            double row = 0.0;
            for (uint32_t j = 0; j < n; j++) row += fabs(a[(size_t)j * n + i]);
            if (row > anorm) anorm = row;
            if (fabs(res[i]) > rnorm) rnorm = fabs(res[i]);
            if (fabs(x[i]) > xnorm) xnorm = fabs(x[i]);
            if (fabs(x[i] - 1.0) > err) err = fabs(x[i] - 1.0);
        }
        free(res);
        double normed = rnorm / (n * anorm * xnorm * eps);
        printf("linpack: solve %d  norm. resid = %.6f  max |x - 1| = %.6e\n", r, normed, err);
        if (!(normed < 10.0)) wl_fail("solve %d: normalised residual %.3f >= 10", r, normed);
        if (!(err < 1e-6)) wl_fail("solve %d: solution error %.3e", r, err);
        for (uint32_t i = 0; i < n; i++) h = wl_hash_f64(h, x[i]);
        h = wl_hash_f64(h, rnorm);
        if (r == reps / 2 - 1 || reps == 1) wl_pause();
    }
    free(a), free(lu), free(b), free(x), free(piv);
    return wl_finish(h);
}
