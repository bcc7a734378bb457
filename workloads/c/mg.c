/*
 * mg - geometric multigrid, modelled on NAS Parallel Benchmarks MG.
 *
 * Solves the 3-D Poisson problem -lap(u) = f on the unit cube (zero Dirichlet
 * boundary, 7-point stencil) for right-hand sides made of +1/-1 point charges,
 * with V-cycles: red-black Gauss-Seidel smoothing, full-weighting restriction
 * and trilinear prolongation down to a single interior point. Verifies that
 * every V-cycle contracts the residual and that the final residual is small.
 */
#include "common.h"
#include <math.h>

typedef struct {
    int n; /* intervals per dimension; (n + 1)^3 points including the boundary */
    double h2, *u, *f, *r;
} level;

#define IDX(l, i, j, k) ((((size_t)(i) * ((l)->n + 1)) + (size_t)(j)) * ((l)->n + 1) + (size_t)(k))

static void smooth(level *l, int sweeps) {
    int n = l->n;
    for (int s = 0; s < sweeps; s++)
        for (int color = 0; color < 2; color++)
            for (int i = 1; i < n; i++)
                for (int j = 1; j < n; j++)
                    for (int k = 1 + ((i + j + color) & 1); k < n; k += 2) {
                        size_t c = IDX(l, i, j, k), sj = (size_t)(n + 1), si = sj * sj;
                        double nb = l->u[c - si] + l->u[c + si] + l->u[c - sj] + l->u[c + sj] + l->u[c - 1] + l->u[c + 1];
                        l->u[c] = (l->h2 * l->f[c] + nb) * (1.0 / 6.0);
                    }
}

/* r = f - A u; returns ||r||_2 over the interior. */
static double residual(level *l) {
    int n = l->n;
    size_t sj = (size_t)(n + 1), si = sj * sj;
    double inv = 1.0 / l->h2, sum = 0.0;
    for (int i = 1; i < n; i++)
        for (int j = 1; j < n; j++)
            for (int k = 1; k < n; k++) {
                size_t c = IDX(l, i, j, k);
                double nb = l->u[c - si] + l->u[c + si] + l->u[c - sj] + l->u[c + sj] + l->u[c - 1] + l->u[c + 1];
                double r = l->f[c] - (6.0 * l->u[c] - nb) * inv;
                l->r[c] = r;
                sum += r * r;
            }
    return sqrt(sum);
}

static void restrict_to(const level *fine, level *coarse) {
    static const double w[3] = { 0.25, 0.5, 0.25 };
    int n = coarse->n;
    for (int I = 1; I < n; I++)
        for (int J = 1; J < n; J++)
            for (int K = 1; K < n; K++) {
                double s = 0.0;
                for (int a = -1; a <= 1; a++)
                    for (int b = -1; b <= 1; b++)
                        for (int c = -1; c <= 1; c++)
                            s += w[a + 1] * w[b + 1] * w[c + 1] * fine->r[IDX(fine, 2 * I + a, 2 * J + b, 2 * K + c)];
                coarse->f[IDX(coarse, I, J, K)] = s;
                coarse->u[IDX(coarse, I, J, K)] = 0.0;
            }
}

static void prolong_add(level *fine, const level *coarse) {
    int n = fine->n;
    for (int i = 1; i < n; i++)
        for (int j = 1; j < n; j++)
            for (int k = 1; k < n; k++) {
                int i0 = i >> 1, i1 = (i + 1) >> 1, j0 = j >> 1, j1 = (j + 1) >> 1, k0 = k >> 1, k1 = (k + 1) >> 1;
                const double *cu = coarse->u;
                double s = cu[IDX(coarse, i0, j0, k0)] + cu[IDX(coarse, i0, j0, k1)] + cu[IDX(coarse, i0, j1, k0)] +
                           cu[IDX(coarse, i0, j1, k1)] + cu[IDX(coarse, i1, j0, k0)] + cu[IDX(coarse, i1, j0, k1)] +
                           cu[IDX(coarse, i1, j1, k0)] + cu[IDX(coarse, i1, j1, k1)];
                fine->u[IDX(fine, i, j, k)] += 0.125 * s;
            }
}

static void vcycle(level *lv, int depth, int nlev) {
    level *l = &lv[depth];
    if (depth == nlev - 1) { /* n == 2: one interior point, solve exactly */
        l->u[IDX(l, 1, 1, 1)] = l->h2 * l->f[IDX(l, 1, 1, 1)] / 6.0;
        return;
    }
    smooth(l, 2);
    residual(l);
    restrict_to(l, &lv[depth + 1]);
    vcycle(lv, depth + 1, nlev);
    prolong_add(l, &lv[depth + 1]);
    smooth(l, 2);
}

int main(int argc, char **argv) {
    enum wl_size size = wl_parse_size(argc, argv, "mg");
    static const int log2_n[] = { 5, 7, 7 };
    static const int solves_by_size[] = { 2, 2, 24 };
    const int solves = solves_by_size[size], cycles = 8, charges = 20;
    int nlev = log2_n[size];
    level lv[16];
    for (int d = 0; d < nlev; d++) {
        int n = 1 << (log2_n[size] - d);
        size_t pts = (size_t)(n + 1) * (n + 1) * (n + 1);
        lv[d].n = n;
        lv[d].h2 = 1.0 / ((double)n * n);
        lv[d].u = calloc(pts, sizeof(double));
        lv[d].f = calloc(pts, sizeof(double));
        lv[d].r = calloc(pts, sizeof(double));
        if (!lv[d].u || !lv[d].f || !lv[d].r) {
            fprintf(stderr, "mg: out of memory\n");
            return 1;
        }
    }
    level *top = &lv[0];
    int n = top->n;
    size_t pts = (size_t)(n + 1) * (n + 1) * (n + 1);
    printf("mg: %d^3 grid, %d levels, %d solves x %d V-cycles\n", n, nlev, solves, cycles);
    wl_rng rng = wl_rng_new(2718281828u);
    uint64_t h = WL_FNV_OFFSET;
    for (int s = 0; s < solves; s++) {
        memset(top->u, 0, pts * sizeof(double));
        memset(top->f, 0, pts * sizeof(double));
        for (int c = 0; c < charges; c++) {
            int i = 1 + (int)wl_below(&rng, (uint32_t)n - 1), j = 1 + (int)wl_below(&rng, (uint32_t)n - 1);
            int k = 1 + (int)wl_below(&rng, (uint32_t)n - 1);
            top->f[IDX(top, i, j, k)] += (c & 1) ? -1.0 : 1.0;
        }
        double r0 = residual(top), prev = r0, r = r0;
        for (int c = 0; c < cycles; c++) {
            vcycle(lv, 0, nlev);
            r = residual(top);
            if (c < 5 && !(r <= 0.35 * prev)) wl_fail("solve %d cycle %d: residual %.3e did not contract from %.3e", s, c, r, prev);
            prev = r;
            h = wl_hash_f64(h, r);
        }
        if (!(r <= 1e-6 * r0)) wl_fail("solve %d: final residual %.3e vs initial %.3e", s, r, r0);
        double usum = 0.0;
        for (size_t p = 0; p < pts; p += 7) usum += top->u[p];
        h = wl_hash_f64(h, usum);
        printf("mg: solve %d  ||r0|| = %.6e  ||r|| = %.6e  sample sum(u) = %.12e\n", s, r0, r, usum);
        if (s == solves / 2 - 1) wl_pause();
    }
    for (size_t p = 0; p < pts; p++) h = wl_hash_f64(h, top->u[p]);
    return wl_finish(h);
}
