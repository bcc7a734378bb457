//! Capture by Wasm exceptions (`roam prepare --capture eh`): the stack
//! unwinds by a `throw` instead of Asyncify's returns, and is rebuilt by
//! rewind copies that only a restore runs.
//!
//! Why: Asyncify pays on every call, all the time, for an unwind that
//! happens rarely, and makes call-heavy programs several times slower. The
//! exception-handling proposal compiles to `try_call` with unwind tables in
//! Cranelift: a call that throws nothing costs no extra instruction. Its
//! one cost is that every register counts as clobbered on the exception
//! edge, so values a handler reads sit in stack slots across the call.
//!
//! The protocol with the host (the runtime drives it):
//!
//! - `roam.state` (exported mutable `i32`): [`NORMAL`], [`UNWINDING`] or
//!   [`REWINDING`]. The host sets it; the program only reads it.
//! - A point calls `roam.migration_point` as before. If the host began an
//!   unwind there (state [`UNWINDING`]), the point stores its frame's
//!   record at `roam.capture` and throws `roam.unwind`. A blocking import
//!   does the same after the host suspended it, with its arguments in the
//!   record so that a restore calls it again.
//! - Every call that may reach a point sits in a `try_table` whose
//!   handler stores the frame's record and rethrows; the host catches the
//!   exception under `_start`. The records, innermost frame first, are the
//!   captured stack: each holds the frame's live locals (8-byte slots,
//!   16 for `v128`) and then its site number, so they can be read from the
//!   top down. A record that would pass `roam.capture_end` traps.
//! - To restore, the host puts the records back, sets the cursor to their
//!   end and the state to [`REWINDING`], and calls `roam.rewind`, the
//!   rewind copy of `_start` (`write.rs` says how a copy finds its way).
//!   The innermost site calls the host again, which sets the state to
//!   [`NORMAL`]; from there every frame runs on in its copy, and every new
//!   call goes to the program's own functions.
//!
//! The program's functions keep their code: only sites gain a check or a
//! `try_table`. A module prepared so needs the exception-handling proposal
//! (wasmtime 48 with its `gc` feature).
//!
//! `--capture returns` keeps all of this but the exceptions: a point
//! stores its record and returns zeros, and after every call that may
//! reach one the caller checks `roam.state` and does the same, so the
//! stack unwinds by ordinary returns down to `_start`. A check is a load
//! and a branch; a `try_table` instead makes Cranelift treat every
//! register as clobbered on the exception edge, so the values live across
//! the call sit in stack slots. Such a module needs no exception support.
//! It relies on every call that may reach a point being checked, as the
//! exception form relies on it being wrapped.
//!
//! `--capture eh-points` is an ablation kept for measurement: the points
//! alone, no `try_table` and no copies (nothing can restore it).

mod facts;
mod record;
mod write;

use std::collections::{HashMap, HashSet};

use walrus::ir::{Call, CallIndirect, Instr, InstrSeqId, InstrSeqType};
use walrus::{
    ConstExpr, ElementItems, ElementKind, ExportItem, FunctionBuilder, FunctionId, FunctionKind,
    ImportKind, LocalFunction, ModuleConfig, RefType, ValType,
};
use wasmparser::{Validator, WasmFeatures};

use crate::callgraph::{CallGraph, TableTargets};
use crate::instrument::add_export;
use crate::pipeline::PrepareError;
use crate::validate::SUPPORTED_FEATURES;
use crate::{ASYNC_IMPORTS, POINT_FUNC, POINT_MODULE};
use facts::Under;
pub use write::{NORMAL, REWINDING, UNWINDING};

use write::{Ctx, FnPlan, Kid, KidKind, Writer};

/// Export name of the mutable `i32` global that holds where the next
/// record is written (unwinding) or where the last one ends (rewinding).
pub const CAPTURE_GLOBAL_EXPORT: &str = "roam.capture";
/// Export name of the mutable `i32` global past which no record is written.
pub const CAPTURE_END_EXPORT: &str = "roam.capture_end";
/// Export name of the mutable `i32` global with the capture state.
pub const STATE_EXPORT: &str = "roam.state";
/// Export name of the rewind copy of `_start`.
pub const REWIND_EXPORT: &str = "roam.rewind";
/// Export name of the rewind copy of `wasi_thread_start`, the entry of
/// every thread but the first (wasi-threads); only in modules that export
/// that entry.
pub const REWIND_THREAD_EXPORT: &str = "roam.rewind_thread";
/// The entry wasi-threads calls on each new thread, `(tid, arg) -> ()`.
pub const THREAD_START_EXPORT: &str = "wasi_thread_start";
/// Export name of the exception tag a point throws.
pub const TAG_EXPORT: &str = "roam.unwind";

/// Features an `eh` output may use: the inputs' plus exceptions.
pub(crate) const OUTPUT_FEATURES: WasmFeatures = SUPPORTED_FEATURES.union(WasmFeatures::EXCEPTIONS);

/// What the transform did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EhStats {
    /// Calls wrapped in a `try_table` (in run forms and copies).
    pub wrapped: u32,
    /// Points that store and throw (in run forms and copies).
    pub points: u32,
    /// Blocking imports that store and throw (in run forms and copies).
    pub imports: u32,
    /// Operand-stack values moved to locals under a kid (run forms).
    pub moved: u32,
    /// Values stored by handlers and points, summed over sites.
    pub stored: u32,
    /// Sites, numbered across the module.
    pub sites: u32,
    /// Functions that got a rewind copy.
    pub copies: u32,
}

/// What capture by exceptions cannot handle (Asyncify can).
fn unsupported(why: &str) -> PrepareError {
    PrepareError::EhUnsupported(why.into())
}

fn rewrite(why: &str) -> PrepareError {
    PrepareError::Rewrite(format!("capture by exceptions: {why}").into())
}

/// Rewrite `bytes` (a module `instrument.rs` made, optimised) as the module
/// docs say. `names`: keep the `name` section. Without `wrap` (the
/// `eh-points` ablation) only the points change and no copy is made.
pub(crate) fn transform(
    bytes: &[u8],
    names: bool,
    wrap: bool,
    returns: bool,
) -> Result<(Vec<u8>, EhStats), PrepareError> {
    let stacks = facts::operand_stacks(bytes)?;
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
        .ok_or_else(|| rewrite("the module has no linear memory for its records"))?;
    for element in module.elements.iter() {
        if let ElementItems::Functions(fs) = &element.items {
            if fs.iter().any(|f| blocking.contains(f) || Some(*f) == point) {
                return Err(unsupported("a table holds an import that may block"));
            }
        }
    }

    // Who can reach a point or a blocking import.
    let graph = CallGraph::new(&module);
    let tables = TableTargets::new(&module);
    let with_point: HashSet<FunctionId> = module
        .funcs
        .iter_local()
        .filter(|(_, f)| {
            let mut found = false;
            crate::outline::walk(f, f.entry_block(), &mut |i| {
                if let Instr::Call(Call { func }) = i {
                    found |= Some(*func) == point || blocking.contains(func);
                }
            });
            found
        })
        .map(|(id, _)| id)
        .collect();
    let reaching = graph.reaching(|f| with_point.contains(&f) || blocking.contains(&f));
    let classify = |instr: &Instr| -> Option<KidKind> {
        match instr {
            Instr::Call(Call { func }) if Some(*func) == point => Some(KidKind::Point),
            Instr::Call(Call { func }) if blocking.contains(func) => Some(KidKind::Import),
            Instr::Call(Call { func }) if wrap && reaching.contains(func) => Some(KidKind::Wrapped),
            Instr::CallIndirect(CallIndirect { ty, table })
                if wrap
                    && tables
                        .targets(&module, *table, *ty)
                        .is_none_or(|t| t.iter().any(|f| reaching.contains(f))) =>
            {
                Some(KidKind::Wrapped)
            }
            _ => None,
        }
    };

    // Plan every function before changing anything.
    let local_ids: Vec<FunctionId> = module.funcs.iter_local().map(|(id, _)| id).collect();
    if local_ids.len() != stacks.len() {
        return Err(rewrite(
            "function count differs between walrus and wasmparser",
        ));
    }
    let mut stats = EhStats::default();
    let mut pending = Vec::new();
    for (id, facts) in local_ids.iter().zip(stacks) {
        let FunctionKind::Local(func) = &module.funcs.get(*id).kind else {
            unreachable!("iter_local gives local functions");
        };
        let mut planner = Planner {
            func,
            facts: &facts,
            next_fact: 0,
            positions: facts::positions(func),
            classify: &classify,
            module: &module,
            kids: HashMap::new(),
            sites: Vec::new(),
            enclosing: Vec::new(),
            next_site: stats.sites,
            new_locals: Vec::new(),
            pools: HashMap::new(),
        };
        if planner.positions.len() != facts.len() {
            return Err(rewrite(
                "instruction count differs between walrus and wasmparser",
            ));
        }
        planner.walk(func.entry_block())?;
        stats.sites = planner.next_site;
        if !planner.sites.is_empty() {
            pending.push((*id, planner.kids, planner.sites, planner.new_locals));
        }
    }

    // Make the locals the plans asked for, and each site's record.
    let mut plans: Vec<(FunctionId, FnPlan)> = Vec::new();
    let mut site_owner: Vec<FunctionId> = Vec::new();
    let mut any_indirect = false;
    for (id, kids, sites, new_locals) in pending {
        let made: Vec<_> = new_locals.iter().map(|t| module.locals.add(*t)).collect();
        let FunctionKind::Local(func) = &module.funcs.get(id).kind else {
            unreachable!()
        };
        let want: HashSet<(InstrSeqId, usize)> = sites.iter().map(|s| s.at).collect();
        let live = facts::liveness(func, &want);
        let local = |l: Pending| made[l];
        let mut plan = FnPlan::default();
        for ((seq, index), k) in kids {
            any_indirect |= k.kind == KidKind::Wrapped
                && matches!(func.block(seq).instrs[index].0, Instr::CallIndirect(_));
            let typed = |v: &[(Pending, ValType)]| -> Vec<_> {
                v.iter().map(|(l, t)| (local(*l), *t)).collect()
            };
            plan.kids.insert(
                (seq, index),
                Kid {
                    kind: k.kind,
                    lo: k.lo,
                    hi: k.hi,
                    under: typed(&k.under),
                    ins: typed(&k.ins),
                    outs: typed(&k.outs),
                },
            );
        }
        for s in &sites {
            let mut values: Vec<_> = live
                .get(&s.at)
                .into_iter()
                .flatten()
                .copied()
                .chain(s.extra.iter().map(|p| local(*p)))
                .collect();
            values.sort();
            values.dedup();
            let mut record = Vec::with_capacity(values.len());
            for l in values {
                match module.locals.get(l).ty() {
                    ValType::Ref(_) => {
                        return Err(unsupported(
                            "a reference is live across a call that may unwind",
                        ))
                    }
                    ty => record.push((l, ty)),
                }
            }
            plan.records.push((s.number, record));
            site_owner.push(id);
        }
        plan.target = Some(module.locals.add(ValType::I32));
        plans.push((id, plan));
    }

    // The state, the buffer's cursor and end, the tag.
    let global = |module: &mut walrus::Module| {
        module.globals.add_local(
            ValType::I32,
            true,
            false,
            ConstExpr::Value(walrus::ir::Value::I32(0)),
        )
    };
    let state = global(&mut module);
    let cursor = global(&mut module);
    let end = global(&mut module);
    add_export(&mut module, STATE_EXPORT, state.into())?;
    add_export(&mut module, CAPTURE_GLOBAL_EXPORT, cursor.into())?;
    add_export(&mut module, CAPTURE_END_EXPORT, end.into())?;
    let tag = match returns {
        true => None,
        false => {
            let tag_ty = module.types.add(&[], &[]);
            let tag = module.tags.add(tag_ty);
            add_export(&mut module, TAG_EXPORT, tag.into())?;
            Some(tag)
        }
    };

    // Placeholders for the copies, so that copies can call each other.
    let mut copies = HashMap::new();
    if wrap {
        for (id, _) in &plans {
            let ty = module.types.get(module.funcs.get(*id).ty()).clone();
            let mut fb = FunctionBuilder::new(&mut module.types, ty.params(), ty.results());
            fb.func_body().unreachable();
            let copy = fb.finish(Vec::new(), &mut module.funcs);
            copies.insert(*id, copy);
        }
        stats.copies = copies.len() as u32;
    }
    let by_site = (wrap && any_indirect && !site_owner.is_empty()).then(|| {
        let n = site_owner.len() as u64;
        let table = module.tables.add_local(false, n, Some(n), RefType::FUNCREF);
        let items = site_owner.iter().map(|f| copies[f]).collect();
        module.elements.add(
            ElementKind::Active {
                table,
                offset: ConstExpr::Value(walrus::ir::Value::I32(0)),
            },
            ElementItems::Functions(items),
        );
        table
    });
    let ctx = Ctx {
        state,
        cursor,
        end,
        memory,
        tag,
        copies,
        by_site,
    };

    // Write every function with sites in its two forms.
    for (id, plan) in &plans {
        let name = module.funcs.get(*id).name.clone();
        let FunctionKind::Local(src) = &module.funcs.get(*id).kind else {
            unreachable!()
        };
        let run = Writer::new(src, plan, &ctx, &mut module.types, &mut stats, false).finish(None);
        let copy = wrap.then(|| {
            Writer::new(src, plan, &ctx, &mut module.types, &mut stats, true)
                .finish(name.as_ref().map(|n| format!("{n}.roam_rewind")))
        });
        replace(&mut module, *id, run);
        if let Some(copy) = copy {
            replace(&mut module, ctx.copies[id], copy);
        }
    }

    // `roam.rewind`: the copy of `_start`, or a trap if it has none.
    let start = module.exports.iter().find_map(|e| match e.item {
        ExportItem::Function(f) if e.name == "_start" => Some(f),
        _ => None,
    });
    let rewind = match start.and_then(|s| ctx.copies.get(&s)) {
        Some(copy) => *copy,
        None => {
            let mut fb = FunctionBuilder::new(&mut module.types, &[], &[]);
            fb.func_body().unreachable();
            fb.finish(Vec::new(), &mut module.funcs)
        }
    };
    if start.is_some_and(|s| {
        !module
            .types
            .get(module.funcs.get(s).ty())
            .params()
            .is_empty()
    }) {
        return Err(rewrite("`_start` takes parameters"));
    }
    add_export(&mut module, REWIND_EXPORT, rewind.into())?;
    // `roam.rewind_thread`: the copy of a thread's entry, with its type.
    let thread_start = module.exports.iter().find_map(|e| match e.item {
        ExportItem::Function(f) if e.name == THREAD_START_EXPORT => Some(f),
        _ => None,
    });
    if let Some(entry) = thread_start {
        let ty = module.types.get(module.funcs.get(entry).ty()).clone();
        if ty.params() != [ValType::I32, ValType::I32] || !ty.results().is_empty() {
            return Err(rewrite(
                "`wasi_thread_start` is not of type (i32, i32) -> ()",
            ));
        }
        let copy = match ctx.copies.get(&entry) {
            Some(copy) => *copy,
            None => {
                let mut fb = FunctionBuilder::new(&mut module.types, ty.params(), &[]);
                fb.func_body().unreachable();
                let params = vec![
                    module.locals.add(ValType::I32),
                    module.locals.add(ValType::I32),
                ];
                fb.finish(params, &mut module.funcs)
            }
        };
        add_export(&mut module, REWIND_THREAD_EXPORT, copy.into())?;
    }
    let out = module.emit_wasm();
    // Frames that leave by returning need no exception support at all.
    let features = match returns {
        true => SUPPORTED_FEATURES,
        false => OUTPUT_FEATURES,
    };
    Validator::new_with_features(features)
        .validate_all(&out)
        .map_err(PrepareError::OutputInvalid)?;
    Ok((out, stats))
}

fn replace(module: &mut walrus::Module, id: FunctionId, body: LocalFunction) {
    module.funcs.get_mut(id).kind = FunctionKind::Local(body);
}

/// A local the plan asks for: its index among those to be made.
type Pending = usize;

struct PendingKid {
    kind: KidKind,
    lo: u32,
    hi: u32,
    under: Vec<(Pending, ValType)>,
    ins: Vec<(Pending, ValType)>,
    outs: Vec<(Pending, ValType)>,
}

struct Site {
    number: u32,
    at: (InstrSeqId, usize),
    /// Locals its record holds besides those live after it: values moved
    /// from under it and under the blocks around it, and a blocking
    /// import's arguments.
    extra: Vec<Pending>,
}

/// Finds the kids and sites of one function, numbering sites in pre-order
/// so that every kid's sites form one range.
struct Planner<'a, C: Fn(&Instr) -> Option<KidKind>> {
    func: &'a LocalFunction,
    facts: &'a [Under],
    next_fact: usize,
    positions: Vec<(InstrSeqId, usize)>,
    classify: &'a C,
    module: &'a walrus::Module,
    kids: HashMap<(InstrSeqId, usize), PendingKid>,
    sites: Vec<Site>,
    /// Locals that values under enclosing kids were moved to.
    enclosing: Vec<Vec<Pending>>,
    next_site: u32,
    new_locals: Vec<ValType>,
    /// Locals that kids' inputs and results pass through, shared by all
    /// kids of the function (by role and type, one per position). They
    /// live only from just before a kid to its start, or from its end to
    /// just after it, so no two kids need them at once; a function has
    /// hundreds of kids, and a local of its own for each would make the
    /// rewind copy's locals times blocks grow out of hand in Cranelift.
    pools: HashMap<(bool, ValType), Vec<Pending>>,
}

impl<C: Fn(&Instr) -> Option<KidKind>> Planner<'_, C> {
    fn fact(&mut self, at: (InstrSeqId, usize)) -> Result<Under, PrepareError> {
        let i = self.next_fact;
        self.next_fact += 1;
        match (self.positions.get(i), self.facts.get(i)) {
            (Some(p), Some(f)) if *p == at => Ok(f.clone()),
            _ => Err(rewrite(
                "walrus and wasmparser disagree on the instruction order",
            )),
        }
    }

    fn new_locals(&mut self, tys: &[ValType]) -> Vec<(Pending, ValType)> {
        tys.iter()
            .map(|t| {
                self.new_locals.push(*t);
                (self.new_locals.len() - 1, *t)
            })
            .collect()
    }

    /// Pooled locals for a kid's inputs (`ins`) or results.
    fn pooled(&mut self, ins: bool, tys: &[ValType]) -> Vec<(Pending, ValType)> {
        let mut used: HashMap<ValType, usize> = HashMap::new();
        let mut out = Vec::with_capacity(tys.len());
        for t in tys {
            let n = used.entry(*t).or_default();
            let have = self.pools.get(&(ins, *t)).map_or(0, Vec::len);
            if *n == have {
                self.new_locals.push(*t);
                let l = self.new_locals.len() - 1;
                self.pools.entry((ins, *t)).or_default().push(l);
            }
            out.push((self.pools[&(ins, *t)][*n], *t));
            *n += 1;
        }
        out
    }

    fn seq_results(&self, seq: InstrSeqId) -> Vec<ValType> {
        match self.func.block(seq).ty {
            InstrSeqType::Simple(None) => Vec::new(),
            InstrSeqType::Simple(Some(t)) => vec![t],
            InstrSeqType::MultiValue(ty) => self.module.types.get(ty).results().to_vec(),
        }
    }

    /// Walk block `seq`; returns the range of sites it holds.
    fn walk(&mut self, seq: InstrSeqId) -> Result<Option<(u32, u32)>, PrepareError> {
        let mut range: Option<(u32, u32)> = None;
        let join = |a: Option<(u32, u32)>, b: Option<(u32, u32)>| match (a, b) {
            (Some(a), Some(b)) => Some((a.0.min(b.0), a.1.max(b.1))),
            (a, None) => a,
            (None, b) => b,
        };
        let func = self.func;
        for (i, (instr, _)) in func.block(seq).instrs.iter().enumerate() {
            let children: Vec<InstrSeqId> = match instr {
                Instr::Block(b) => vec![b.seq],
                Instr::Loop(l) => vec![l.seq],
                Instr::IfElse(e) => vec![e.consequent, e.alternative],
                Instr::Call(_) | Instr::CallIndirect(_) => Vec::new(),
                _ => continue,
            };
            let fact = self.fact((seq, i))?;
            if children.is_empty() {
                let Some(kind) = (self.classify)(instr) else {
                    continue;
                };
                let Under::Values(under) = fact else {
                    return Err(unsupported(
                        "a reference lies on the stack under a call that may unwind",
                    ));
                };
                let (mut params, results) = match instr {
                    Instr::Call(Call { func }) => {
                        let ty = self.module.types.get(self.module.funcs.get(*func).ty());
                        (ty.params().to_vec(), ty.results().to_vec())
                    }
                    Instr::CallIndirect(CallIndirect { ty, .. }) => {
                        let ty = self.module.types.get(*ty);
                        (ty.params().to_vec(), ty.results().to_vec())
                    }
                    _ => unreachable!(),
                };
                if matches!(instr, Instr::CallIndirect(_)) {
                    params.push(ValType::I32);
                }
                let under = self.new_locals(&under);
                let ins = self.pooled(true, &params);
                let outs = self.pooled(false, &results);
                let number = self.next_site;
                self.next_site += 1;
                let mut extra: Vec<Pending> = self.enclosing.iter().flatten().copied().collect();
                extra.extend(under.iter().map(|u| u.0));
                if kind == KidKind::Import {
                    extra.extend(ins.iter().map(|u| u.0));
                }
                self.sites.push(Site {
                    number,
                    at: (seq, i),
                    extra,
                });
                self.kids.insert(
                    (seq, i),
                    PendingKid {
                        kind,
                        lo: number,
                        hi: number,
                        under,
                        ins,
                        outs,
                    },
                );
                range = join(range, Some((number, number)));
                continue;
            }
            let under = match &fact {
                Under::Values(v) => self.new_locals(v),
                _ => Vec::new(),
            };
            self.enclosing.push(under.iter().map(|u| u.0).collect());
            let mut arms = Vec::new();
            for child in &children {
                arms.push(self.walk(*child)?);
            }
            self.enclosing.pop();
            let inner = arms.iter().fold(None, |a, b| join(a, *b));
            let Some((lo, hi)) = inner else {
                continue;
            };
            match fact {
                Under::Values(_) => {}
                Under::Params => {
                    return Err(unsupported(
                        "a block with parameters holds a call that may unwind",
                    ))
                }
                _ => {
                    return Err(unsupported(
                        "a reference lies on the stack under a block that may unwind",
                    ))
                }
            }
            let is_if = matches!(instr, Instr::IfElse(_));
            let ins = if is_if {
                self.pooled(true, &[ValType::I32])
            } else {
                Vec::new()
            };
            let results = self.seq_results(children[0]);
            let outs = self.pooled(false, &results);
            self.kids.insert(
                (seq, i),
                PendingKid {
                    kind: KidKind::Control {
                        then: if is_if { arms[0] } else { None },
                    },
                    lo,
                    hi,
                    under,
                    ins,
                    outs,
                },
            );
            range = join(range, inner);
        }
        Ok(range)
    }
}

#[cfg(test)]
#[path = "../eh_tests.rs"]
pub(crate) mod tests;
