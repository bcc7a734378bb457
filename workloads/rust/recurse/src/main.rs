//! recurse - deep recursion and indirect calls.
//!
//! roam unwinds the whole call stack into linear memory at a checkpoint, so
//! this workload makes that stack deep (thousands of frames) and full of
//! indirect calls. Each round runs three recursive kernels, each verified
//! against an independent non-recursive computation:
//!
//! * a recursive-descent evaluator over generated, deeply nested arithmetic
//!   expressions (checked by an explicit-stack shunting-yard evaluator);
//! * Ackermann's function A(2, n) and A(3, n) (checked by closed forms);
//! * a tree fold whose node combiners come from a table of function
//!   pointers (checked by an iterative bottom-up fold).

mod expr;
mod tree;

use common::{pause, Checksum, Rng, Size, Verifier};
use std::process::ExitCode;

/// Ackermann-Peter function; A(3, n) recurses about 2^(n+3) frames deep.
fn ackermann(m: u64, n: u64) -> u64 {
    if m == 0 {
        n + 1
    } else if n == 0 {
        ackermann(m - 1, 1)
    } else {
        ackermann(m - 1, ackermann(m, n - 1))
    }
}

struct Params {
    rounds: u32,
    exprs: u32,
    nesting: u32,
    ack_n: u64,
    tree_depth: u32,
}

fn main() -> ExitCode {
    let size = Size::from_args("recurse");
    let p = size.pick(
        Params {
            rounds: 2,
            exprs: 4,
            nesting: 300,
            ack_n: 6,
            tree_depth: 12,
        },
        Params {
            rounds: 60,
            exprs: 40,
            nesting: 700,
            ack_n: 8,
            tree_depth: 20,
        },
        Params {
            rounds: 250,
            exprs: 50,
            nesting: 800,
            ack_n: 8,
            tree_depth: 21,
        },
    );
    println!(
        "recurse: {} rounds; {} expressions nested {} deep; A(3, {}); tree depth {}",
        p.rounds, p.exprs, p.nesting, p.ack_n, p.tree_depth
    );
    let mut v = Verifier::default();
    let mut sum = Checksum::default();
    let mut rng = Rng::new(1_414_213_562);
    for round in 0..p.rounds {
        let mut expr_hash = Checksum::default();
        let mut chars = 0usize;
        for e in 0..p.exprs {
            let text = expr::generate(&mut rng, p.nesting);
            chars += text.len();
            let recursive = expr::eval_recursive(text.as_bytes());
            let iterative = expr::eval_iterative(text.as_bytes());
            v.check(recursive == Some(iterative), || {
                format!("round {round} expression {e}: recursive {recursive:?} vs iterative {iterative}")
            });
            expr_hash.u64(iterative);
        }
        let n = p.ack_n + u64::from(round % 2);
        let a3 = ackermann(3, n);
        let a2 = ackermann(2, 1000 + u64::from(round));
        v.check(a3 == (1u64 << (n + 3)) - 3, || format!("A(3, {n}) = {a3}"));
        v.check(a2 == 2 * (1000 + u64::from(round)) + 3, || {
            format!("A(2, n) = {a2}")
        });
        let seed = rng.next_u64();
        let folded = tree::fold_recursive(1, p.tree_depth, seed);
        let reference = tree::fold_iterative(p.tree_depth, seed);
        v.check(folded == reference, || {
            format!("round {round}: tree fold {folded:x} vs iterative {reference:x}")
        });
        sum.u64(expr_hash.value());
        sum.u64(a3);
        sum.u64(a2);
        sum.u64(folded);
        if round < 2 || (round + 1) % 25 == 0 {
            println!(
            "recurse: round {round}: {chars} expression bytes, exprs {:016x}, A(3, {n}) = {a3}, tree {folded:016x}",
            expr_hash.value()
        );
        }
        if round + 1 == p.rounds / 2 {
            pause();
        }
    }
    v.finish(sum)
}
