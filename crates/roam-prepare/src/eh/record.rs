//! A frame's record: how the run form and the copy store it when the stack
//! unwinds, and how the copy loads it back on entry (the layout is in the
//! module docs of `eh/`).

use walrus::ir::{
    BinaryOp, Instr, Load, LoadKind, LocalGet, LocalSet, MemArg, Store, StoreKind, Unreachable,
};
use walrus::{LocalId, ValType};

use super::write::{
    bin, get, gget, gset, i32c, record_size, set, slots, FnPlan, Writer, REWINDING,
};

impl<'a> Writer<'a> {
    fn record(&self, site: u32) -> &'a [(LocalId, ValType)] {
        // A function's sites are numbered one after another.
        let plan: &'a FnPlan = self.plan;
        let first = plan.records.first().map_or(0, |r| r.0);
        let (s, record) = &plan.records[(site - first) as usize];
        debug_assert_eq!(*s, site);
        record
    }

    /// Store `site`'s record at the cursor and advance it: each value in an
    /// 8-byte slot (16 for `v128`), then the site word and 4 bytes of
    /// padding. A record that would pass `roam.capture_end` traps instead.
    pub(super) fn stores(&mut self, site: u32) -> Vec<Instr> {
        let values = self.record(site);
        let size = record_size(values);
        let m = self.ctx.memory;
        let store = |kind, align, offset| {
            Instr::Store(Store {
                memory: m,
                kind,
                arg: MemArg { align, offset },
            })
        };
        let trap = self.when(vec![Instr::Unreachable(Unreachable {})]);
        let c = self.ctx.cursor;
        let mut out = vec![
            gget(c),
            i32c((size + 8) as i32),
            bin(BinaryOp::I32Add),
            gget(self.ctx.end),
            bin(BinaryOp::I32GtU),
            trap,
        ];
        for (v, offset) in slots(values) {
            let (kind, align) = match v.1 {
                ValType::I32 => (StoreKind::I32 { atomic: false }, 4),
                ValType::I64 => (StoreKind::I64 { atomic: false }, 8),
                ValType::F32 => (StoreKind::F32, 4),
                ValType::F64 => (StoreKind::F64, 8),
                ValType::V128 => (StoreKind::V128, 8),
                ValType::Ref(_) => unreachable!("records hold no references (checked)"),
            };
            out.extend([gget(c), get(v), store(kind, align, offset)]);
            self.stats.stored += 1;
        }
        out.extend([
            gget(c),
            i32c(site as i32),
            store(StoreKind::I32 { atomic: false }, 4, u64::from(size)),
            gget(c),
            i32c((size + 8) as i32),
            bin(BinaryOp::I32Add),
            gset(c),
        ]);
        out
    }

    /// Rewind copy, on entry: pop the record into the locals.
    pub(super) fn prologue(&mut self) -> Vec<Instr> {
        let t = self.plan.target.expect("a rewind copy has a target local");
        let (c, m) = (self.ctx.cursor, self.ctx.memory);
        let load = |kind, align, offset| {
            Instr::Load(Load {
                memory: m,
                kind,
                arg: MemArg { align, offset },
            })
        };
        let (first, last) = match (self.plan.records.first(), self.plan.records.last()) {
            (Some(f), Some(l)) => (f.0, l.0),
            _ => return Vec::new(),
        };
        let mut body = vec![
            gget(c),
            i32c(8),
            bin(BinaryOp::I32Sub),
            gset(c),
            gget(c),
            load(LoadKind::I32 { atomic: false }, 4, 0),
            Instr::LocalSet(LocalSet { local: t }),
        ];
        // A site of another function: a corrupt buffer.
        let test = self.target_out(first, last);
        let trap = self.when(vec![Instr::Unreachable(Unreachable {})]);
        body.extend(test);
        body.push(trap);
        let plan: &'a FnPlan = self.plan;
        for (site, values) in &plan.records {
            let size = record_size(values);
            let mut pop = vec![gget(c), i32c(size as i32), bin(BinaryOp::I32Sub), gset(c)];
            for (v, offset) in slots(values) {
                let (kind, align) = match v.1 {
                    ValType::I32 => (LoadKind::I32 { atomic: false }, 4),
                    ValType::I64 => (LoadKind::I64 { atomic: false }, 8),
                    ValType::F32 => (LoadKind::F32, 4),
                    ValType::F64 => (LoadKind::F64, 8),
                    ValType::V128 => (LoadKind::V128, 8),
                    ValType::Ref(_) => unreachable!("records hold no references (checked)"),
                };
                pop.extend([gget(c), load(kind, align, offset), set(v)]);
            }
            let then = self.when(pop);
            body.extend([
                Instr::LocalGet(LocalGet { local: t }),
                i32c(*site as i32),
                bin(BinaryOp::I32Eq),
                then,
            ]);
        }
        let then = self.when(body);
        vec![
            gget(self.ctx.state),
            i32c(REWINDING),
            bin(BinaryOp::I32Eq),
            then,
        ]
    }
}
