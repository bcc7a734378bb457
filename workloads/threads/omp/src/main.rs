//! threads-omp - an OpenMP-style Jacobi stencil: parallel-for + reduction +
//! barrier, written with `std::thread` and `std::sync::Barrier`.
//!
//! A 2-D heat grid (n x n interior cells plus a fixed boundary) takes a fixed
//! number of Jacobi steps. The rows are partitioned into one contiguous band
//! per thread; each thread keeps its band and two halo rows. Every step:
//! the threads update their bands (the parallel for), publish their edge
//! rows and per-row sums, wait at a barrier; the barrier's leader reduces
//! the per-thread row sums in thread order (that is, in row order, as the
//! sequential loop does) and the maximum change (like `omp single`), everyone
//! copies the neighbours' edges into its halos and waits at a second
//! barrier. A cell's new value depends only on the old grid and the row sums
//! are added in row order, so the output is bit-identical for any thread
//! count. At the end the whole run is repeated sequentially and compared.

use common::{unit, Hash};
use std::process::ExitCode;
use std::sync::{Barrier, Mutex};
use std::thread;

const SEED: u64 = 0x6f6d_705f_6a61_636f;

/// Value of cell (r, c) of the (n+2) x (n+2) grid at step 0: the top edge
/// is hot, the left edge a ramp, the other edges cold, the inside random.
fn initial(n: usize, r: usize, c: usize) -> f64 {
    if r == 0 {
        1.0
    } else if r == n + 1 || c == n + 1 {
        0.0
    } else if c == 0 {
        r as f64 / (n + 1) as f64
    } else {
        unit(SEED ^ (r * (n + 2) + c) as u64)
    }
}

/// Updates the inside of one row from `rows`, that row with the rows above
/// and below it; returns the sum of the new values (left to right) and the
/// largest change.
fn update_row(rows: &[f64], out: &mut [f64]) -> (f64, f64) {
    let w = out.len();
    let (up, mid, down) = (&rows[..w], &rows[w..2 * w], &rows[2 * w..]);
    let (mut sum, mut maxd) = (0.0, 0.0);
    let cells = out[1..w - 1].iter_mut().zip(mid.windows(3));
    for ((o, m), (u, d)) in cells.zip(up[1..].iter().zip(&down[1..])) {
        let v = 0.25 * ((u + d) + (m[0] + m[2]));
        *o = v;
        sum += v;
        maxd = f64::max(maxd, (v - m[1]).abs()); // never NaN
    }
    (sum, maxd)
}

/// Per step the bits of (sum over the grid, largest change); then the final
/// grid's hash.
type Run = (Vec<[u64; 2]>, u64);

fn hash_rows(rows: &[f64], w: usize, h: &mut Hash) {
    for row in rows.chunks_exact(w) {
        row[1..w - 1].iter().for_each(|v| h.add(v.to_bits()));
    }
}

fn sequential(n: usize, steps: usize) -> Run {
    let w = n + 2;
    let mut cur: Vec<f64> = (0..w * w).map(|i| initial(n, i / w, i % w)).collect();
    let mut nxt = cur.clone();
    let mut history = Vec::with_capacity(steps);
    for _ in 0..steps {
        let (mut total, mut maxd) = (0.0, 0.0);
        for r in 1..=n {
            let (s, d) = update_row(&cur[(r - 1) * w..(r + 2) * w], &mut nxt[r * w..(r + 1) * w]);
            total += s;
            maxd = f64::max(maxd, d);
        }
        history.push([total.to_bits(), maxd.to_bits()]);
        std::mem::swap(&mut cur, &mut nxt);
    }
    let mut h = Hash::default();
    hash_rows(&cur[w..(n + 1) * w], w, &mut h);
    (history, h.value())
}

/// What the threads share: edge rows and partial results, one slot each.
struct Shared {
    edges: Vec<Mutex<(Vec<f64>, Vec<f64>)>>,
    partial: Vec<Mutex<(Vec<f64>, f64)>>,
    history: Mutex<Vec<[u64; 2]>>,
    barrier: Barrier,
}

/// Rows `r0..r1` of the grid (1-based inside rows) belong to thread `t`.
fn band(n: usize, threads: usize, t: usize) -> (usize, usize) {
    (1 + t * n / threads, 1 + (t + 1) * n / threads)
}

/// One thread's whole run; returns its band's final rows.
fn worker(sh: &Shared, n: usize, steps: usize, threads: usize, t: usize) -> Vec<f64> {
    let w = n + 2;
    let (r0, r1) = band(n, threads, t);
    let len = r1 - r0;
    // Local rows 1..=len are the band, rows 0 and len+1 the halos.
    let mut cur: Vec<f64> = (r0 - 1..=r1)
        .flat_map(|r| (0..w).map(move |c| initial(n, r, c)))
        .collect();
    let mut nxt = cur.clone();
    let mut sums = vec![0.0; len];
    for _ in 0..steps {
        let mut maxd = 0.0;
        for lr in 1..=len {
            let (s, d) = update_row(
                &cur[(lr - 1) * w..(lr + 2) * w],
                &mut nxt[lr * w..(lr + 1) * w],
            );
            sums[lr - 1] = s;
            maxd = f64::max(maxd, d);
        }
        std::mem::swap(&mut cur, &mut nxt);
        {
            let mut e = sh.edges[t].lock().unwrap();
            e.0.copy_from_slice(&cur[w..2 * w]);
            e.1.copy_from_slice(&cur[len * w..(len + 1) * w]);
            let mut p = sh.partial[t].lock().unwrap();
            p.0.copy_from_slice(&sums);
            p.1 = maxd;
        }
        if sh.barrier.wait().is_leader() {
            // The reduction, in thread order: the same additions, in the
            // same order, as the sequential loop over the rows.
            let (mut total, mut maxd) = (0.0, 0.0);
            for slot in &sh.partial {
                let p = slot.lock().unwrap();
                p.0.iter().for_each(|s| total += s);
                maxd = f64::max(maxd, p.1);
            }
            sh.history
                .lock()
                .unwrap()
                .push([total.to_bits(), maxd.to_bits()]);
        }
        if t > 0 {
            cur[..w].copy_from_slice(&sh.edges[t - 1].lock().unwrap().1);
        }
        if t + 1 < threads {
            cur[(len + 1) * w..].copy_from_slice(&sh.edges[t + 1].lock().unwrap().0);
        }
        sh.barrier.wait();
    }
    cur[w..(len + 1) * w].to_vec()
}

fn parallel(threads: usize, n: usize, steps: usize) -> Run {
    let w = n + 2;
    let sh = Shared {
        edges: (0..threads)
            .map(|_| Mutex::new((vec![0.0; w], vec![0.0; w])))
            .collect(),
        partial: (0..threads)
            .map(|t| {
                let (r0, r1) = band(n, threads, t);
                Mutex::new((vec![0.0; r1 - r0], 0.0))
            })
            .collect(),
        history: Mutex::new(Vec::with_capacity(steps)),
        barrier: Barrier::new(threads),
    };
    let bands: Vec<Vec<f64>> = thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let sh = &sh;
                s.spawn(move || worker(sh, n, steps, threads, t))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut h = Hash::default();
    bands.iter().for_each(|b| hash_rows(b, w, &mut h));
    (sh.history.into_inner().unwrap(), h.value())
}

fn main() -> ExitCode {
    let args = common::args("threads-omp");
    let (n, steps) = args.size.pick((192, 480), (384, 1200));
    let every = steps / 6;
    println!("threads-omp: n={n} steps={steps}");
    let p = parallel(args.threads, n, steps);
    for (k, &[sum, maxd]) in p.0.iter().enumerate() {
        if (k + 1) % every == 0 {
            let (sum, maxd) = (f64::from_bits(sum), f64::from_bits(maxd));
            println!("step {}: sum={sum:.10} maxdiff={maxd:.6e}", k + 1);
        }
    }
    println!("grid hash: {:016x}", p.1);
    let s = sequential(n, steps);
    if s != p {
        eprintln!("threads-omp: the sequential run differs");
    }
    common::finish(s == p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_matches_sequential_bit_for_bit() {
        let s = sequential(17, 20);
        for t in [1, 2, 3, 8] {
            assert_eq!(parallel(t, 17, 20), s);
        }
    }
}
