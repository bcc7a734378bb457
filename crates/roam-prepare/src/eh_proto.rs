//! Capture by Wasm exceptions: a **measurement prototype**
//! (`roam prepare --capture eh-proto`), not a way to migrate anything yet.
//!
//! Why it exists: Asyncify pays on every call, all the time, for an unwind
//! that happens rarely, and makes call-heavy programs several times slower.
//! The candidate replacement unwinds with the exception-handling proposal
//! instead, which Cranelift compiles to `try_call` with unwind tables: a
//! call that throws nothing costs no extra instruction. Its one known cost
//! is that every register counts as clobbered on the exception edge, so a
//! value the handler reads sits in a stack slot across the call. Whether
//! that is cheap on real code is what this prototype measures, before
//! anyone builds restore ("rewind copies") on top of it.
//!
//! What it does, on the module `instrument.rs` made and `wasm-opt`
//! optimised (the same points as the default, no Asyncify):
//!
//! - every call of `roam.migration_point` (a point, behind its flag test)
//!   becomes: store the locals live after it and the point's index to the
//!   capture buffer, then `throw $roam.unwind` (no payload);
//! - every call that can reach a point or a blocking import (call graph,
//!   indirect calls resolved by table and signature, `callgraph.rs`) sits
//!   in a `try_table` whose `catch_all_ref` handler stores that frame's
//!   locals live after the call and its call-site index, then `throw_ref`s.
//!   Operand-stack values of the innermost block that lie under the
//!   call's arguments are first moved to locals, and stored too;
//! - the buffer is linear memory at `roam.capture` (an exported global the
//!   host points at free memory), which each frame advances: a real store
//!   of each live value, so Cranelift must keep them for the handler.
//!
//! `--capture eh-points` does the points alone, no `try_table`: not a
//! capture at all, only the ablation that splits `eh-proto`'s cost between
//! its points and its wrapped calls.
//!
//! What it leaves out, and how that biases the measurement: restore (the
//! rewind copies), and values in *enclosing* blocks' operand stacks under a
//! call (counted in [`EhStats::outer`]; not kept live by the handler, so
//! the cost is slightly under-estimated where there are any); reference
//! values are not stored. Liveness is by local, over-approximated at
//! branches (as in `loop_io.rs`), so a handler may keep a few dead locals.
//! The output is not restorable, and `roam run` refuses it
//! (`check_prepared`).

use std::collections::{HashMap, HashSet};

use walrus::ir::{
    BinaryOp, Binop, Block, Br, BrIf, BrTable, Call, CallIndirect, Const, GlobalGet, GlobalSet,
    IfElse, Instr, InstrSeqId, InstrSeqType, LocalGet, LocalSet, LocalTee, Loop, MemArg, Store,
    StoreKind, Throw, ThrowRef, TryTable, TryTableCatch, Value,
};
use walrus::{
    ConstExpr, FunctionId, GlobalId, ImportKind, LocalFunction, LocalId, MemoryId, ModuleConfig,
    RefType, TagId, ValType,
};
use wasmparser::{Operator, Parser, ValidPayload, Validator, WasmFeatures, WasmModuleResources};

use crate::callgraph::{CallGraph, TableTargets};
use crate::instrument::add_export;
use crate::pipeline::PrepareError;
use crate::validate::SUPPORTED_FEATURES;
use crate::{ASYNC_IMPORTS, POINT_FUNC, POINT_MODULE};

/// Export name of the mutable `i32` global that holds where the next
/// captured frame is written in linear memory.
pub const CAPTURE_GLOBAL_EXPORT: &str = "roam.capture";
/// Export name of the exception tag a point throws.
pub const TAG_EXPORT: &str = "roam.unwind";

/// Features an `eh-proto` output may use: the inputs' plus exceptions.
pub(crate) const OUTPUT_FEATURES: WasmFeatures = SUPPORTED_FEATURES.union(WasmFeatures::EXCEPTIONS);

/// What the transform did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EhStats {
    /// Calls wrapped in a `try_table`.
    pub wrapped: u32,
    /// Points turned into stores and a `throw`.
    pub points: u32,
    /// Operand-stack values moved to locals around a wrapped call.
    pub moved: u32,
    /// Values in enclosing blocks' operand stacks under a wrapped call,
    /// which the handler does not store.
    pub outer: u32,
    /// Values stored by handlers and points, summed over sites.
    pub stored: u32,
}

/// What validation knows at one call, in body order.
struct AtCall {
    /// Types of the innermost frame's values under the arguments, bottom
    /// first; `None` in unreachable code or with reference values.
    below: Option<Vec<ValType>>,
    /// Values in the frames around the innermost one.
    outer: u32,
}

/// Rewrite `bytes` (a module `instrument.rs` made, optimised) as the module
/// docs say. `names`: keep the `name` section. Without `wrap` (the
/// `eh-points` ablation) only the points change.
pub(crate) fn transform(
    bytes: &[u8],
    names: bool,
    wrap: bool,
) -> Result<(Vec<u8>, EhStats), PrepareError> {
    let stacks = operand_stacks(bytes)?;
    let mut config = ModuleConfig::new();
    config
        .generate_dwarf(false)
        .generate_name_section(names)
        .generate_producers_section(true);
    let mut module = config
        .parse(bytes)
        .map_err(|e| PrepareError::Rewrite(e.into()))?;
    let import = |module: &walrus::Module, m: &str, n: &str| {
        let id = module.imports.find(m, n)?;
        match module.imports.get(id).kind {
            ImportKind::Function(f) => Some(f),
            _ => None,
        }
    };
    let point = import(&module, POINT_MODULE, POINT_FUNC);
    let blocking: HashSet<FunctionId> = ASYNC_IMPORTS
        .iter()
        .filter(|(m, n)| (*m, *n) != (POINT_MODULE, POINT_FUNC))
        .filter_map(|(m, n)| import(&module, m, n))
        .collect();
    let memory = module
        .memories
        .iter()
        .next()
        .map(|m| m.id())
        .ok_or_else(|| rewrite("eh-proto needs a linear memory for its capture buffer"))?;

    // Who can reach a point or a blocking import.
    let graph = CallGraph::new(&module);
    let tables = TableTargets::new(&module);
    let with_point: HashSet<FunctionId> = module
        .funcs
        .iter_local()
        .filter(|(_, f)| point.is_some_and(|p| calls(f).iter().any(|(_, c)| c == &Some(p))))
        .map(|(id, _)| id)
        .collect();
    let reaching = graph.reaching(|f| with_point.contains(&f) || blocking.contains(&f));
    let may_unwind = |instr: &Instr| -> bool {
        match instr {
            Instr::Call(Call { func }) => Some(*func) != point && reaching.contains(func),
            Instr::CallIndirect(CallIndirect { ty, table }) => tables
                .targets(&module, *table, *ty)
                .is_none_or(|t| t.iter().any(|f| reaching.contains(f))),
            _ => false,
        }
    };

    // Decide every site before changing anything.
    let local_ids: Vec<FunctionId> = module.funcs.iter_local().map(|(id, _)| id).collect();
    if local_ids.len() != stacks.len() {
        return Err(rewrite(
            "function count differs between walrus and wasmparser",
        ));
    }
    let mut plans = Vec::new();
    for (id, at_calls) in local_ids.iter().zip(stacks) {
        let walrus::FunctionKind::Local(func) = &module.funcs.get(*id).kind else {
            unreachable!("iter_local gives local functions");
        };
        let found = calls(func);
        if found.len() != at_calls.len() {
            return Err(rewrite("call count differs between walrus and wasmparser"));
        }
        let mut sites = Vec::new();
        for (((seq, index), callee), at) in found.into_iter().zip(at_calls) {
            let instr = &func.block(seq).instrs[index].0;
            if callee.is_some() && callee == point {
                sites.push((seq, index, None));
            } else if wrap && may_unwind(instr) {
                sites.push((seq, index, Some(at)));
            }
        }
        if sites.is_empty() {
            continue;
        }
        let want: HashSet<(InstrSeqId, usize)> = sites.iter().map(|(s, i, _)| (*s, *i)).collect();
        let live = liveness(func, &want);
        plans.push((*id, sites, live));
    }

    // The tag, the capture cursor, and the rewrite.
    let tag_ty = module.types.add(&[], &[]);
    let tag = module.tags.add(tag_ty);
    add_export(&mut module, TAG_EXPORT, tag.into())?;
    let cursor =
        module
            .globals
            .add_local(ValType::I32, true, false, ConstExpr::Value(Value::I32(0)));
    add_export(&mut module, CAPTURE_GLOBAL_EXPORT, cursor.into())?;
    let mut stats = EhStats::default();
    let mut next_site = 0u32;
    let walrus::Module {
        funcs,
        types,
        locals,
        ..
    } = &mut module;
    for (id, mut sites, live) in plans {
        // Later positions first, so earlier ones stay where they are.
        sites.sort_by_key(|s| std::cmp::Reverse(s.1));
        let signatures: Vec<(Vec<ValType>, Vec<ValType>)> = sites
            .iter()
            .map(|(seq, index, _)| {
                let walrus::FunctionKind::Local(func) = &funcs.get(id).kind else {
                    unreachable!()
                };
                let ty = match &func.block(*seq).instrs[*index].0 {
                    Instr::Call(Call { func }) => funcs.get(*func).ty(),
                    Instr::CallIndirect(CallIndirect { ty, .. }) => *ty,
                    _ => unreachable!("sites are calls"),
                };
                let mut params = types.get(ty).params().to_vec();
                if matches!(func.block(*seq).instrs[*index].0, Instr::CallIndirect(_)) {
                    params.push(ValType::I32);
                }
                (params, types.get(ty).results().to_vec())
            })
            .collect();
        let walrus::FunctionKind::Local(func) = &mut funcs.get_mut(id).kind else {
            unreachable!()
        };
        let ctx = Ctx {
            cursor,
            memory,
            tag,
        };
        for ((seq, index, at), (params, results)) in sites.into_iter().zip(signatures) {
            let site = next_site;
            next_site += 1;
            let mut values: Vec<(LocalId, ValType)> = live
                .get(&(seq, index))
                .into_iter()
                .flatten()
                .map(|l| (*l, locals.get(*l).ty()))
                .collect();
            values.sort_by_key(|(l, _)| *l);
            let (call, loc) = func.block(seq).instrs[index].clone();
            let new = match at {
                None => {
                    stats.points += 1;
                    let mut out = ctx.stores(site, &values, &mut stats);
                    out.push(Instr::Throw(Throw { tag: ctx.tag }));
                    out
                }
                Some(at) => {
                    stats.wrapped += 1;
                    stats.outer += at.outer;
                    let below = at.below.unwrap_or_default();
                    stats.moved += below.len() as u32;
                    let mut ws = Wrap {
                        func,
                        types,
                        locals,
                        ctx: &ctx,
                        loc,
                    };
                    ws.wrap(call, site, &params, &results, &below, values, &mut stats)
                }
            };
            let new: Vec<_> = new.into_iter().map(|i| (i, loc)).collect();
            func.block_mut(seq).instrs.splice(index..=index, new);
        }
    }
    let out = module.emit_wasm();
    Validator::new_with_features(OUTPUT_FEATURES)
        .validate_all(&out)
        .map_err(PrepareError::OutputInvalid)?;
    Ok((out, stats))
}

fn rewrite(why: &str) -> PrepareError {
    PrepareError::Rewrite(format!("eh-proto: {why}").into())
}

/// The capture buffer and the tag.
struct Ctx {
    cursor: GlobalId,
    memory: MemoryId,
    tag: TagId,
}

impl Ctx {
    /// Store the site index and `values` at the cursor, then advance it:
    /// slot 0 holds the site, each value an 8-byte slot (16 for `v128`).
    fn stores(&self, site: u32, values: &[(LocalId, ValType)], stats: &mut EhStats) -> Vec<Instr> {
        let store = |kind, align, offset| {
            Instr::Store(Store {
                memory: self.memory,
                kind,
                arg: MemArg { align, offset },
            })
        };
        let base = Instr::GlobalGet(GlobalGet {
            global: self.cursor,
        });
        let mut out = vec![
            base.clone(),
            Instr::Const(Const {
                value: Value::I32(site as i32),
            }),
            store(StoreKind::I32 { atomic: false }, 4, 0),
        ];
        let mut offset = 8u64;
        for (local, ty) in values {
            let (kind, size) = match ty {
                ValType::I32 => (StoreKind::I32 { atomic: false }, 4),
                ValType::I64 => (StoreKind::I64 { atomic: false }, 8),
                ValType::F32 => (StoreKind::F32, 4),
                ValType::F64 => (StoreKind::F64, 8),
                ValType::V128 => {
                    offset = offset.next_multiple_of(16);
                    (StoreKind::V128, 16)
                }
                ValType::Ref(_) => continue,
            };
            out.push(base.clone());
            out.push(Instr::LocalGet(LocalGet { local: *local }));
            out.push(store(kind, size, offset));
            offset += u64::from(size.max(8));
            stats.stored += 1;
        }
        out.extend([
            base,
            Instr::Const(Const {
                value: Value::I32(offset as i32),
            }),
            Instr::Binop(Binop {
                op: BinaryOp::I32Add,
            }),
            Instr::GlobalSet(GlobalSet {
                global: self.cursor,
            }),
        ]);
        out
    }
}

/// Builds the code that replaces one call that may unwind.
struct Wrap<'a> {
    func: &'a mut LocalFunction,
    types: &'a mut walrus::ModuleTypes,
    locals: &'a mut walrus::ModuleLocals,
    ctx: &'a Ctx,
    loc: walrus::InstrLocId,
}

impl Wrap<'_> {
    fn seq(&mut self, params: &[ValType], results: &[ValType], body: Vec<Instr>) -> InstrSeqId {
        let ty = InstrSeqType::new(self.types, params, results);
        let id = self.func.builder_mut().dangling_instr_seq(ty).id();
        let loc = self.loc;
        self.func
            .block_mut(id)
            .instrs
            .extend(body.into_iter().map(|i| (i, loc)));
        id
    }

    fn temps(&mut self, tys: &[ValType]) -> Vec<LocalId> {
        tys.iter().map(|t| self.locals.add(*t)).collect()
    }

    /// ```text
    /// [args → temps, values under them → temps, args back]   (if any under)
    /// block $done (param P) (result R)
    ///   block $h (param P) (result exnref)
    ///     try_table (param P) (result R) (catch_all_ref $h)
    ///       call
    ///     end
    ///     br $done
    ///   end
    ///   store the live locals, the moved values and the site; throw_ref
    /// end
    /// [results → temps, values under them back, results back] (if any under)
    /// ```
    #[allow(clippy::too_many_arguments)]
    fn wrap(
        &mut self,
        call: Instr,
        site: u32,
        params: &[ValType],
        results: &[ValType],
        below: &[ValType],
        mut values: Vec<(LocalId, ValType)>,
        stats: &mut EhStats,
    ) -> Vec<Instr> {
        let set = |l: &LocalId| Instr::LocalSet(LocalSet { local: *l });
        let get = |l: &LocalId| Instr::LocalGet(LocalGet { local: *l });
        let mut before = Vec::new();
        let mut after = Vec::new();
        if !below.is_empty() {
            let args = self.temps(params);
            let under = self.temps(below);
            let res = self.temps(results);
            before.extend(args.iter().rev().map(set));
            before.extend(under.iter().rev().map(set));
            before.extend(args.iter().map(get));
            after.extend(res.iter().rev().map(set));
            after.extend(under.iter().map(get));
            after.extend(res.iter().map(get));
            values.extend(under.iter().copied().zip(below.iter().copied()));
        }
        let exn = ValType::Ref(RefType::EXNREF);
        let tried = self.seq(params, results, vec![call]);
        let done = self.seq(params, results, Vec::new());
        let handler = self.seq(params, &[exn], Vec::new());
        let catches = vec![TryTableCatch::CatchAllRef { label: handler }];
        let loc = self.loc;
        self.func.block_mut(handler).instrs.extend(
            [
                Instr::TryTable(TryTable {
                    seq: tried,
                    catches,
                }),
                Instr::Br(Br { block: done }),
            ]
            .map(|i| (i, loc)),
        );
        let mut tail = vec![Instr::Block(Block { seq: handler })];
        tail.extend(self.ctx.stores(site, &values, stats));
        tail.push(Instr::ThrowRef(ThrowRef {}));
        self.func
            .block_mut(done)
            .instrs
            .extend(tail.into_iter().map(|i| (i, loc)));
        before.push(Instr::Block(Block { seq: done }));
        before.extend(after);
        before
    }
}

/// Every `call` and `call_indirect` of `func` in body order, with the
/// direct callee.
fn calls(func: &LocalFunction) -> Vec<((InstrSeqId, usize), Option<FunctionId>)> {
    fn walk(
        func: &LocalFunction,
        seq: InstrSeqId,
        out: &mut Vec<((InstrSeqId, usize), Option<FunctionId>)>,
    ) {
        for (i, (instr, _)) in func.block(seq).instrs.iter().enumerate() {
            match instr {
                Instr::Block(Block { seq: s }) | Instr::Loop(Loop { seq: s }) => {
                    walk(func, *s, out)
                }
                Instr::IfElse(IfElse {
                    consequent,
                    alternative,
                }) => {
                    walk(func, *consequent, out);
                    walk(func, *alternative, out);
                }
                Instr::Call(Call { func: f }) => out.push(((seq, i), Some(*f))),
                Instr::CallIndirect(_) => out.push(((seq, i), None)),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(func, func.entry_block(), &mut out);
    out
}

/// For each local function in code order, what validation knows at each of
/// its `call` and `call_indirect` instructions (tail calls leave the frame
/// and are not listed, as [`calls`] does not list them).
fn operand_stacks(bytes: &[u8]) -> Result<Vec<Vec<AtCall>>, PrepareError> {
    let invalid = PrepareError::OutputInvalid;
    let mut validator = Validator::new_with_features(SUPPORTED_FEATURES);
    let mut out = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(invalid)?;
        let ValidPayload::Func(func, body) = validator.payload(&payload).map_err(invalid)? else {
            continue;
        };
        let mut v = func.into_validator(Default::default());
        let mut reader = body.get_binary_reader();
        v.read_locals(&mut reader).map_err(invalid)?;
        let mut ops = wasmparser::OperatorsReader::new(reader);
        let mut here = Vec::new();
        while !ops.eof() {
            let offset = ops.original_position();
            let op = ops.read().map_err(invalid)?;
            let ty = match op {
                Operator::Call { function_index } => {
                    v.resources().type_index_of_function(function_index)
                }
                Operator::CallIndirect { type_index, .. } => Some(type_index),
                _ => None,
            };
            if let Some(ty) = ty {
                let sub = v
                    .resources()
                    .sub_type_at(ty)
                    .ok_or_else(|| rewrite("type"))?;
                let mut args = sub.unwrap_func().params().len();
                args += usize::from(matches!(op, Operator::CallIndirect { .. }));
                let frame = v.get_control_frame(0).ok_or_else(|| rewrite("frame"))?;
                let height = v.operand_stack_height() as usize;
                let mine = height.saturating_sub(frame.height);
                let below = (!frame.unreachable && mine >= args)
                    .then(|| {
                        (args..mine)
                            .rev()
                            .map(|d| match v.get_operand_type(d).flatten()? {
                                wasmparser::ValType::I32 => Some(ValType::I32),
                                wasmparser::ValType::I64 => Some(ValType::I64),
                                wasmparser::ValType::F32 => Some(ValType::F32),
                                wasmparser::ValType::F64 => Some(ValType::F64),
                                wasmparser::ValType::V128 => Some(ValType::V128),
                                wasmparser::ValType::Ref(_) => None,
                            })
                            .collect::<Option<Vec<_>>>()
                    })
                    .flatten();
                here.push(AtCall {
                    below,
                    outer: frame.height as u32,
                });
            }
            v.op(offset, &op).map_err(invalid)?;
        }
        out.push(here);
    }
    Ok(out)
}

/// The locals live after each call in `want`: a backward pass over the
/// whole function (as in `loop_io.rs`), loop headers to a fixed point, the
/// union over passes recorded.
fn liveness(
    func: &LocalFunction,
    want: &HashSet<(InstrSeqId, usize)>,
) -> HashMap<(InstrSeqId, usize), HashSet<LocalId>> {
    let mut live = Live {
        func,
        want,
        labels: HashMap::from([(func.entry_block(), HashSet::new())]),
        at: HashMap::new(),
    };
    live.seq(func.entry_block(), HashSet::new());
    live.at
}

struct Live<'a> {
    func: &'a LocalFunction,
    want: &'a HashSet<(InstrSeqId, usize)>,
    labels: HashMap<InstrSeqId, HashSet<LocalId>>,
    at: HashMap<(InstrSeqId, usize), HashSet<LocalId>>,
}

impl Live<'_> {
    fn seq(&mut self, seq: InstrSeqId, mut live: HashSet<LocalId>) -> HashSet<LocalId> {
        for (index, (instr, _)) in self.func.block(seq).instrs.iter().enumerate().rev() {
            match instr {
                Instr::LocalGet(LocalGet { local }) => {
                    live.insert(*local);
                }
                Instr::LocalSet(LocalSet { local }) | Instr::LocalTee(LocalTee { local }) => {
                    live.remove(local);
                }
                Instr::Br(Br { block }) => live = self.label(*block),
                Instr::BrIf(BrIf { block }) => live.extend(self.label(*block)),
                Instr::BrTable(BrTable { blocks, default }) => {
                    live = HashSet::new();
                    for block in blocks.iter().chain([default]) {
                        live.extend(self.label(*block));
                    }
                }
                Instr::Return(_)
                | Instr::ReturnCall(_)
                | Instr::ReturnCallIndirect(_)
                | Instr::ReturnCallRef(_)
                | Instr::Unreachable(_) => live = HashSet::new(),
                Instr::Block(b) => {
                    self.labels.insert(b.seq, live.clone());
                    live = self.seq(b.seq, live);
                }
                Instr::IfElse(i) => {
                    self.labels.insert(i.consequent, live.clone());
                    self.labels.insert(i.alternative, live.clone());
                    let mut then = self.seq(i.consequent, live.clone());
                    then.extend(self.seq(i.alternative, live));
                    live = then;
                }
                Instr::Loop(l) => {
                    let mut head = self.label(l.seq);
                    loop {
                        self.labels.insert(l.seq, head.clone());
                        let mut top = self.seq(l.seq, live.clone());
                        top.extend(head.iter().copied());
                        if top == head {
                            break;
                        }
                        head = top;
                    }
                    live = head;
                }
                Instr::Call(_) | Instr::CallIndirect(_) if self.want.contains(&(seq, index)) => {
                    self.at
                        .entry((seq, index))
                        .or_default()
                        .extend(live.iter().copied());
                }
                _ => {}
            }
        }
        live
    }

    fn label(&self, label: InstrSeqId) -> HashSet<LocalId> {
        self.labels.get(&label).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
#[path = "eh_proto_tests.rs"]
mod tests;
