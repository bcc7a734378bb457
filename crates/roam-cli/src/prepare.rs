//! `roam prepare`.

use anyhow::Context;

use crate::args::PrepareArgs;

pub fn main(a: PrepareArgs) -> anyhow::Result<i32> {
    let input =
        std::fs::read(&a.input).with_context(|| format!("cannot read {}", a.input.display()))?;
    let defaults = roam_prepare::PrepareOptions::default();
    let opts = roam_prepare::PrepareOptions {
        points: a.points.into(),
        wasm_opt: a.wasm_opt,
        asyncify_scope: a.asyncify_scope.unwrap_or(defaults.asyncify_scope),
        entry_points: a.entry_points.unwrap_or(defaults.entry_points),
        loop_points: a.loop_points.unwrap_or(defaults.loop_points),
        point_calls: a.point_calls.unwrap_or(defaults.point_calls),
        outline: a.outline_loops.unwrap_or(defaults.outline),
        rerun_calls: a.rerun_calls.unwrap_or(defaults.rerun_calls),
        quiet_indirect: a.quiet_indirect.unwrap_or(defaults.quiet_indirect),
        unroll_checks: a.unroll_checks.unwrap_or(defaults.unroll_checks),
        hoist_calls: a.hoist_calls.unwrap_or(defaults.hoist_calls),
        counted_loops: a.counted_loops.unwrap_or(defaults.counted_loops),
        counted_nests: a.counted_nests.unwrap_or(defaults.counted_nests),
        bulk_chunks: a.bulk_chunks.unwrap_or(defaults.bulk_chunks),
        trim_outlined: a.trim_outlined.unwrap_or(defaults.trim_outlined),
        turn_compares: a.turn_compares.unwrap_or(defaults.turn_compares),
        lift_exits: a.lift_exits.unwrap_or(defaults.lift_exits),
        opt_level: a.opt.unwrap_or(defaults.opt_level),
        capture: match a.capture {
            Some(c) => c,
            None => roam_prepare::Capture::from_env()
                .with_context(|| roam_prepare::ENV_CAPTURE.to_string())?,
        },
        ..defaults
    };
    let out = roam_prepare::prepare(&input, &opts)
        .with_context(|| format!("cannot prepare {}", a.input.display()))?;
    std::fs::write(&a.output, &out.bytes)
        .with_context(|| format!("cannot write {}", a.output.display()))?;
    if out.already_prepared {
        eprintln!(
            "roam: {} was already prepared; copied unchanged",
            a.input.display()
        );
    } else {
        let s = &out.stats;
        eprintln!(
            "roam: prepared {} -> {} ({} -> {} bytes; {} loop, {} function, {} manual migration points; {} loops outlined; {} pure functions run again instead of unwinding; {} counted loops without checks on short runs; {} bulk-memory instructions split into chunks when long; {} functions that return before a call that ends the program)",
            a.input.display(),
            a.output.display(),
            input.len(),
            out.bytes.len(),
            s.loop_points,
            s.function_points,
            s.manual_points,
            out.outlined_loops,
            out.rerun_functions,
            out.counted_loops,
            out.bulk_split,
            out.lifted_exits
        );
        if let Some(why) = &out.fallback {
            eprintln!("roam: prepared with Asyncify: capture by records and rewind copies cannot handle this module ({why})");
        }
        if let Some(eh) = out.eh {
            let (how, calls) = match out.section.capture() {
                roam_prepare::Capture::Returns => ("returns", "calls checked on return"),
                _ => ("exceptions", "calls in try_table"),
            };
            eprintln!(
                "roam: capture by {how}: {} sites ({} points, {} blocking imports, {} {calls}, counted in run forms and copies), {} functions with rewind copies, {} stack values moved to locals",
                eh.sites, eh.points, eh.imports, eh.wrapped, eh.copies, eh.moved
            );
        }
    }
    Ok(0)
}
