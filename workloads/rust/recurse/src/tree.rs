//! A fold over an implicit complete binary tree through a function table.
//!
//! Node `id` has children `2 id` and `2 id + 1`; leaves hash their id and an
//! inner node combines its children with `COMBINE[id % 4]`, an indirect call.
//! The recursive fold is checked against an iterative bottom-up one.

fn mix(mut v: u64) -> u64 {
    v ^= v >> 31;
    v = v.wrapping_mul(0x7fb5_d329_728e_a185);
    v ^= v >> 27;
    v = v.wrapping_mul(0x81da_def4_bc2d_d44d);
    v ^ (v >> 33)
}

fn add_rot(a: u64, b: u64, id: u64) -> u64 {
    a.wrapping_add(b.rotate_left((id % 63) as u32 + 1))
}
fn xor_mul(a: u64, b: u64, id: u64) -> u64 {
    (a ^ b).wrapping_mul(id | 1)
}
fn sub_mix(a: u64, b: u64, id: u64) -> u64 {
    mix(a.wrapping_sub(b) ^ id)
}
fn max_min(a: u64, b: u64, id: u64) -> u64 {
    a.max(b).wrapping_sub(a.min(b)).wrapping_add(id)
}

/// The combiner table; indexed by `id % 4`.
const COMBINE: [fn(u64, u64, u64) -> u64; 4] = [add_rot, xor_mul, sub_mix, max_min];

fn leaf(id: u64, seed: u64) -> u64 {
    mix(id ^ seed)
}

/// Recursive fold of the subtree rooted at `id` with `depth` levels below it.
pub fn fold_recursive(id: u64, depth: u32, seed: u64) -> u64 {
    if depth == 0 {
        return leaf(id, seed);
    }
    let a = fold_recursive(2 * id, depth - 1, seed);
    let b = fold_recursive(2 * id + 1, depth - 1, seed);
    COMBINE[(id % 4) as usize](a, b, id)
}

/// The same fold level by level with an explicit array.
pub fn fold_iterative(depth: u32, seed: u64) -> u64 {
    let first = 1u64 << depth;
    let mut level: Vec<u64> = (first..2 * first).map(|id| leaf(id, seed)).collect();
    let mut base = first;
    while base > 1 {
        base /= 2;
        level = level
            .chunks_exact(2)
            .zip(base..)
            .map(|(pair, id)| COMBINE[(id % 4) as usize](pair[0], pair[1], id))
            .collect();
    }
    level[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_agree_and_match_a_hand_computed_small_tree() {
        let seed = 99;
        // The root (id 1) combines with COMBINE[1] = xor_mul.
        let want = xor_mul(leaf(2, seed), leaf(3, seed), 1);
        assert_eq!(fold_recursive(1, 1, seed), want);
        assert_eq!(fold_iterative(1, seed), want);
        for depth in 0..12 {
            assert_eq!(fold_recursive(1, depth, seed), fold_iterative(depth, seed));
        }
        assert_ne!(fold_iterative(5, 1), fold_iterative(5, 2));
    }
}
