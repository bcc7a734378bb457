//! Insert migration points and export the state the host must save.
//!
//! Asyncify can only unwind the stack from inside an import call, and the
//! host can only ask a running program to stop by changing data the program
//! reads. A migration point joins the two: `global.get $roam.flag; if; call
//! $roam.migration_point; end`. While the flag is clear it costs a load and a
//! well-predicted branch; when the host sets it, the program calls the
//! import, which unwinds the stack into linear memory.
//!
//! The same pass exports every mutable global, the memory and the tables
//! under stable `roam.*` names, because `wasm-opt` may rename or drop
//! anything unexported and the snapshot must name state portably.
//!
//! Placement and the Asyncify scope both come from the call graph
//! (`callgraph.rs`): function entries get a point only on a call cycle
//! ([`EntryPoints::Cycles`]), and only functions that can reach an
//! unwinding import are handed to Asyncify ([`AsyncifyScope::Reachable`]),
//! by name, so every function gets a unique name `wasm-opt` reads back
//! verbatim.

use std::collections::{HashMap, HashSet};

use walrus::ir::{Call, CallIndirect, Instr, InstrSeqId, Loop};
use walrus::{
    ConstExpr, ExportItem, FunctionId, GlobalId, ImportKind, LocalFunction, Module, ModuleConfig,
    ValType,
};

use crate::callgraph::{is_local, CallGraph};
use crate::outline::{outline_loops, Stage};
use crate::pipeline::PrepareError;
use crate::quiet::Quiet;
use crate::rerun::Nested;
use crate::wasm_opt::AsyncifyList;
use crate::{
    AsyncifyScope, BulkChunks, CountedLoops, CountedNests, EntryPoints, HoistCalls, LiftExits,
    LoopPoints, ModuleInfo, Outline, PointPolicy, PointStats, PrepareOptions, QuietIndirect,
    RerunCalls, TrimOutlined, UnrollChecks, ASYNC_IMPORTS, FLAG_GLOBAL_EXPORT,
    GLOBAL_EXPORT_PREFIX, MEMORY_EXPORT, POINT_FUNC, POINT_MODULE, TABLE_EXPORT_PREFIX,
};

/// The instrumented module, ready for `wasm-opt`.
pub(crate) struct Instrumented {
    /// The module bytes.
    pub bytes: Vec<u8>,
    /// Points inserted.
    pub stats: PointStats,
    /// Loops moved into functions of their own (`outline.rs`).
    pub outlined: u32,
    /// Functions with a fast form that gives up (`pure.rs`).
    pub rerun: u32,
    /// Counted loops with a copy without checks for short runs
    /// (`counted.rs`).
    pub counted: u32,
    /// Bulk-memory instructions that run in chunks when long (`bulk.rs`).
    pub bulk: u32,
    /// Functions that return before a call that ends the program, which
    /// their callers make instead (`leave.rs`).
    pub lifted: usize,
    /// Names of the functions Asyncify must instrument
    /// ([`AsyncifyScope::Reachable`]), or must leave alone (the fast forms of
    /// `pure.rs`), or `None` for Asyncify's own analysis alone.
    pub list: Option<AsyncifyList>,
}

/// Rewrite `input` (already validated as `info`) as `opts` say: points,
/// roam exports, DWARF dropped, `name` section kept unless
/// `opts.strip_names` (it is always written when Asyncify's scope is given
/// by name; `wasm-opt` then drops it).
pub(crate) fn instrument(
    input: &[u8],
    info: &ModuleInfo,
    opts: &PrepareOptions,
) -> Result<Instrumented, PrepareError> {
    let policy = opts.points;
    let by_name = opts.asyncify_scope == AsyncifyScope::Reachable;
    let rerun_calls = opts.rerun_calls == RerunCalls::On && policy != PointPolicy::Manual;
    // Under `--entry-points all` every function that calls gets a point,
    // the helpers of `indirect.rs` included, so they could unwind; under
    // `cycles` a helper is on no cycle (its callees are quiet, so none of
    // them can reach it again), and under `manual` nothing gets a point.
    let quiet_indirect = opts.quiet_indirect == QuietIndirect::On
        && (opts.entry_points == EntryPoints::Cycles || policy == PointPolicy::Manual);
    let mut config = ModuleConfig::new();
    config
        .generate_dwarf(false)
        .generate_name_section(!opts.strip_names || by_name || rerun_calls || quiet_indirect)
        .generate_producers_section(true);
    let mut module = config
        .parse(input)
        .map_err(|e| PrepareError::Rewrite(e.into()))?;

    export_state(&mut module, info)?;
    let point = point_import(&mut module);
    let flag = module.globals.add_local(
        ValType::I32,
        true,
        false,
        ConstExpr::Value(walrus::ir::Value::I32(0)),
    );
    add_export(&mut module, FLAG_GLOBAL_EXPORT, flag.into())?;
    // Waits become blocking imports before anything reads the call graph,
    // so that every caller of one is a site like a caller of `fd_read`.
    crate::waits::route_waits(&mut module);
    // Before anything reads the call graph: a long fill or copy now calls
    // a helper whose loop gets a point like any other loop.
    let loops_policy = matches!(policy, PointPolicy::Loops | PointPolicy::Outer);
    let bulk = match opts.bulk_chunks == BulkChunks::On && loops_policy {
        true => crate::bulk::chunk_bulk(&mut module),
        false => 0,
    };

    // One call graph serves the entry points and the quiet calls.
    let quiet_of = |module: &Module| {
        let graph = CallGraph::new(module);
        let cycles = match opts.entry_points {
            EntryPoints::Cycles => Some(graph.on_cycle()),
            EntryPoints::All => None,
        };
        let quiet = Quiet::new(module, &graph, policy, opts.entry_points, cycles.as_ref());
        (graph, cycles, quiet)
    };
    // First, so that the passes below see those calls as quiet.
    let helpers = match quiet_indirect {
        true => {
            let (_, _, quiet) = quiet_of(&module);
            crate::indirect::route_quiet(&mut module, &quiet)
        }
        false => Vec::new(),
    };
    // Calls that end the program leave their callers before anything
    // below decides which calls may unwind.
    let lifted = match opts.lift_exits == LiftExits::On && policy != PointPolicy::Manual {
        true => {
            let (_, _, quiet) = quiet_of(&module);
            crate::leave::lift_exits(&mut module, &quiet)?
        }
        false => 0,
    };
    // Nests before any point, so each gets its points in its new function
    // exactly as in place; innermost loops after (see `outline.rs`).
    let outline = opts.outline != Outline::Off;
    let trim = opts.trim_outlined == TrimOutlined::On;
    let mut outlined = 0;
    if outline {
        let (_, _, quiet) = quiet_of(&module);
        outlined += outline_loops(&mut module, Stage::Nests, &quiet, trim)?;
    }
    // Pure functions that reach a point give up instead of unwinding.
    let split = if rerun_calls {
        let (graph, _, quiet) = quiet_of(&module);
        let fast = crate::pure::abortable(&module, &graph, &quiet);
        match fast.is_empty() {
            true => None,
            false => Some(crate::pure::split(&mut module, fast, point)?),
        }
    } else {
        None
    };
    let results: HashMap<FunctionId, Vec<ValType>> = split
        .iter()
        .flat_map(|s| &s.fast)
        .map(|f| {
            let ty = module.types.get(module.funcs.get(*f).ty());
            (*f, ty.results().to_vec())
        })
        .collect();
    let (_, cycles, quiet) = quiet_of(&module);
    let mut stats = PointStats::default();
    let mut counted = 0;
    for (id, func) in module.funcs.iter_local_mut() {
        let entry_allowed = cycles.as_ref().is_none_or(|c| c.contains(&id));
        let (loop_points, entry_point, manual, versioned) = match &split {
            // A wrapper's call of the point is where a fast form's check
            // lands, already counted there; it has no loop and is on no
            // cycle.
            Some(s) if s.wrappers.contains(&id) => continue,
            // A helper's one call is quiet, and it is on no cycle.
            _ if helpers.contains(&id) => continue,
            Some(s) if s.fast.contains(&id) => {
                let (loops, entry, _) = placement(func, point, policy, entry_allowed);
                let mut at: Vec<InstrSeqId> = loops.iter().map(|l| l.seq).collect();
                at.extend(entry.then(|| func.entry_block()));
                crate::pure::give_up_checks(func, &at, &results[&id], &s.fast, flag, s.globals);
                (loops.len() as u32, entry, 0, 0)
            }
            _ => instrument_function(func, point, flag, opts, entry_allowed, &quiet),
        };
        // A slow copy repeats its fast form's points (and loops).
        if split.as_ref().is_some_and(|s| s.slow.contains(&id)) {
            continue;
        }
        counted += versioned;
        stats.loop_points += loop_points;
        stats.function_points += u32::from(entry_point);
        stats.manual_points += manual;
        if loop_points > 0 || entry_point || manual > 0 {
            stats.functions += 1;
        }
    }
    if outline {
        outlined += outline_loops(&mut module, Stage::Leaves, &quiet, trim)?;
    }
    // Functions Asyncify's own analysis would take as able to unwind, but
    // which cannot: the fast forms, and the helpers of quiet indirect calls.
    let never: std::collections::BTreeSet<FunctionId> = split
        .iter()
        .flat_map(|s| s.fast.iter().copied())
        .chain(helpers.iter().copied())
        .collect();
    let list = if by_name {
        Some(AsyncifyList::Only(asyncify_only(&mut module)))
    } else if !never.is_empty() {
        crate::names::make_names_listable(&mut module);
        let names = never
            .iter()
            .filter_map(|f| module.funcs.get(*f).name.clone());
        Some(AsyncifyList::Remove(names.collect()))
    } else {
        None
    };
    Ok(Instrumented {
        bytes: module.emit_wasm(),
        stats,
        outlined,
        rerun: split.map_or(0, |s| s.fast.len() as u32),
        counted,
        bulk,
        lifted,
        list,
    })
}

/// Names of the defined functions that can reach an unwinding import, after
/// giving every function a unique name `wasm-opt` takes verbatim.
fn asyncify_only(module: &mut Module) -> Vec<String> {
    let unwinding: HashSet<FunctionId> = ASYNC_IMPORTS
        .iter()
        .filter_map(|(m, n)| module.imports.find(m, n))
        .filter_map(|id| match module.imports.get(id).kind {
            ImportKind::Function(f) => Some(f),
            _ => None,
        })
        .collect();
    let reaching = CallGraph::new(module).reaching(|f| unwinding.contains(&f));
    crate::names::make_names_listable(module);
    let mut only: Vec<String> = module
        .funcs
        .iter()
        .filter(|f| reaching.contains(&f.id()) && is_local(module, f.id()))
        .filter_map(|f| f.name.clone())
        .collect();
    if only.is_empty() {
        // An empty list would mean "no list" to Asyncify, which would then
        // instrument by its own analysis. Name the entry instead: it runs
        // once, so instrumenting it costs nothing measurable.
        only.extend(
            module
                .exports
                .iter()
                .filter(|e| e.name == "_start")
                .filter_map(|e| match e.item {
                    ExportItem::Function(f) => module.funcs.get(f).name.clone(),
                    _ => None,
                }),
        );
    }
    only
}

pub(crate) fn add_export(
    module: &mut Module,
    name: &str,
    item: ExportItem,
) -> Result<(), PrepareError> {
    if module.exports.iter().any(|e| e.name == name) {
        return Err(PrepareError::ExportNameTaken {
            name: name.to_string(),
        });
    }
    module.exports.add(name, item);
    Ok(())
}

fn export_state(module: &mut Module, info: &ModuleInfo) -> Result<(), PrepareError> {
    let globals: Vec<(u32, GlobalId)> = module
        .globals
        .iter()
        .enumerate()
        .filter(|(_, g)| g.mutable)
        .map(|(i, g)| (i as u32, g.id()))
        .collect();
    debug_assert_eq!(
        globals.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        info.mutable_globals,
        "walrus global order must match the input's index space"
    );
    for (index, id) in globals {
        add_export(module, &format!("{GLOBAL_EXPORT_PREFIX}{index}"), id.into())?;
    }
    let memories: Vec<_> = module.memories.iter().map(|m| m.id()).collect();
    for id in memories {
        add_export(module, MEMORY_EXPORT, id.into())?;
    }
    let tables: Vec<_> = module.tables.iter().map(|t| t.id()).collect();
    for (index, id) in tables.into_iter().enumerate() {
        add_export(module, &format!("{TABLE_EXPORT_PREFIX}{index}"), id.into())?;
    }
    Ok(())
}

/// The `roam.migration_point` import, reusing the program's own if present.
fn point_import(module: &mut Module) -> FunctionId {
    if let Some(id) = module.imports.find(POINT_MODULE, POINT_FUNC) {
        if let ImportKind::Function(func) = module.imports.get(id).kind {
            return func;
        }
    }
    let ty = module.types.add(&[], &[]);
    module.add_import_func(POINT_MODULE, POINT_FUNC, ty).0
}

/// Instrument one function: returns (loop points, entry point?, manual
/// calls, counted loops given a copy for short runs, `counted.rs`).
fn instrument_function(
    func: &mut LocalFunction,
    point: FunctionId,
    flag: GlobalId,
    opts: &PrepareOptions,
    entry_allowed: bool,
    quiet: &Quiet,
) -> (u32, bool, u32, u32) {
    let (policy, loop_points) = (opts.points, opts.loop_points);
    let mut versioned = 0;
    let (loops, entry, manual) = placement(func, point, policy, entry_allowed);
    // Hoisting first, innermost loops first (the walk lists loops in
    // pre-order): a hoist replaces its loop in place and rewrites only code
    // inside it, so every position still to be used stays valid. A loop
    // whose inner loop was hoisted now contains that point's call: it is
    // hoisted as a loop that calls (`--hoist-calls on`) or gets an inline
    // point.
    // Versioning doubles a loop; an innermost loop that will move
    // (`outline.rs`, stage `Leaves`) needs only the hoisted form, whose
    // flag check becomes an exit of its new function.
    let leaves_move = opts.outline != Outline::Off && crate::outline::is_large(func);
    let unroll = opts.unroll_checks == UnrollChecks::On;
    let hoist_calls = opts.hoist_calls == HoistCalls::On;
    // Loops that leave to an enclosing loop's point, by owner (`rerun.rs`).
    let owner = if loop_points == LoopPoints::Rerun && policy == PointPolicy::Loops {
        let nested: Vec<Nested> = loops
            .iter()
            .map(|l| Nested {
                seq: l.seq,
                enclosing: l.enclosing,
            })
            .collect();
        crate::rerun::owners(func, &nested, quiet)
    } else {
        HashMap::new()
    };
    let mut owned: HashMap<InstrSeqId, Vec<InstrSeqId>> = HashMap::new();
    for l in &loops {
        if let Some(o) = owner.get(&l.seq) {
            owned.entry(*o).or_default().push(l.seq);
        }
    }
    let counted = opts.counted_loops == CountedLoops::On;
    // Nests first, while their inner loops are as the program wrote them:
    // the copy without checks and its tails copy them (`nest.rs`). The
    // original loop moves into the versioned structure and gets its point
    // below as before.
    let mut loops = loops;
    // Under `outer` the list leaves out inner loops, so only `loops` says
    // which loops a loop holds. The inner loops of a nest need no point.
    let mut in_nests = HashSet::new();
    if counted && opts.counted_nests == CountedNests::On && policy == PointPolicy::Loops {
        versioned += version_nests(func, &mut loops, (point, flag), &mut in_nests);
    }
    let mut inline = Vec::new();
    for l in loops.iter().rev().filter(|l| !in_nests.contains(&l.seq)) {
        // A short run of a counted loop takes a copy without checks; the
        // loop itself moves into the `else` arm of the test and gets its
        // point below as before (`counted.rs`).
        let c = (counted && l.leaf)
            .then(|| crate::counted::recognise(func, l.seq))
            .flatten();
        let (parent, index) = match c {
            Some(c) => {
                let (at, copy) = crate::counted::version(func, (l.parent, l.index), l.seq, c);
                // A copy that moves (`outline.rs`) runs faster unrolled,
                // as the loop with checks does (`matmul`, `pca`).
                if unroll && leaves_move {
                    crate::unroll::unroll(func, copy);
                }
                versioned += 1;
                at
            }
            _ => (l.parent, l.index),
        };
        if owner.contains_key(&l.seq) {
            continue;
        }
        if let Some(owned) = owned.get(&l.seq) {
            crate::hoist::hoist_rerun(func, (parent, index), l.seq, owned, point, flag, unroll);
            continue;
        }
        let can = loop_points != LoopPoints::Inline && crate::hoist::hoistable(func, l.seq, quiet);
        let hoisted = matches!(loop_points, LoopPoints::Hoisted | LoopPoints::Rerun);
        if can && (hoisted || leaves_move) {
            // A loop that stays beside its point's call (`$R`) got slower
            // unrolled (`cg`, 1.3x); one that moves, or that leaves to an
            // outer loop's point, faster (docs/prepare.md).
            let unroll = unroll && leaves_move;
            crate::hoist::hoist(func, parent, index, l.seq, point, flag, unroll);
        } else if can {
            crate::hoist::version(func, parent, index, l.seq, point, flag);
        } else if hoisted && hoist_calls && crate::hoist::hoistable_with_calls(func, l.seq) {
            // A loop that calls: Asyncify guards its body either way, but
            // the point's call leaves its head (`hoist.rs`). Not unrolled:
            // its body is not short and call-free.
            crate::hoist::hoist(func, parent, index, l.seq, point, flag, false);
        } else {
            inline.push(l.seq);
        }
    }
    for seq in inline {
        insert_point(func, seq, point, flag);
    }
    if entry {
        insert_point(func, func.entry_block(), point, flag);
    }
    (loops.len() as u32, entry, manual, versioned)
}

/// Version every counted nest among `loops` (`nest.rs`), updating where
/// each outer loop now is and adding its inner loops, which need no point,
/// to `in_nests`; returns how many.
fn version_nests(
    func: &mut LocalFunction,
    loops: &mut [LoopInfo],
    point: (FunctionId, GlobalId),
    in_nests: &mut HashSet<InstrSeqId>,
) -> u32 {
    let mut versioned = 0;
    for k in 0..loops.len() {
        if loops[k].leaf {
            continue;
        }
        let children = || loops.iter().filter(|l| l.enclosing == Some(k));
        let inner: Vec<InstrSeqId> = children().map(|l| l.seq).collect();
        // Only a loop whose inner loops hold no loop and no call.
        let Some(nest) = children()
            .all(|l| l.leaf)
            .then(|| crate::nest::recognise(func, loops[k].seq, &inner))
            .flatten()
        else {
            continue;
        };
        let at = crate::nest::version(
            func,
            (loops[k].parent, loops[k].index),
            loops[k].seq,
            &nest,
            point,
        );
        (loops[k].parent, loops[k].index) = at;
        in_nests.extend(inner);
        versioned += 1;
    }
    versioned
}

/// The loops of `func` that get a point under `policy` (in the walk's
/// pre-order), whether its entry gets one, and how many point calls the
/// program made itself.
fn placement(
    func: &LocalFunction,
    point: FunctionId,
    policy: PointPolicy,
    entry_allowed: bool,
) -> (Vec<LoopInfo>, bool, u32) {
    let mut walk = Walk {
        point,
        loops: Vec::new(),
        has_call: false,
        call_outside_loops: false,
        manual: 0,
    };
    walk.visit(func, func.entry_block(), 0, None);
    // Under `loops` and `outer` every loop that calls has a point, so when
    // every call is inside a loop, each run of the function passes a point
    // before it calls anything: its entry point would add nothing to the
    // bound on the time to the next point, even down a recursion
    // (`ackermann`, whose tail call became a loop).
    let loops_bound_calls =
        matches!(policy, PointPolicy::Loops | PointPolicy::Outer) && !walk.call_outside_loops;
    let entry =
        walk.has_call && entry_allowed && policy != PointPolicy::Manual && !loops_bound_calls;
    let loops = match policy {
        PointPolicy::Loops => walk.loops,
        // `enclosing` indexes the full list; only `rerun.rs` reads it, and
        // only under `loops`.
        PointPolicy::Outer => walk
            .loops
            .into_iter()
            .filter(|l| !(l.leaf && l.depth > 0))
            .collect(),
        PointPolicy::Functions | PointPolicy::Manual => Vec::new(),
    };
    (loops, entry, walk.manual)
}

/// A loop found by [`Walk`].
struct LoopInfo {
    seq: InstrSeqId,
    /// The sequence holding the `loop` instruction, and its position there.
    parent: InstrSeqId,
    index: usize,
    /// Contains no loop and no call.
    leaf: bool,
    /// Number of loops around it.
    depth: u32,
    /// Index in [`Walk::loops`] of the closest loop around it.
    enclosing: Option<usize>,
}

struct Walk {
    point: FunctionId,
    loops: Vec<LoopInfo>,
    has_call: bool,
    /// Some call is not inside any loop.
    call_outside_loops: bool,
    manual: u32,
}

impl Walk {
    /// Visit `seq` at loop depth `depth`, inside loop `enclosing` (an index
    /// in `loops`); returns whether it contains a loop or a call.
    fn visit(
        &mut self,
        func: &LocalFunction,
        seq: InstrSeqId,
        depth: u32,
        enclosing: Option<usize>,
    ) -> bool {
        let mut busy = false;
        for (index, (instr, _)) in func.block(seq).instrs.iter().enumerate() {
            match instr {
                Instr::Block(b) => busy |= self.visit(func, b.seq, depth, enclosing),
                Instr::Loop(Loop { seq: body }) => {
                    let slot = self.loops.len();
                    self.loops.push(LoopInfo {
                        seq: *body,
                        parent: seq,
                        index,
                        leaf: true,
                        depth,
                        enclosing,
                    });
                    self.loops[slot].leaf = !self.visit(func, *body, depth + 1, Some(slot));
                    busy = true;
                }
                Instr::IfElse(i) => {
                    busy |= self.visit(func, i.consequent, depth, enclosing);
                    busy |= self.visit(func, i.alternative, depth, enclosing);
                }
                Instr::Call(Call { func: callee }) => {
                    self.has_call = true;
                    self.call_outside_loops |= depth == 0;
                    busy = true;
                    if *callee == self.point {
                        self.manual += 1;
                    }
                }
                Instr::CallIndirect(CallIndirect { .. }) => {
                    self.has_call = true;
                    self.call_outside_loops |= depth == 0;
                    busy = true;
                }
                _ => {}
            }
        }
        busy
    }
}

/// Prepend `global.get $flag; if; call $point; end` to `seq`.
pub(crate) fn insert_point(
    func: &mut LocalFunction,
    seq: InstrSeqId,
    point: FunctionId,
    flag: GlobalId,
) {
    let mut body = func.builder_mut().instr_seq(seq);
    body.if_else_at(
        0,
        None,
        |then| {
            then.call(point);
        },
        |_| {},
    );
    body.instr_at(0, walrus::ir::GlobalGet { global: flag });
}

#[cfg(test)]
#[path = "instrument_tests.rs"]
pub(crate) mod tests;
