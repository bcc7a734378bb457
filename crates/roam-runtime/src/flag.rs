//! The migration flag: a word the host raises from any thread and the
//! guest polls at every migration point.
//!
//! Why: a migration point is `if roam.flag { call roam.migration_point }`.
//! `roam prepare` emits the flag as a mutable wasm global, but wasmtime
//! offers no way to write a global from a thread other than the guest's.
//! roam used to reach the guest's thread through epoch interruption (the
//! epoch callback set the global), which makes Cranelift add a load and a
//! compare at *every* loop back-edge and function entry on top of roam's own
//! check: matmul ran 2.2× slower than without it.
//!
//! How: before a prepared module is compiled, [`lower`] gives it a second
//! one-page memory, `roam.flag_memory`, and rewrites every read of the flag
//! global (`global.get $roam.flag`) into a load of word 0 of that memory
//! (`i32.const 0; i32.load $flag_memory`). roam's memory creator maps it like
//! any linear memory, at a base that never moves, so [`FlagWord`] can store
//! to it atomically from any thread. The prepared bytes themselves are not
//! changed: their hash, the snapshots that name it (format v1 included) and
//! migration peers are unaffected, and Binaryen (which cannot handle two
//! memories in version 108) never sees the second memory.
//!
//! Why the guest can neither forge nor hide a request: the program's own
//! code addresses only memory 0 (`prepare` and `check_prepared` refuse
//! modules with more than one memory), and the flag memory is added here,
//! after that check, with no instruction but the inserted loads referring to
//! it. A write to the old global (possible only in a hand-made module) now
//! changes nothing anyone reads. A program may still *call*
//! `roam.migration_point` itself; the host then looks at its own pending
//! request and returns when there is none.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use walrus::ir::{Const, Instr, InstrSeq, Load, LoadKind, MemArg, Value, VisitorMut};
use walrus::{ExportItem, GlobalId, MemoryId, ModuleConfig};

use crate::memory::Mapping;

/// Export name of the flag memory added by [`lower`].
pub(crate) const FLAG_MEMORY_EXPORT: &str = "roam.flag_memory";

/// Version of the rewrite done by [`lower`]; part of the compiled-code cache
/// key, so code compiled from an older rewrite is never reused.
pub(crate) const LOWERING_VERSION: u32 = 1;

/// Why [`lower`] failed.
#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    /// walrus could not parse the module.
    #[error("cannot parse the prepared module: {0}")]
    Parse(String),
    /// The module lacks the flag global `roam prepare` adds.
    #[error(
        "the module does not export the global `{}`",
        roam_prepare::FLAG_GLOBAL_EXPORT
    )]
    NoFlag,
    /// The module already exports the name roam gives the flag memory.
    #[error("the module already exports `{FLAG_MEMORY_EXPORT}`, a name roam reserves")]
    NameTaken,
}

/// Rewrite a prepared module so that its migration points read the flag
/// from a fresh one-page memory (see the module docs). Only the code that
/// is compiled changes; the caller keeps the prepared bytes.
pub(crate) fn lower(prepared: &[u8]) -> Result<Vec<u8>, LowerError> {
    let mut config = ModuleConfig::new();
    config
        .generate_producers_section(false)
        .generate_dwarf(false);
    let mut module = config
        .parse(prepared)
        .map_err(|e| LowerError::Parse(e.to_string()))?;
    let flag = module
        .exports
        .iter()
        .find_map(|e| match e.item {
            ExportItem::Global(g) if e.name == roam_prepare::FLAG_GLOBAL_EXPORT => Some(g),
            _ => None,
        })
        .ok_or(LowerError::NoFlag)?;
    if module.exports.iter().any(|e| e.name == FLAG_MEMORY_EXPORT) {
        return Err(LowerError::NameTaken);
    }
    let memory = module.memories.add_local(false, false, 1, Some(1), None);
    module.exports.add(FLAG_MEMORY_EXPORT, memory);
    let mut rewrite = Rewrite { flag, memory };
    for (_, func) in module.funcs.iter_local_mut() {
        let entry = func.entry_block();
        walrus::ir::dfs_pre_order_mut(&mut rewrite, func, entry);
    }
    Ok(module.emit_wasm())
}

struct Rewrite {
    flag: GlobalId,
    memory: MemoryId,
}

impl VisitorMut for Rewrite {
    fn start_instr_seq_mut(&mut self, seq: &mut InstrSeq) {
        let reads = |i: &Instr| matches!(i, Instr::GlobalGet(g) if g.global == self.flag);
        if !seq.instrs.iter().any(|(i, _)| reads(i)) {
            return;
        }
        let old = std::mem::take(&mut seq.instrs);
        for (instr, loc) in old {
            if !reads(&instr) {
                seq.instrs.push((instr, loc));
                continue;
            }
            seq.instrs.push((
                Instr::Const(Const {
                    value: Value::I32(0),
                }),
                loc,
            ));
            seq.instrs.push((
                Instr::Load(Load {
                    memory: self.memory,
                    kind: LoadKind::I32 { atomic: false },
                    arg: MemArg {
                        align: 4,
                        offset: 0,
                    },
                }),
                loc,
            ));
        }
    }
}

/// The flag word of one cell: word 0 of its flag memory. Cheap to clone,
/// usable from any thread.
#[derive(Clone)]
pub(crate) struct FlagWord {
    map: Arc<Mapping>,
}

impl FlagWord {
    /// Wrap the flag memory's mapping (at least one accessible page).
    pub(crate) fn new(map: Arc<Mapping>) -> Option<FlagWord> {
        (map.len() >= 4).then_some(FlagWord { map })
    }

    /// Whether both are the word of one flag memory.
    pub(crate) fn same(&self, other: &FlagWord) -> bool {
        Arc::ptr_eq(&self.map, &other.map)
    }

    fn word(&self) -> &AtomicU32 {
        // SAFETY: the mapping's base is page aligned, its first page is
        // read-write for as long as `map` lives (a one-page memory never
        // shrinks), and every host access to these four bytes is atomic.
        // The guest reads them with a plain aligned 32-bit load, which no
        // ISA roam supports can tear; it never writes them (no instruction
        // of the program refers to this memory).
        unsafe { AtomicU32::from_ptr(self.map.base().cast::<u32>()) }
    }

    /// Raise (`true`) or clear the flag. Sequentially consistent, so that a
    /// clear followed by a look at the pending request cannot miss a
    /// request made meanwhile (see `host::migration_point`).
    pub(crate) fn set(&self, up: bool) {
        self.word().store(u32::from(up), Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_read_becomes_a_load_of_the_flag_memory() {
        let wat = r#"(module
          (import "roam" "migration_point" (func $p))
          (memory (export "roam.memory") 1)
          (global $f (export "roam.flag") (mut i32) (i32.const 0))
          (func (export "_start")
            (if (global.get $f) (then (call $p)))
            (loop $l (if (global.get $f) (then (call $p))) (br_if $l (i32.const 0)))))"#;
        let lowered = lower(&wat::parse_str(wat).unwrap()).unwrap();
        let text = wasmprinter::print_bytes(&lowered).unwrap();
        assert!(!text.contains("global.get"), "{text}");
        assert_eq!(text.matches("i32.load 1").count(), 2, "{text}");
        assert!(
            text.contains("(export \"roam.flag_memory\" (memory 1))"),
            "{text}"
        );
    }

    #[test]
    fn a_module_without_the_flag_or_with_the_reserved_name_is_refused() {
        let none = wat::parse_str(r#"(module (memory 1))"#).unwrap();
        assert!(matches!(lower(&none), Err(LowerError::NoFlag)));
        let taken = wat::parse_str(
            r#"(module (memory (export "roam.flag_memory") 1)
                 (global (export "roam.flag") (mut i32) (i32.const 0)))"#,
        )
        .unwrap();
        assert!(matches!(lower(&taken), Err(LowerError::NameTaken)));
        assert!(matches!(lower(b"junk"), Err(LowerError::Parse(_))));
    }
}
