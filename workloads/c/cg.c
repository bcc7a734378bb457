/*
 * cg - conjugate gradient, modelled on NAS Parallel Benchmarks CG.
 *
 * Builds a random sparse symmetric, strictly diagonally dominant (hence
 * positive definite) matrix in CSR form and runs inverse power iteration:
 * each outer step solves A z = x with a fixed number of unpreconditioned CG
 * iterations, estimates zeta = shift + 1 / (x . z) and normalises z into the
 * next x. Verifies the explicit residual ||x - A z|| against the CG
 * recurrence residual, the Gershgorin bound on the eigenvalue estimate and
 * that the estimate decreases monotonically.
 */
#include "common.h"
#include <math.h>

typedef struct {
    uint32_t n;
    uint32_t *rowptr, *col;
    double *val;
} csr;

static csr build(uint32_t n, uint32_t per_row, wl_rng *rng) {
    uint32_t offd = 2 * n * per_row, nnz = offd + n;
    uint32_t *ri = malloc(sizeof(uint32_t) * offd), *cj = malloc(sizeof(uint32_t) * offd);
    double *v = malloc(sizeof(double) * offd), *diag = calloc(n, sizeof(double));
    csr a = { n, calloc(n + 1, sizeof(uint32_t)), malloc(sizeof(uint32_t) * nnz), malloc(sizeof(double) * nnz) };
    if (!ri || !cj || !v || !diag || !a.rowptr || !a.col || !a.val) {
        fprintf(stderr, "cg: out of memory\n");
        exit(1);
    }
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < per_row; k++) {
            uint32_t j = wl_below(rng, n);
            if (j == i) j = (j + 1) % n;
            double x = wl_unit(rng) - 0.5;
            ri[m] = i, cj[m] = j, v[m++] = x;
            ri[m] = j, cj[m] = i, v[m++] = x;
            diag[i] += fabs(x);
            diag[j] += fabs(x);
        }
    /* Bucket the triplets by row (duplicates are simply summed by SpMV). */
    for (uint32_t i = 0; i < n; i++) a.rowptr[i + 1] = 1;
    for (uint32_t e = 0; e < offd; e++) a.rowptr[ri[e] + 1]++;
    for (uint32_t i = 0; i < n; i++) a.rowptr[i + 1] += a.rowptr[i];
    uint32_t *fill = malloc(sizeof(uint32_t) * n);
    for (uint32_t i = 0; i < n; i++) {
        fill[i] = a.rowptr[i] + 1;
        a.col[a.rowptr[i]] = i;
        a.val[a.rowptr[i]] = diag[i] + 1.0;
    }
    for (uint32_t e = 0; e < offd; e++) {
        uint32_t p = fill[ri[e]]++;
        a.col[p] = cj[e];
        a.val[p] = v[e];
    }
    free(fill), free(ri), free(cj), free(v), free(diag);
    return a;
}

static void spmv(const csr *a, const double *x, double *y) {
    for (uint32_t i = 0; i < a->n; i++) {
        double s = 0.0;
        for (uint32_t p = a->rowptr[i]; p < a->rowptr[i + 1]; p++) s += a->val[p] * x[a->col[p]];
        y[i] = s;
    }
}

static double dot(const double *x, const double *y, uint32_t n) {
    double s = 0.0;
    for (uint32_t i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}

/* Solves a z = x approximately; returns the recurrence residual norm. */
static double cg_solve(const csr *a, const double *x, double *z, double *r, double *p, double *q, int steps) {
    uint32_t n = a->n;
    for (uint32_t i = 0; i < n; i++) z[i] = 0.0, r[i] = x[i], p[i] = x[i];
    double rho = dot(r, r, n);
    for (int s = 0; s < steps; s++) {
        spmv(a, p, q);
        double alpha = rho / dot(p, q, n);
        for (uint32_t i = 0; i < n; i++) z[i] += alpha * p[i], r[i] -= alpha * q[i];
        double rho1 = dot(r, r, n), beta = rho1 / rho;
        rho = rho1;
        for (uint32_t i = 0; i < n; i++) p[i] = r[i] + beta * p[i];
    }
    return sqrt(rho);
}

int main(int argc, char **argv) {
    enum wl_size size = wl_parse_size(argc, argv, "cg");
    static const uint32_t ns[] = { 2000, 150000, 400000 };
    static const uint32_t per_row[] = { 6, 8, 10 };
    static const int outers[] = { 8, 10, 25 };
    const uint32_t n = ns[size];
    const int outer = outers[size], steps = 25;
    const double shift = 10.0;
    wl_rng rng = wl_rng_new(1618033988);
    csr a = build(n, per_row[size], &rng);
    printf("cg: n = %u, nnz = %u, %d outer x %d CG steps\n", n, a.rowptr[n], outer, steps);

    double *x = malloc(sizeof(double) * n), *z = malloc(sizeof(double) * n), *r = malloc(sizeof(double) * n);
    double *p = malloc(sizeof(double) * n), *q = malloc(sizeof(double) * n);
    if (!x || !z || !r || !p || !q) {
        fprintf(stderr, "cg: out of memory\n");
        return 1;
    }
    for (uint32_t i = 0; i < n; i++) x[i] = 1.0 / sqrt((double)n);
    double zeta = 0.0, prev = 0.0, rnorm = 0.0, explicit_norm = 0.0, xnorm = 0.0;
    uint64_t h = WL_FNV_OFFSET;
    for (int it = 1; it <= outer; it++) {
        rnorm = cg_solve(&a, x, z, r, p, q, steps);
        spmv(&a, z, q);
        double e = 0.0;
        for (uint32_t i = 0; i < n; i++) e += (x[i] - q[i]) * (x[i] - q[i]);
        explicit_norm = sqrt(e);
        xnorm = sqrt(dot(x, x, n));
        prev = zeta;
        zeta = shift + 1.0 / dot(x, z, n);
        /* Gershgorin: every eigenvalue is >= 1; inverse iteration only lowers the estimate. */
        if (!(zeta - shift >= 1.0 - 1e-9)) wl_fail("iteration %d: eigenvalue estimate %.15f below 1", it, zeta - shift);
        if (it > 1 && !(zeta <= prev + 1e-9 * prev)) wl_fail("iteration %d: zeta rose from %.15f to %.15f", it, prev, zeta);
        double zn = 1.0 / sqrt(dot(z, z, n));
        for (uint32_t i = 0; i < n; i++) x[i] = z[i] * zn;
        h = wl_hash_f64(wl_hash_f64(h, zeta), rnorm);
        if (it == outer / 2) wl_pause();
        if (it == 1 || it % 5 == 0 || it == outer) printf("cg: iteration %3d  ||r|| = %.6e  zeta = %.13f\n", it, rnorm, zeta);
    }
    for (uint32_t i = 0; i < n; i += 1 + n / 1024) h = wl_hash_f64(h, x[i]);

    if (!(explicit_norm <= 1e-6 * xnorm)) wl_fail("explicit residual %.3e too large (||x|| = %.3e)", explicit_norm, xnorm);
    if (!(fabs(explicit_norm - rnorm) <= 1e-9 * xnorm + 1e-2 * explicit_norm))
        wl_fail("explicit residual %.6e disagrees with CG recurrence %.6e", explicit_norm, rnorm);
    return wl_finish(h);
}
