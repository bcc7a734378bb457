//! kmeans - Lloyd's k-means clustering, modelled on Phoenix `kmeans`.
//!
//! Points are drawn around hidden centres; the first k points seed the
//! centroids and a fixed number of Lloyd iterations (assign to the nearest
//! centroid, move centroids to the mean of their members) follows. Checks:
//! the objective never increases, cluster sizes add up, every centroid is the
//! mean of its members and, at the end, fewer than 1% of the points would
//! still change cluster.

use common::{pause, Checksum, Rng, Size, Verifier};
use std::process::ExitCode;

struct Params {
    n: usize,
    dim: usize,
    k: usize,
    iters: usize,
}

fn nearest(p: &[f64], centroids: &[f64], dim: usize) -> (usize, f64) {
    let mut best = (0, f64::INFINITY);
    for (c, cen) in centroids.chunks_exact(dim).enumerate() {
        let d: f64 = p.iter().zip(cen).map(|(a, b)| (a - b) * (a - b)).sum();
        if d < best.1 {
            best = (c, d);
        }
    }
    best
}

/// Assigns every point; returns the objective (sum of squared distances).
fn assign(points: &[f64], centroids: &[f64], dim: usize, member: &mut [u32]) -> f64 {
    let mut sse = 0.0;
    for (p, m) in points.chunks_exact(dim).zip(member.iter_mut()) {
        let (c, d) = nearest(p, centroids, dim);
        *m = c as u32;
        sse += d;
    }
    sse
}

/// Moves every non-empty cluster's centroid to its mean; returns cluster sizes.
fn update(points: &[f64], member: &[u32], centroids: &mut [f64], dim: usize) -> Vec<u64> {
    let k = centroids.len() / dim;
    let mut sums = vec![0.0; k * dim];
    let mut counts = vec![0u64; k];
    for (p, &m) in points.chunks_exact(dim).zip(member) {
        let m = m as usize;
        counts[m] += 1;
        for (s, x) in sums[m * dim..(m + 1) * dim].iter_mut().zip(p) {
            *s += x;
        }
    }
    for c in 0..k {
        if counts[c] > 0 {
            for d in 0..dim {
                centroids[c * dim + d] = sums[c * dim + d] / counts[c] as f64;
            }
        }
    }
    counts
}

fn main() -> ExitCode {
    let size = Size::from_args("kmeans");
    let prm = size.pick(
        Params {
            n: 20_000,
            dim: 4,
            k: 8,
            iters: 10,
        },
        Params {
            n: 1_000_000,
            dim: 8,
            k: 16,
            iters: 16,
        },
        Params {
            n: 2_500_000,
            dim: 8,
            k: 32,
            iters: 30,
        },
    );
    let (n, dim, k) = (prm.n, prm.dim, prm.k);
    let mut rng = Rng::new(577_215_664);
    let hidden: Vec<f64> = (0..k * dim).map(|_| rng.unit() * 100.0).collect();
    let mut points = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let c = rng.below(k as u32) as usize;
        for d in 0..dim {
            let noise = (rng.unit() + rng.unit() + rng.unit() - 1.5) * 8.0;
            points.push(hidden[c * dim + d] + noise);
        }
    }
    println!(
        "kmeans: {n} points, {dim} dimensions, {k} clusters, {} iterations",
        prm.iters
    );

    let mut v = Verifier::default();
    let mut sum = Checksum::default();
    let mut centroids = points[..k * dim].to_vec();
    let mut member = vec![0u32; n];
    let mut prev = f64::INFINITY;
    let mut counts = Vec::new();
    for it in 0..prm.iters {
        let sse = assign(&points, &centroids, dim, &mut member);
        v.check(sse <= prev * (1.0 + 1e-12), || {
            format!("iteration {it}: objective rose from {prev} to {sse}")
        });
        prev = sse;
        counts = update(&points, &member, &mut centroids, dim);
        sum.f64(sse);
        if it == prm.iters / 2 {
            pause();
        }
        if it % 4 == 0 || it + 1 == prm.iters {
            println!("kmeans: iteration {it:2}  objective {sse:.10e}");
        }
    }
    v.check(counts.iter().sum::<u64>() == n as u64, || {
        "cluster sizes do not add up to the number of points".into()
    });
    // Each centroid must be the mean of its members (same summation order, so exact).
    let mut again = centroids.clone();
    update(&points, &member, &mut again, dim);
    v.check(again == centroids, || {
        "a centroid is not the mean of its members".into()
    });
    // One more assignment against the final centroids: Lloyd must have (nearly) converged.
    let mut final_member = vec![0u32; n];
    let final_sse = assign(&points, &centroids, dim, &mut final_member);
    v.check(final_sse <= prev * (1.0 + 1e-12), || {
        "final objective rose".into()
    });
    let changed = member
        .iter()
        .zip(&final_member)
        .filter(|(a, b)| a != b)
        .count();
    v.check(changed * 100 < n, || {
        format!("{changed} of {n} points still move: not converged")
    });
    println!("kmeans: final objective {final_sse:.10e}, {changed} points still moving");
    println!("kmeans: cluster sizes {counts:?}");
    for c in &centroids {
        sum.f64(*c);
    }
    for c in &counts {
        sum.u64(*c);
    }
    sum.u64(changed as u64);
    v.finish(sum)
}
