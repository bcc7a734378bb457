//! Writing one function twice: its run form, which captures, and its
//! rewind copy, which also restores.
//!
//! Both are written from the unchanged input function by one walk, so the
//! two agree on every site's number and on the locals its record holds
//! (they share walrus's local ids; walrus numbers locals per function when
//! it writes the module).
//!
//! The run form changes little: a point or a blocking import checks
//! `roam.state` after the host returns, and stores its record and throws
//! when the host began an unwind; a call that may reach one sits in a
//! `try_table` whose handler stores the frame's record and rethrows.
//! Under `--capture returns` a frame leaves by returning zeros instead of
//! throwing, and each such call is followed by the same check of
//! `roam.state` and the same record.
//! Operand-stack values under such a call, or under a block that holds
//! one, are moved to locals first, so that the record can hold them.
//!
//! The rewind copy adds Asyncify's skip structure, but only here. A block
//! is cut at each *kid* (an instruction that holds sites: a site itself, or
//! a block, loop or `if` around some): a kid's inputs are moved to locals
//! before it and its results after, so every stretch between kids leaves
//! the stack as it found it. While rewinding, each stretch is skipped, each
//! kid whose sites do not include the frame's site is skipped, and the one
//! that does is entered: an `if` takes the arm that holds the site, and a
//! call goes to its callee's rewind copy. Where the site is a point or a
//! blocking import, the host is called again, ends the rewind, and the rest
//! of the function runs as it would have. On entry, a copy pops its
//! record, read from the top of the buffer down, into its locals.

use std::collections::HashMap;

use walrus::ir::{
    BinaryOp, Binop, Block, Br, BrIf, BrTable, Call, CallIndirect, Const, GlobalGet, GlobalSet,
    IfElse, Instr, InstrSeqId, InstrSeqType, Load, LoadKind, LocalGet, LocalSet, Loop, MemArg,
    Select, Throw, ThrowRef, TryTable, TryTableCatch, Unreachable, Value,
};
use walrus::{
    FunctionBuilder, FunctionId, GlobalId, LocalFunction, LocalId, MemoryId, ModuleTypes, RefType,
    TableId, TagId, ValType,
};

use super::EhStats;

/// `roam.state` while running normally.
pub const NORMAL: i32 = 0;
/// `roam.state` while the stack unwinds into the buffer.
pub const UNWINDING: i32 = 1;
/// `roam.state` while the stack is rebuilt from the buffer.
pub const REWINDING: i32 = 2;

/// What a kid is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KidKind {
    /// A block, loop or `if` that holds sites; `then` is the range of an
    /// `if`'s first arm, if it holds any.
    Control { then: Option<(u32, u32)> },
    /// A call of `roam.migration_point`.
    Point,
    /// A call of an import that may block and suspend.
    Import,
    /// A call that may reach a point or a blocking import.
    Wrapped,
}

/// An instruction that holds sites.
#[derive(Debug, Clone)]
pub(crate) struct Kid {
    pub kind: KidKind,
    /// The first and last site it holds (a site holds itself).
    pub lo: u32,
    pub hi: u32,
    /// Values under its inputs, moved to these locals, bottom first.
    pub under: Vec<(LocalId, ValType)>,
    /// Its inputs (arguments, the table index, an `if`'s condition).
    pub ins: Vec<(LocalId, ValType)>,
    /// Its results.
    pub outs: Vec<(LocalId, ValType)>,
}

/// One function's kids and records.
#[derive(Debug, Default)]
pub(crate) struct FnPlan {
    pub kids: HashMap<(InstrSeqId, usize), Kid>,
    /// Each site of the function: its number and the locals its record
    /// holds, in record order.
    pub records: Vec<(u32, Vec<(LocalId, ValType)>)>,
    /// The copy's local that holds the site being rewound to.
    pub target: Option<LocalId>,
}

/// What every function's writer shares.
pub(crate) struct Ctx {
    pub state: GlobalId,
    pub cursor: GlobalId,
    pub end: GlobalId,
    pub memory: MemoryId,
    /// The tag a point throws; `None` when frames leave by returning
    /// (`--capture returns`).
    pub tag: Option<TagId>,
    /// Each function's rewind copy.
    pub copies: HashMap<FunctionId, FunctionId>,
    /// Site number → rewind copy of the function that holds it, for
    /// indirect calls while rewinding.
    pub by_site: Option<TableId>,
}

/// Bytes a record of these values takes before its site word.
pub(crate) fn record_size(values: &[(LocalId, ValType)]) -> u32 {
    values.iter().map(|(_, t)| slot_width(*t)).sum()
}

/// Bytes one value's slot takes in a record: 8, or 16 for `v128`.
pub(super) fn slot_width(ty: ValType) -> u32 {
    if ty == ValType::V128 {
        16
    } else {
        8
    }
}

/// Each value of a record with the offset of its slot: the one layout
/// that stores, loads and [`record_size`] share.
pub(super) fn slots(
    values: &[(LocalId, ValType)],
) -> impl Iterator<Item = (&(LocalId, ValType), u64)> {
    values.iter().scan(0u64, |offset, v| {
        let at = *offset;
        *offset += u64::from(slot_width(v.1));
        Some((v, at))
    })
}

pub(super) fn i32c(v: i32) -> Instr {
    Instr::Const(Const {
        value: Value::I32(v),
    })
}
pub(super) fn bin(op: BinaryOp) -> Instr {
    Instr::Binop(Binop { op })
}
pub(super) fn gget(global: GlobalId) -> Instr {
    Instr::GlobalGet(GlobalGet { global })
}
pub(super) fn gset(global: GlobalId) -> Instr {
    Instr::GlobalSet(GlobalSet { global })
}
pub(super) fn get(l: &(LocalId, ValType)) -> Instr {
    Instr::LocalGet(LocalGet { local: l.0 })
}
pub(super) fn set(l: &(LocalId, ValType)) -> Instr {
    Instr::LocalSet(LocalSet { local: l.0 })
}

/// Writes one function in one of its two forms.
pub(crate) struct Writer<'a> {
    pub src: &'a LocalFunction,
    pub plan: &'a FnPlan,
    pub ctx: &'a Ctx,
    pub types: &'a mut ModuleTypes,
    pub stats: &'a mut EhStats,
    /// Writing the rewind copy.
    pub rewind: bool,
    pub(super) fb: FunctionBuilder,
    labels: HashMap<InstrSeqId, InstrSeqId>,
    /// The function's result types, for a frame that leaves by returning.
    results: Vec<ValType>,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(
        src: &'a LocalFunction,
        plan: &'a FnPlan,
        ctx: &'a Ctx,
        types: &'a mut ModuleTypes,
        stats: &'a mut EhStats,
        rewind: bool,
    ) -> Self {
        let ty = types.get(src.ty()).clone();
        let fb = FunctionBuilder::new(types, ty.params(), ty.results());
        Writer {
            src,
            plan,
            ctx,
            types,
            stats,
            rewind,
            fb,
            labels: HashMap::new(),
            results: ty.results().to_vec(),
        }
    }

    /// The function, with the input's arguments (and so its locals).
    pub(crate) fn finish(mut self, name: Option<String>) -> LocalFunction {
        let body = self.fb.func_body_id();
        self.labels.insert(self.src.entry_block(), body);
        let mut instrs = if self.rewind {
            self.prologue()
        } else {
            Vec::new()
        };
        instrs.extend(self.seq(self.src.entry_block()));
        self.put(body, instrs);
        if let Some(n) = name {
            self.fb.name(n);
        }
        self.fb.local_func(self.src.args.clone())
    }

    fn put(&mut self, seq: InstrSeqId, instrs: Vec<Instr>) {
        let loc = walrus::InstrLocId::default();
        self.fb
            .instr_seq(seq)
            .instrs_mut()
            .extend(instrs.into_iter().map(|i| (i, loc)));
    }

    pub(super) fn new_seq(&mut self, ty: InstrSeqType, instrs: Vec<Instr>) -> InstrSeqId {
        let id = self.fb.dangling_instr_seq(ty).id();
        self.put(id, instrs);
        id
    }

    /// `if (body) end` with nothing in the `else` arm; the condition is
    /// already on the stack.
    pub(super) fn when(&mut self, body: Vec<Instr>) -> Instr {
        let then = self.new_seq(InstrSeqType::Simple(None), body);
        let empty = self.new_seq(InstrSeqType::Simple(None), Vec::new());
        Instr::IfElse(IfElse {
            consequent: then,
            alternative: empty,
        })
    }

    fn seq_type(&mut self, params: &[ValType], results: &[ValType]) -> InstrSeqType {
        InstrSeqType::new(self.types, params, results)
    }

    /// A copy of the input's block `from`, written in this form.
    fn nested(&mut self, from: InstrSeqId) -> InstrSeqId {
        let ty = self.src.block(from).ty;
        let to = self.fb.dangling_instr_seq(ty).id();
        self.labels.insert(from, to);
        let instrs = self.seq(from);
        self.put(to, instrs);
        to
    }

    fn label(&self, from: InstrSeqId) -> InstrSeqId {
        *self
            .labels
            .get(&from)
            .expect("a branch targets an enclosing block, already written")
    }

    /// An instruction that holds no site, written as it is.
    fn plain(&mut self, instr: &Instr) -> Instr {
        match instr {
            Instr::Block(b) => Instr::Block(Block {
                seq: self.nested(b.seq),
            }),
            Instr::Loop(l) => Instr::Loop(Loop {
                seq: self.nested(l.seq),
            }),
            Instr::IfElse(i) => Instr::IfElse(IfElse {
                consequent: self.nested(i.consequent),
                alternative: self.nested(i.alternative),
            }),
            Instr::Br(b) => Instr::Br(Br {
                block: self.label(b.block),
            }),
            Instr::BrIf(b) => Instr::BrIf(BrIf {
                block: self.label(b.block),
            }),
            Instr::BrTable(t) => Instr::BrTable(BrTable {
                blocks: t.blocks.iter().map(|b| self.label(*b)).collect(),
                default: self.label(t.default),
            }),
            other => other.clone(),
        }
    }

    /// The instructions of block `from` in this form.
    fn seq(&mut self, from: InstrSeqId) -> Vec<Instr> {
        let src = self.src;
        // The stretch before the first kid, then each kid (its code, its
        // last site) and the stretch after it.
        let mut first = Vec::new();
        let mut kids: Vec<(Vec<Instr>, u32, Vec<Instr>)> = Vec::new();
        for (i, (instr, _)) in src.block(from).instrs.iter().enumerate() {
            let Some(kid) = self.plan.kids.get(&(from, i)) else {
                let written = self.plain(instr);
                match kids.last_mut() {
                    Some(k) => k.2.push(written),
                    None => first.push(written),
                }
                continue;
            };
            let moved = !kid.under.is_empty();
            if !self.rewind {
                self.stats.moved += kid.under.len() as u32;
            }
            let spill_ins = self.rewind || moved || kid.kind == KidKind::Import;
            let spill_outs = self.rewind || moved;
            let before = match kids.last_mut() {
                Some(k) => &mut k.2,
                None => &mut first,
            };
            if spill_ins {
                before.extend(kid.ins.iter().rev().map(set));
            }
            before.extend(kid.under.iter().rev().map(set));
            let mut core = self.kid(instr, kid, spill_ins);
            if spill_outs {
                core.extend(kid.outs.iter().rev().map(set));
            }
            let mut after = Vec::new();
            if spill_outs {
                after.extend(kid.under.iter().map(get));
                after.extend(kid.outs.iter().map(get));
            }
            kids.push((core, kid.hi, after));
        }
        if !self.rewind || kids.is_empty() {
            let mut out = first;
            for (core, _, after) in kids {
                out.extend(core);
                out.extend(after);
            }
            return out;
        }
        self.dispatch(first, kids)
    }

    /// Rewind copy: the stretches and kids of one block, nested so that a
    /// rewind jumps straight to the kid that holds its site:
    ///
    /// ```text
    /// block $k_n ... block $k_1
    ///     (if rewinding: br_table $k_1 .. $k_n by the site)   stretch 0
    ///   end  kid 1  stretch 1
    /// ... end  kid n  stretch n
    /// ```
    ///
    /// Every stretch leaves the stack as it found it, so each `end` is a
    /// point where the stack is empty. Normal running costs one test of
    /// `roam.state` per entry into the block.
    fn dispatch(
        &mut self,
        first: Vec<Instr>,
        kids: Vec<(Vec<Instr>, u32, Vec<Instr>)>,
    ) -> Vec<Instr> {
        let t = self.plan.target.expect("a rewind copy has a target local");
        let labels: Vec<InstrSeqId> = kids
            .iter()
            .map(|_| self.fb.dangling_instr_seq(InstrSeqType::Simple(None)).id())
            .collect();
        // Which kid holds the site: how many end before it.
        let mut pick = vec![i32c(0)];
        for (_, hi, _) in &kids[..kids.len() - 1] {
            pick.extend([
                Instr::LocalGet(LocalGet { local: t }),
                i32c(*hi as i32),
                bin(BinaryOp::I32GtU),
                bin(BinaryOp::I32Add),
            ]);
        }
        pick.push(Instr::BrTable(BrTable {
            blocks: labels.clone().into(),
            default: labels[0],
        }));
        let go = self.when(pick);
        let mut inner = vec![
            gget(self.ctx.state),
            i32c(REWINDING),
            bin(BinaryOp::I32Eq),
            go,
        ];
        inner.extend(first);
        let mut kids = kids.into_iter();
        let mut out = Vec::new();
        for (i, label) in labels.iter().enumerate() {
            self.put(*label, std::mem::take(&mut inner));
            let (core, _, after) = kids.next().expect("one kid per label");
            let mut next = vec![Instr::Block(Block { seq: *label })];
            next.extend(core);
            next.extend(after);
            if i + 1 == labels.len() {
                out = next;
            } else {
                inner = next;
            }
        }
        out
    }

    /// `(local.get t) - lo <=u hi - lo`: the site rewound to is in range.
    fn target_in(&self, lo: u32, hi: u32) -> Vec<Instr> {
        self.target_cmp(lo, hi, BinaryOp::I32LeU)
    }

    /// The opposite of [`Writer::target_in`].
    pub(super) fn target_out(&self, lo: u32, hi: u32) -> Vec<Instr> {
        self.target_cmp(lo, hi, BinaryOp::I32GtU)
    }

    fn target_cmp(&self, lo: u32, hi: u32, op: BinaryOp) -> Vec<Instr> {
        let t = self.plan.target.expect("a rewind copy has a target local");
        vec![
            Instr::LocalGet(LocalGet { local: t }),
            i32c(lo as i32),
            bin(BinaryOp::I32Sub),
            i32c((hi - lo) as i32),
            bin(op),
        ]
    }

    /// A kid in this form, its inputs on the stack (or in its `ins`
    /// locals if `spilled`, which this pushes).
    fn kid(&mut self, instr: &Instr, kid: &Kid, spilled: bool) -> Vec<Instr> {
        let mut out = Vec::new();
        if spilled && !(self.rewind && kid.kind == KidKind::Wrapped) {
            out.extend(kid.ins.iter().map(get));
        }
        match kid.kind {
            KidKind::Control { then } => {
                if let (true, Instr::IfElse(_)) = (self.rewind, instr) {
                    // The condition is on the stack; while rewinding, take
                    // the arm that holds the site instead.
                    match then {
                        Some((lo, hi)) => out.extend(self.target_in(lo, hi)),
                        None => out.push(i32c(0)),
                    }
                    out.extend([
                        gget(self.ctx.state),
                        i32c(REWINDING),
                        bin(BinaryOp::I32Ne),
                        Instr::Select(Select { ty: None }),
                    ]);
                }
                out.push(self.plain(instr));
            }
            KidKind::Point | KidKind::Import => {
                if kid.kind == KidKind::Point {
                    self.stats.points += 1;
                } else {
                    self.stats.imports += 1;
                }
                out.push(instr.clone());
                let record = self.stores(kid.lo);
                let throw = {
                    let mut r = record;
                    match self.ctx.tag {
                        Some(tag) => r.push(Instr::Throw(Throw { tag })),
                        None => r.extend(self.leave()),
                    }
                    r
                };
                let then = self.when(throw);
                out.extend([
                    gget(self.ctx.state),
                    i32c(UNWINDING),
                    bin(BinaryOp::I32Eq),
                    then,
                ]);
            }
            KidKind::Wrapped => {
                self.stats.wrapped += 1;
                let results: Vec<ValType> = kid.outs.iter().map(|o| o.1).collect();
                if self.rewind {
                    let call = self.call_or_rewind(instr, kid, &results);
                    out.extend(self.wrap(call, kid.lo, &[], &results));
                } else {
                    // Spilled or not, the arguments are on the stack when
                    // the try_table starts, and it takes them.
                    let params: Vec<ValType> = kid.ins.iter().map(|i| i.1).collect();
                    out.extend(self.wrap(instr.clone(), kid.lo, &params, &results));
                }
            }
        }
        out
    }

    /// Return from the function with zero results.
    fn leave(&self) -> Vec<Instr> {
        let mut out: Vec<Instr> = self
            .results
            .iter()
            .map(|t| match t {
                ValType::I32 => i32c(0),
                ValType::I64 => Instr::Const(Const {
                    value: Value::I64(0),
                }),
                ValType::F32 => Instr::Const(Const {
                    value: Value::F32(0.0),
                }),
                ValType::F64 => Instr::Const(Const {
                    value: Value::F64(0.0),
                }),
                ValType::V128 => Instr::Const(Const {
                    value: Value::V128(0),
                }),
                ValType::Ref(r) => Instr::RefNull(walrus::ir::RefNull { ty: *r }),
            })
            .collect();
        out.push(Instr::Return(walrus::ir::Return {}));
        out
    }

    /// Rewind copy: `if rewinding (call the callee's copy) else (call)`,
    /// both with the arguments from the kid's `ins`.
    fn call_or_rewind(&mut self, instr: &Instr, kid: &Kid, results: &[ValType]) -> Instr {
        let mut normal: Vec<Instr> = kid.ins.iter().map(get).collect();
        normal.push(instr.clone());
        let mut again: Vec<Instr> = Vec::new();
        match instr {
            Instr::Call(Call { func }) => {
                again.extend(kid.ins.iter().map(get));
                let callee = self.ctx.copies.get(func).copied().unwrap_or(*func);
                again.push(Instr::Call(Call { func: callee }));
            }
            Instr::CallIndirect(CallIndirect { ty, .. }) => {
                let args = &kid.ins[..kid.ins.len() - 1];
                again.extend(args.iter().map(get));
                match self.ctx.by_site {
                    Some(table) => {
                        // The callee's record is the next one down: its site
                        // word picks its copy.
                        again.extend([
                            gget(self.ctx.cursor),
                            i32c(8),
                            bin(BinaryOp::I32Sub),
                            Instr::Load(Load {
                                memory: self.ctx.memory,
                                kind: LoadKind::I32 { atomic: false },
                                arg: MemArg {
                                    align: 4,
                                    offset: 0,
                                },
                            }),
                            Instr::CallIndirect(CallIndirect { ty: *ty, table }),
                        ]);
                    }
                    None => again.push(Instr::Unreachable(Unreachable {})),
                }
            }
            _ => unreachable!("a wrapped kid is a call"),
        }
        let ty = self.seq_type(&[], results);
        let then = self.new_seq(ty, again);
        let otherwise = self.new_seq(ty, normal);
        Instr::Block(Block {
            seq: self.new_seq(
                ty,
                vec![
                    gget(self.ctx.state),
                    i32c(REWINDING),
                    bin(BinaryOp::I32Eq),
                    Instr::IfElse(IfElse {
                        consequent: then,
                        alternative: otherwise,
                    }),
                ],
            ),
        })
    }

    /// ```text
    /// block $done (param P) (result R)
    ///   block $h (param P) (result exnref)
    ///     try_table (param P) (result R) (catch_all_ref $h)
    ///       call
    ///     end
    ///     br $done
    ///   end
    ///   (if unwinding: store the record)  throw_ref
    /// end
    /// ```
    ///
    /// When frames leave by returning (no tag):
    ///
    /// ```text
    /// call
    /// (if unwinding: store the record, return zeros)
    /// ```
    fn wrap(
        &mut self,
        call: Instr,
        site: u32,
        params: &[ValType],
        results: &[ValType],
    ) -> Vec<Instr> {
        if self.ctx.tag.is_none() {
            let mut record = self.stores(site);
            record.extend(self.leave());
            let then = self.when(record);
            return vec![
                call,
                gget(self.ctx.state),
                i32c(UNWINDING),
                bin(BinaryOp::I32Eq),
                then,
            ];
        }
        let exn = ValType::Ref(RefType::EXNREF);
        let ty = self.seq_type(params, results);
        let tried = self.new_seq(ty, vec![call]);
        let done = self.fb.dangling_instr_seq(ty).id();
        let handler_ty = self.seq_type(params, &[exn]);
        let handler = self.new_seq(
            handler_ty,
            vec![
                Instr::TryTable(TryTable {
                    seq: tried,
                    catches: Vec::new(),
                }),
                Instr::Br(Br { block: done }),
            ],
        );
        // The catch clause names the handler block, which exists now.
        let loc = walrus::InstrLocId::default();
        self.fb.instr_seq(handler).instrs_mut()[0] = (
            Instr::TryTable(TryTable {
                seq: tried,
                catches: vec![TryTableCatch::CatchAllRef { label: handler }],
            }),
            loc,
        );
        let record = self.stores(site);
        let then = self.when(record);
        self.put(
            done,
            vec![
                Instr::Block(Block { seq: handler }),
                gget(self.ctx.state),
                i32c(UNWINDING),
                bin(BinaryOp::I32Eq),
                then,
                Instr::ThrowRef(ThrowRef {}),
            ],
        );
        vec![Instr::Block(Block { seq: done })]
    }
}
