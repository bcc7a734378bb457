//! Large `memory.fill` and `memory.copy` split into chunks, with a
//! migration point between chunks.
//!
//! Why: one bulk-memory instruction can run for milliseconds without
//! passing a point. `calloc` in wasi-libc clears its block with one
//! `memory.fill`; on memory just grown, every page of it faults in first.
//! `kmeans` at size M clears 4 MiB that way twice per run, and a
//! checkpoint requested just before took 2.0 ms to be answered, twice
//! the T3 bound, where its p99 over 2156 requests was 23 µs. A
//! `memory.copy` in `realloc` of a large vector is the same.
//!
//! How: an instruction whose length is not a constant of at most
//! [`CHUNK`] bytes becomes
//!
//! ```wasm
//! local.set $n  local.set $v  local.set $d     ;; its operands
//! local.get $n  i32.const CHUNK  i32.gt_u
//! if   (call $roam_bulk_fill (local.get $d) (local.get $v) (local.get $n))
//! else (memory.fill (local.get $d) (local.get $v) (local.get $n))
//! end
//! ```
//!
//! so a short one runs as before, inline. The helper does the work in
//! chunks of [`CHUNK`] bytes in a loop, and that loop gets its point like
//! any other loop of the program (it calls nothing, so it is hoisted,
//! `hoist.rs`). A chunk of 64 KiB takes well under 50 µs even when every
//! page faults.
//!
//! Semantics are kept exactly:
//! - An instruction that would trap because it reaches past the end of
//!   memory must trap before writing anything. The helper checks the
//!   bounds first and, if they fail, runs the instruction whole, which
//!   traps as before.
//! - `memory.copy` works as if through a temporary buffer, so overlapping
//!   ranges are allowed. The helper copies forwards when the destination
//!   starts at or below the source, and backwards from the end otherwise, so
//!   no chunk reads bytes an earlier chunk wrote.
//!
//! The cost: a function that holds such an instruction now calls a helper
//! that can unwind, so Asyncify instruments it. In the suite these are
//! `calloc` and `realloc`, which reach a point through `malloc`'s loops
//! anyway, and some of Rust's formatting and I/O code, which is not hot.
//! The C workloads are built without bulk memory and have none. At size M
//! the three Rust workloads ran as fast as without chunks.
//!
//! Memories are 32-bit: `validate.rs` refuses memory64.

use std::collections::BTreeMap;

use walrus::ir::{BinaryOp, Instr, InstrLocId, InstrSeqId, UnaryOp, Value};
use walrus::{FunctionBuilder, FunctionId, InstrSeqBuilder, LocalId, MemoryId, Module, ValType};

use crate::outline::children;

/// Bytes per chunk, and the largest constant length left inline.
pub(crate) const CHUNK: i32 = 1 << 16;

/// Which helper an instruction needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Fill(MemoryId),
    Copy { dst: MemoryId, src: MemoryId },
}

/// Split every large or unknown-length `memory.fill` and `memory.copy` of
/// the module's local functions; returns how many instructions changed.
pub(crate) fn chunk_bulk(module: &mut Module) -> u32 {
    let funcs: Vec<FunctionId> = module.funcs.iter_local().map(|(id, _)| id).collect();
    let mut helpers: BTreeMap<Kind, FunctionId> = BTreeMap::new();
    let mut changed = 0;
    for id in funcs {
        let walrus::FunctionKind::Local(func) = &module.funcs.get(id).kind else {
            continue;
        };
        let sites = sites(func);
        if sites.is_empty() {
            continue;
        }
        for (_, _, kind) in &sites {
            if !helpers.contains_key(kind) {
                let h = helper(module, *kind);
                helpers.insert(*kind, h);
            }
        }
        let ops = [(); 3].map(|_| module.locals.add(ValType::I32));
        let walrus::FunctionKind::Local(func) = &mut module.funcs.get_mut(id).kind else {
            continue;
        };
        // From the last site of each sequence back, so earlier indices hold.
        for (seq, index, kind) in sites.into_iter().rev() {
            split_site(func, (seq, index), helpers[&kind], ops);
            changed += 1;
        }
    }
    changed
}

/// The bulk instructions of `func` to split, in order within each sequence.
fn sites(func: &walrus::LocalFunction) -> Vec<(InstrSeqId, usize, Kind)> {
    let mut out = Vec::new();
    let mut seqs = vec![func.entry_block()];
    while let Some(seq) = seqs.pop() {
        let instrs = &func.block(seq).instrs;
        for (i, (instr, _)) in instrs.iter().enumerate() {
            seqs.extend(children(instr));
            let kind = match instr {
                Instr::MemoryFill(f) => Kind::Fill(f.memory),
                Instr::MemoryCopy(c) => Kind::Copy {
                    dst: c.dst,
                    src: c.src,
                },
                _ => continue,
            };
            let short = i > 0
                && matches!(
                    instrs[i - 1].0,
                    Instr::Const(walrus::ir::Const { value: Value::I32(n) }) if (0..=CHUNK).contains(&n)
                );
            if !short {
                out.push((seq, i, kind));
            }
        }
    }
    out.sort_by_key(|(seq, i, _)| (*seq, *i));
    out
}

/// Replace the instruction at `at` by its test of length and the two arms.
fn split_site(
    func: &mut walrus::LocalFunction,
    at: (InstrSeqId, usize),
    helper: FunctionId,
    [d, s, n]: [LocalId; 3],
) {
    let original = func.block(at.0).instrs[at.1].0.clone();
    let builder = func.builder_mut();
    let mut big = builder.dangling_instr_seq(None);
    big.local_get(d).local_get(s).local_get(n).call(helper);
    let big = big.id();
    let mut small = builder.dangling_instr_seq(None);
    small.local_get(d).local_get(s).local_get(n).instr(original);
    let small = small.id();
    let loc = InstrLocId::default();
    let mut with: Vec<(Instr, InstrLocId)> = [n, s, d]
        .into_iter()
        .map(|l| (walrus::ir::LocalSet { local: l }.into(), loc))
        .collect();
    with.extend(
        [
            walrus::ir::LocalGet { local: n }.into(),
            walrus::ir::Const {
                value: Value::I32(CHUNK),
            }
            .into(),
            walrus::ir::Binop {
                op: BinaryOp::I32GtU,
            }
            .into(),
            walrus::ir::IfElse {
                consequent: big,
                alternative: small,
            }
            .into(),
        ]
        .into_iter()
        .map(|i: Instr| (i, loc)),
    );
    func.block_mut(at.0).instrs.splice(at.1..=at.1, with);
}

/// `roam_bulk_fill_<m>` or `roam_bulk_copy_<dst>_<src>`: the instruction
/// in chunks of [`CHUNK`] bytes.
fn helper(module: &mut Module, kind: Kind) -> FunctionId {
    let [d, s, n] = [(); 3].map(|_| module.locals.add(ValType::I32));
    let mut fb = FunctionBuilder::new(&mut module.types, &[ValType::I32; 3], &[]);
    let mut body = fb.func_body();
    let name = match kind {
        Kind::Fill(mem) => {
            out_of_bounds(&mut body, mem, d, n);
            body.if_else(
                None,
                |t| {
                    t.local_get(d).local_get(s).local_get(n).memory_fill(mem);
                    t.return_();
                },
                |_| {},
            );
            chunks(&mut body, n, |b| {
                b.local_get(d)
                    .local_get(s)
                    .i32_const(CHUNK)
                    .memory_fill(mem);
                advance(b, d);
            });
            body.local_get(d).local_get(s).local_get(n).memory_fill(mem);
            format!("roam_bulk_fill_{}", mem.index())
        }
        Kind::Copy { dst, src } => {
            out_of_bounds(&mut body, dst, d, n);
            out_of_bounds(&mut body, src, s, n);
            body.binop(BinaryOp::I32Or);
            body.if_else(
                None,
                |t| {
                    t.local_get(d).local_get(s).local_get(n);
                    t.memory_copy(src, dst).return_();
                },
                |_| {},
            );
            // Forwards unless the destination starts above the source:
            // then a forward chunk could overwrite bytes that a later chunk
            // still has to read, so the chunks go from the end back.
            body.local_get(d).local_get(s).binop(BinaryOp::I32GtU);
            body.if_else(
                None,
                |back| {
                    chunks(back, n, |b| {
                        b.local_get(d).local_get(n).binop(BinaryOp::I32Add);
                        b.local_get(s).local_get(n).binop(BinaryOp::I32Add);
                        b.i32_const(CHUNK).memory_copy(src, dst);
                    });
                },
                |fwd| {
                    chunks(fwd, n, |b| {
                        b.local_get(d).local_get(s).i32_const(CHUNK);
                        b.memory_copy(src, dst);
                        advance(b, d);
                        advance(b, s);
                    });
                },
            );
            body.local_get(d)
                .local_get(s)
                .local_get(n)
                .memory_copy(src, dst);
            format!("roam_bulk_copy_{}_{}", dst.index(), src.index())
        }
    };
    fb.name(name);
    fb.finish(vec![d, s, n], &mut module.funcs)
}

/// Pushes whether `[addr, addr + n)` reaches past the end of `mem`
/// (computed in 64 bits, so it cannot wrap).
fn out_of_bounds(b: &mut InstrSeqBuilder, mem: MemoryId, addr: LocalId, n: LocalId) {
    b.local_get(addr).unop(UnaryOp::I64ExtendUI32);
    b.local_get(n).unop(UnaryOp::I64ExtendUI32);
    b.binop(BinaryOp::I64Add);
    b.memory_size(mem).unop(UnaryOp::I64ExtendUI32);
    b.i64_const(16).binop(BinaryOp::I64Shl);
    b.binop(BinaryOp::I64GtU);
}

/// While `n` > [`CHUNK`]: take [`CHUNK`] off `n` and run `one` (which
/// does one chunk). The loop gets its migration point later, as every
/// loop does.
fn chunks(b: &mut InstrSeqBuilder, n: LocalId, one: impl FnOnce(&mut InstrSeqBuilder)) {
    b.block(None, |done| {
        let out = done.id();
        done.loop_(None, |l| {
            let again = l.id();
            l.local_get(n).i32_const(CHUNK).binop(BinaryOp::I32LeU);
            l.br_if(out);
            l.local_get(n).i32_const(CHUNK).binop(BinaryOp::I32Sub);
            l.local_set(n);
            one(l);
            l.br(again);
        });
    });
}

/// `p += CHUNK`.
fn advance(b: &mut InstrSeqBuilder, p: LocalId) {
    b.local_get(p)
        .i32_const(CHUNK)
        .binop(BinaryOp::I32Add)
        .local_set(p);
}

#[cfg(test)]
#[path = "bulk_tests.rs"]
pub(crate) mod tests;
