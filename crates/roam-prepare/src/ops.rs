//! Classify WebAssembly operators that roam must refuse.
//!
//! Refusals must name the offending instruction and the reason, so this
//! module derives both from wasmparser's operator table (grouped by proposal)
//! rather than keeping a hand-written list that would fall out of date.

use wasmparser::Operator;

/// Why an instruction cannot be migrated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// Text-format name of the instruction, e.g. `table.grow`.
    pub instr: String,
    /// The feature and why roam refuses it.
    pub feature: &'static str,
}

macro_rules! define_classify {
    ($( @$proposal:ident $op:ident $({ $($arg:ident: $argty:ty),* })? => $visit:ident ($($ann:tt)*))*) => {
        /// Proposal name and visitor name of `op`.
        fn proposal_and_visit(op: &Operator<'_>) -> (&'static str, &'static str) {
            match op {
                $( Operator::$op { .. } => (stringify!($proposal), stringify!($visit)), )*
                _ => ("unknown", "visit_unknown"),
            }
        }
    };
}
wasmparser::for_each_operator!(define_classify);

/// The feature of the exception-handling proposal, which only roam's own
/// `--capture eh` output may use.
pub(crate) const EXCEPTIONS: &str = "exception handling";

/// The refusal for `op`, or `None` if roam supports it.
pub(crate) fn classify(op: &Operator<'_>) -> Option<Refusal> {
    let (proposal, visit) = proposal_and_visit(op);
    let feature = match op {
        Operator::TableSet { .. }
        | Operator::TableGrow { .. }
        | Operator::TableFill { .. }
        | Operator::TableCopy { .. }
        | Operator::TableInit { .. } => "tables mutated at run time",
        // Meaningless without `table.init`, and Binaryen cannot read it
        // (found by the generated-program differential test).
        Operator::ElemDrop { .. } => "element segments dropped at run time",
        _ => match proposal {
            // Shared memory and atomics run as they are, but for waits,
            // which `waits.rs` makes interruptible.
            "threads" => return None,
            "shared_everything_threads" => "shared globals and tables (shared-everything threads)",
            "exceptions" | "legacy_exceptions" => EXCEPTIONS,
            "tail_call" => "tail calls (Asyncify cannot unwind through them)",
            "gc" | "function_references" | "custom_descriptors" => {
                "GC / typed function references (not supported by Asyncify)"
            }
            "stack_switching" => "stack switching",
            "relaxed_simd" | "memory_control" | "wide_arithmetic" | "unknown" => {
                "a proposal not supported by the Asyncify toolchain"
            }
            _ => return None,
        },
    };
    Some(Refusal {
        instr: text_name(visit),
        feature,
    })
}

/// Best-effort text-format name from a visitor name: `visit_table_grow` ->
/// `table.grow`, `visit_i32_atomic_rmw_add` -> `i32.atomic.rmw.add`.
fn text_name(visit: &str) -> String {
    const NAMESPACES: &[&str] = &[
        "i32", "i64", "f32", "f64", "v128", "memory", "table", "ref", "atomic", "rmw", "rmw8",
        "rmw16", "rmw32", "elem", "data", "local", "global", "array", "struct", "any", "extern",
    ];
    let name = visit.strip_prefix("visit_").unwrap_or(visit);
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some((head, tail)) = rest.split_once('_') {
        out.push_str(head);
        if NAMESPACES.contains(&head) {
            out.push('.');
        } else {
            out.push('_');
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_text_format() {
        assert_eq!(text_name("visit_table_grow"), "table.grow");
        assert_eq!(text_name("visit_try_table"), "try_table");
        assert_eq!(text_name("visit_i32_atomic_rmw_add"), "i32.atomic.rmw.add");
        assert_eq!(
            text_name("visit_memory_atomic_notify"),
            "memory.atomic.notify"
        );
        assert_eq!(text_name("visit_throw"), "throw");
    }

    #[test]
    fn table_mutation_is_refused_and_atomics_are_not() {
        let r = classify(&Operator::TableGrow { table: 0 }).unwrap();
        assert_eq!(r.instr, "table.grow");
        assert_eq!(r.feature, "tables mutated at run time");
        assert_eq!(classify(&Operator::AtomicFence), None);
        let r = classify(&Operator::Try {
            blockty: wasmparser::BlockType::Empty,
        })
        .unwrap();
        assert_eq!((r.instr.as_str(), r.feature), ("try", "exception handling"));
        let r = classify(&Operator::ReturnCall { function_index: 0 }).unwrap();
        assert!(r.feature.contains("tail calls"));
    }

    #[test]
    fn ordinary_operators_pass() {
        assert_eq!(classify(&Operator::Nop), None);
        assert_eq!(classify(&Operator::TableGet { table: 0 }), None);
        let r = classify(&Operator::ElemDrop { elem_index: 0 }).unwrap();
        assert_eq!(r.instr, "elem.drop");
        assert_eq!(classify(&Operator::TableSize { table: 0 }), None);
        assert_eq!(classify(&Operator::MemoryGrow { mem: 0 }), None);
        assert_eq!(classify(&Operator::I32Extend8S), None);
    }
}
