//! What the exception transform must know of a function before it
//! rewrites it: the operand stack under every call and every block, loop
//! and `if` (from wasmparser's validator, which tracks it exactly), and the
//! locals live after each call that may unwind (a backward pass over
//! locals, as in `loop_io.rs`).
//!
//! walrus gives no stack heights, so the validator runs over the same bytes
//! walrus parsed, and its facts are matched to walrus's instructions by
//! their order in the body: both list calls and structured instructions in
//! pre-order (`then` before `else`), and neither keeps what follows an
//! unconditional branch in the same block. The counts are checked.

use std::collections::{HashMap, HashSet};

use walrus::ir::{Block, Br, BrIf, BrTable, Instr, InstrSeqId, LocalGet, LocalSet, LocalTee, Loop};
use walrus::{LocalFunction, LocalId, ValType};
use wasmparser::{BlockType, Operator, Parser, ValidPayload, Validator, WasmModuleResources};

use super::rewrite;
use crate::pipeline::PrepareError;
use crate::validate::SUPPORTED_FEATURES;

/// The operand stack at one call or structured instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Under {
    /// The values of the enclosing block under the instruction's inputs,
    /// bottom first.
    Values(Vec<ValType>),
    /// A reference value lies under it, which no capture can store.
    Reference,
    /// A block, loop or `if` that takes parameters.
    Params,
}

/// Every call and structured instruction of one function, in body order.
pub(crate) type Facts = Vec<Under>;

/// [`Facts`] of each local function, in code order.
pub(crate) fn operand_stacks(bytes: &[u8]) -> Result<Vec<Facts>, PrepareError> {
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
        // walrus drops what it parses in unreachable code, structured
        // instructions with all they hold, so it is skipped here too:
        // `skipped` counts the dead blocks, loops and `if`s we are inside.
        let mut skipped = 0usize;
        while !ops.eof() {
            let offset = ops.original_position();
            let op = ops.read().map_err(invalid)?;
            let dead = skipped > 0
                || v.get_control_frame(0)
                    .ok_or_else(|| rewrite("no control frame"))?
                    .unreachable;
            if dead {
                match &op {
                    Operator::Block { .. } | Operator::Loop { .. } | Operator::If { .. } => {
                        skipped += 1
                    }
                    Operator::End if skipped > 0 => skipped -= 1,
                    _ => {}
                }
                v.op(offset, &op).map_err(invalid)?;
                continue;
            }
            let inputs = match &op {
                Operator::Call { function_index } => {
                    let ty = v.resources().type_index_of_function(*function_index);
                    Some(params(&v, ty)?)
                }
                Operator::CallIndirect { type_index, .. } => {
                    Some(params(&v, Some(*type_index))? + 1)
                }
                Operator::Block { blockty } | Operator::Loop { blockty } => {
                    Some(block_params(&v, *blockty)?)
                }
                Operator::If { blockty } => Some(block_params(&v, *blockty)? + 1),
                _ => None,
            };
            if let Some(inputs) = inputs {
                let params = match &op {
                    Operator::Block { blockty }
                    | Operator::Loop { blockty }
                    | Operator::If { blockty } => block_params(&v, *blockty)? > 0,
                    _ => false,
                };
                here.push(under(&v, inputs, params)?);
            }
            v.op(offset, &op).map_err(invalid)?;
        }
        out.push(here);
    }
    Ok(out)
}

fn params<R: WasmModuleResources>(
    v: &wasmparser::FuncValidator<R>,
    ty: Option<u32>,
) -> Result<usize, PrepareError> {
    let sub = ty
        .and_then(|t| v.resources().sub_type_at(t))
        .ok_or_else(|| rewrite("a call's type is unknown"))?;
    Ok(sub.unwrap_func().params().len())
}

fn block_params<R: WasmModuleResources>(
    v: &wasmparser::FuncValidator<R>,
    ty: BlockType,
) -> Result<usize, PrepareError> {
    match ty {
        BlockType::Empty | BlockType::Type(_) => Ok(0),
        BlockType::FuncType(t) => params(v, Some(t)),
    }
}

fn under<R: WasmModuleResources>(
    v: &wasmparser::FuncValidator<R>,
    inputs: usize,
    params: bool,
) -> Result<Under, PrepareError> {
    let frame = v
        .get_control_frame(0)
        .ok_or_else(|| rewrite("no control frame"))?;
    if params {
        return Ok(Under::Params);
    }
    let height = v.operand_stack_height() as usize;
    let mine = height.saturating_sub(frame.height);
    if mine < inputs {
        return Err(rewrite("fewer values on the stack than a call takes"));
    }
    let mut values = Vec::with_capacity(mine - inputs);
    for depth in (inputs..mine).rev() {
        let ty = match v.get_operand_type(depth).flatten() {
            Some(wasmparser::ValType::I32) => ValType::I32,
            Some(wasmparser::ValType::I64) => ValType::I64,
            Some(wasmparser::ValType::F32) => ValType::F32,
            Some(wasmparser::ValType::F64) => ValType::F64,
            Some(wasmparser::ValType::V128) => ValType::V128,
            Some(wasmparser::ValType::Ref(_)) => return Ok(Under::Reference),
            None => return Err(rewrite("an operand's type is unknown in reachable code")),
        };
        values.push(ty);
    }
    Ok(Under::Values(values))
}

/// The calls and structured instructions of `func` in body order, as
/// [`operand_stacks`] lists them: `(seq, index)` of each.
pub(crate) fn positions(func: &LocalFunction) -> Vec<(InstrSeqId, usize)> {
    fn walk(func: &LocalFunction, seq: InstrSeqId, out: &mut Vec<(InstrSeqId, usize)>) {
        for (i, (instr, _)) in func.block(seq).instrs.iter().enumerate() {
            match instr {
                Instr::Block(Block { seq: s }) | Instr::Loop(Loop { seq: s }) => {
                    out.push((seq, i));
                    walk(func, *s, out);
                }
                Instr::IfElse(e) => {
                    out.push((seq, i));
                    walk(func, e.consequent, out);
                    walk(func, e.alternative, out);
                }
                Instr::Call(_) | Instr::CallIndirect(_) => out.push((seq, i)),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(func, func.entry_block(), &mut out);
    out
}

/// The locals live after each call in `want`: a backward pass over the
/// whole function, loop headers to a fixed point, the union over passes
/// recorded. Branches are over-approximated, so a few dead locals may be
/// kept.
pub(crate) fn liveness(
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
