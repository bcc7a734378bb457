//! Float comparisons written the way Cranelift recognises a minimum.
//!
//! `x < y ? x : y` is one `minsd` on x86-64 when Cranelift sees it as
//! `select(fcmp lt x y, x, y)`, and likewise for the maximum. Written as
//! `y > x ? x : y`, the same value, it gets a compare and a branch round a
//! register move, and the branch follows the data. Which of the two forms
//! `wasm-opt` leaves depends on the code it is given, so the same loop can
//! come out either way: `kmeans`' nearest-centroid loop ran 35 % slower
//! when trimmed calls (`loop_io.rs`) changed its function and the `f64.lt`
//! came out as an `f64.gt` (docs/prepare.md, "Comparisons turned round").
//!
//! So after the last `wasm-opt` run, every float `gt`/`ge` of two
//! `local.get`s that a `select` takes as its condition (directly, or
//! through a `local.tee`) becomes `lt`/`le` with the two operands swapped.
//! `a > b` is `b < a` for every pair, NaN included (both are false), so
//! the result is exact. The rewrite swaps two byte ranges and changes one
//! opcode in place, so no length or offset in the module changes.
//!
//! Only those: a comparison a branch takes compiles to the same compare
//! and jump either way round, and leaving everything else alone keeps the
//! rewrite as small as the one pattern needs.

use wasmparser::{Operator, Parser, Payload};

use crate::pipeline::PrepareError;

/// Turn round the float `gt`/`ge` comparisons of two locals in `wasm` that
/// a `select` takes.
/// Returns how many changed.
pub(crate) fn turn_compares(wasm: &mut [u8]) -> Result<usize, PrepareError> {
    let mut edits = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        let Payload::CodeSectionEntry(body) = payload.map_err(PrepareError::OutputInvalid)? else {
            continue;
        };
        let mut ops = body
            .get_operators_reader()
            .map_err(PrepareError::OutputInvalid)?;
        // The operators read so far, with their byte ranges; a comparison
        // is turned round once the `select` that takes it has been read.
        let mut window: Vec<(Operator, usize, usize)> = Vec::new();
        while !ops.eof() {
            let start = ops.original_position();
            let op = ops.read().map_err(PrepareError::OutputInvalid)?;
            let end = ops.original_position();
            let is_select = matches!(op, Operator::Select | Operator::TypedSelect { .. });
            window.push((op, start, end));
            if window.len() > 5 {
                window.remove(0);
            }
            if is_select {
                if let Some(edit) = select_of_compare(&window) {
                    edits.push(edit);
                }
            }
        }
    }
    for edit in &edits {
        edit.apply(wasm);
    }
    Ok(edits.len())
}

/// The comparison to turn round when `window` ends in
/// `local.get; local.get; gt/ge; [local.tee;] select`.
fn select_of_compare(window: &[(Operator, usize, usize)]) -> Option<Edit> {
    let n = window.len();
    let tee = n >= 2 && matches!(window[n - 2].0, Operator::LocalTee { .. });
    let at = n.checked_sub(if tee { 5 } else { 4 })?;
    let [(a, a0, a1), (b, b0, b1), (cmp, c0, _)] = &window[at..at + 3] else {
        return None;
    };
    let both_locals =
        matches!(a, Operator::LocalGet { .. }) && matches!(b, Operator::LocalGet { .. });
    Some(Edit {
        left: (*a0, *a1),
        right: (*b0, *b1),
        opcode: *c0,
        flipped: turned(cmp).filter(|_| both_locals)?,
    })
}

/// One comparison to turn round: operand ranges, where its opcode is, and
/// the opcode it becomes.
struct Edit {
    left: (usize, usize),
    right: (usize, usize),
    opcode: usize,
    flipped: u8,
}

impl Edit {
    fn apply(&self, wasm: &mut [u8]) {
        let (l0, l1) = self.left;
        let (r0, r1) = self.right;
        debug_assert!(l1 == r0 && r1 == self.opcode);
        let mut swapped = wasm[r0..r1].to_vec();
        swapped.extend_from_slice(&wasm[l0..l1]);
        wasm[l0..r1].copy_from_slice(&swapped);
        wasm[self.opcode] = self.flipped;
    }
}

/// The opcode byte of the comparison `op` turned round, if it is one to turn.
fn turned(op: &Operator) -> Option<u8> {
    match op {
        Operator::F32Gt => Some(0x5d), // f32.lt
        Operator::F32Ge => Some(0x5f), // f32.le
        Operator::F64Gt => Some(0x63), // f64.lt
        Operator::F64Ge => Some(0x65), // f64.le
        _ => None,
    }
}

#[cfg(test)]
#[path = "compares_tests.rs"]
pub(crate) mod tests;
