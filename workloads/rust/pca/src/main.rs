//! pca - principal component analysis, modelled on Phoenix `pca`.
//!
//! Observations are generated (twice, from the same seed, so the data never
//! has to be stored) as a few strong latent factors plus noise. The first
//! pass computes the column means, the second accumulates the covariance
//! matrix; the leading eigenpairs then follow by power iteration with
//! deflation. Checks: the covariance is exactly symmetric, its diagonal is
//! non-negative, each eigenpair satisfies ||C v - lambda v|| <= 1e-6 lambda,
//! the eigenvectors are orthonormal and the eigenvalues descend and do not
//! exceed the trace.

use common::{pause, Checksum, Rng, Size, Verifier};
use std::process::ExitCode;

const FACTORS: usize = 6;
const COMPONENTS: usize = 4;

/// Deterministic observation generator: row `r` is the same in both passes.
struct Source {
    loadings: Vec<f64>,
    dim: usize,
}

impl Source {
    fn new(dim: usize, rng: &mut Rng) -> Source {
        let loadings = (0..FACTORS * dim)
            .map(|i| (rng.unit() - 0.5) * (FACTORS - i / dim) as f64)
            .collect();
        Source { loadings, dim }
    }

    fn row(&self, rng: &mut Rng, out: &mut [f64]) {
        for (d, o) in out.iter_mut().enumerate() {
            *o = 3.0 + (rng.unit() - 0.5) * 0.5 + d as f64 * 0.01;
        }
        for f in 0..FACTORS {
            let z = rng.unit() + rng.unit() - 1.0;
            for (o, l) in out
                .iter_mut()
                .zip(&self.loadings[f * self.dim..(f + 1) * self.dim])
            {
                *o += z * l;
            }
        }
    }
}

fn matvec(c: &[f64], x: &[f64], y: &mut [f64]) {
    let dim = x.len();
    for (i, yi) in y.iter_mut().enumerate() {
        *yi = c[i * dim..(i + 1) * dim]
            .iter()
            .zip(x)
            .map(|(a, b)| a * b)
            .sum();
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn main() -> ExitCode {
    let size = Size::from_args("pca");
    let (rows, dim) = size.pick((3_000, 48), (150_000, 160), (420_000, 256));
    let mut setup = Rng::new(662_607_015);
    let src = Source::new(dim, &mut setup);
    let seed = setup.next_u64();
    println!("pca: {rows} observations x {dim} variables, {COMPONENTS} components");

    let mut row = vec![0.0; dim];
    let mut mean = vec![0.0; dim];
    let mut rng = Rng::new(seed);
    for _ in 0..rows {
        src.row(&mut rng, &mut row);
        mean.iter_mut().zip(&row).for_each(|(m, x)| *m += x);
    }
    mean.iter_mut().for_each(|m| *m /= rows as f64);

    let mut cov = vec![0.0; dim * dim];
    let mut rng = Rng::new(seed);
    for r in 0..rows {
        src.row(&mut rng, &mut row);
        row.iter_mut().zip(&mean).for_each(|(x, m)| *x -= m);
        for i in 0..dim {
            let xi = row[i];
            for (c, xj) in cov[i * dim..(i + 1) * dim].iter_mut().zip(&row) {
                *c += xi * xj;
            }
        }
        if r == rows / 2 {
            pause();
            println!("pca: covariance half accumulated");
        }
    }
    cov.iter_mut().for_each(|c| *c /= (rows - 1) as f64);

    let mut v = Verifier::default();
    let mut sum = Checksum::default();
    let asym = (0..dim)
        .flat_map(|i| (0..dim).map(move |j| (i, j)))
        .filter(|&(i, j)| cov[i * dim + j] != cov[j * dim + i])
        .count();
    v.check(asym == 0, || {
        format!("covariance has {asym} asymmetric entries")
    });
    let trace: f64 = (0..dim).map(|i| cov[i * dim + i]).sum();
    v.check((0..dim).all(|i| cov[i * dim + i] >= 0.0), || {
        "negative variance".into()
    });

    let mut deflated = cov.clone();
    let mut vecs: Vec<Vec<f64>> = Vec::new();
    let mut vals = Vec::new();
    let mut y = vec![0.0; dim];
    for comp in 0..COMPONENTS {
        let mut x: Vec<f64> = (0..dim).map(|i| 1.0 + (i % 7) as f64 * 0.1).collect();
        let mut lambda = 0.0;
        for _ in 0..500 {
            matvec(&deflated, &x, &mut y);
            lambda = dot(&x, &y);
            let norm = dot(&y, &y).sqrt();
            x.iter_mut().zip(&y).for_each(|(a, b)| *a = b / norm);
        }
        // Residual against the original (not deflated) covariance.
        matvec(&cov, &x, &mut y);
        let res = y
            .iter()
            .zip(&x)
            .map(|(a, b)| (a - lambda * b).powi(2))
            .sum::<f64>()
            .sqrt();
        v.check(res <= 1e-6 * lambda, || {
            format!("component {comp}: residual {res:.3e} vs eigenvalue {lambda:.6e}")
        });
        for i in 0..dim {
            for j in 0..dim {
                deflated[i * dim + j] -= lambda * x[i] * x[j];
            }
        }
        println!("pca: component {comp}: eigenvalue {lambda:.10e}, residual {res:.3e}");
        sum.f64(lambda);
        x.iter().for_each(|&e| sum.f64(e));
        vals.push(lambda);
        vecs.push(x);
    }
    for a in 0..COMPONENTS {
        for b in 0..COMPONENTS {
            let d = dot(&vecs[a], &vecs[b]);
            let want = if a == b { 1.0 } else { 0.0 };
            v.check((d - want).abs() < 1e-8, || {
                format!("eigenvectors {a},{b}: dot {d:.3e}")
            });
        }
    }
    v.check(vals.windows(2).all(|w| w[0] >= w[1]), || {
        "eigenvalues not descending".into()
    });
    v.check(vals.iter().sum::<f64>() <= trace, || {
        "eigenvalues exceed the trace".into()
    });
    println!(
        "pca: trace {trace:.10e}, explained {:.6}",
        vals.iter().sum::<f64>() / trace
    );
    cov.iter().for_each(|&c| sum.f64(c));
    v.finish(sum)
}
