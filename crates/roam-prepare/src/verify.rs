//! Checking that a module which carries a `roam` section really is prepared.
//!
//! Why: the section is only a custom section, which anyone can append to any
//! module. Modules reach roam from users, snapshot files (embedded copies),
//! node uploads and migration peers, so a section proves nothing by itself.
//! Before the section is believed (by `prepare`, which returns such a module
//! unchanged, and by the runtime, which loads it), the module must pass the
//! same validation as an unprepared input, and what the section claims must
//! match what the module contains:
//!
//! - the exports the runtime drives: the five Asyncify functions,
//!   `roam.flag` (a mutable global), `roam.memory`;
//! - exactly one `roam.global.<i>` per mutable global the section lists, each
//!   a mutable global, and one `roam.table.<i>` per table;
//! - no other mutable global left unexported except Asyncify's own two (its
//!   state and data pointer), so no program state escapes a snapshot;
//!   `roam.spill.<i>` globals are the scratch copies around point calls
//!   (`spill.rs`), which hold nothing between snapshots; a hand-made module
//!   that keeps its own state there loses it on migration, which harms only
//!   that program; so are `roam.exit` and `roam.exit.<n>`, which hold a
//!   call that ends the program only between a return and the call
//!   (`leave.rs`), and `roam.abort`, which pure functions raise while
//!   they give up (`pure.rs`) and which is clear at every point, and
//!   `roam.budget`, which is set again before it is next read;
//! - the `roam.migration_point` import, if the section counts any point.
//!
//! A hash of the module stored in the section was considered and rejected:
//! whoever forges a section can compute the hash too, so it would catch
//! accidents, not attacks, and the checks above catch both. What no check can
//! prove is that the Asyncify code itself is correct; a hand-made module with
//! stub exports passes. That only harms the program's own migration: the
//! module runs sandboxed either way, and the host acts only on exports it has
//! checked.

use std::collections::{BTreeSet, HashMap};

use wasmparser::{ExternalKind, Parser, Payload, TypeRef};

use crate::validate::validate_as;
use crate::{
    read_section, PointPolicy, RoamSection, SectionError, ValidateError, ABORT_GLOBAL_EXPORT,
    ASYNCIFY_EXPORTS, BUDGET_GLOBAL_EXPORT, CAPTURE_END_EXPORT, CAPTURE_GLOBAL_EXPORT,
    EXIT_ARG_EXPORT_PREFIX, EXIT_GLOBAL_EXPORT, FLAG_GLOBAL_EXPORT, GLOBAL_EXPORT_PREFIX,
    MEMORY_EXPORT, REWIND_EXPORT, SPILL_EXPORT_PREFIX, STATE_EXPORT, TABLE_EXPORT_PREFIX,
};

/// Mutable globals Asyncify adds and keeps unexported (`__asyncify_state`,
/// `__asyncify_data`); the runtime resets them through the Asyncify exports.
const ASYNCIFY_OWN_GLOBALS: usize = 2;

/// Why a module is not accepted as prepared.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// No `roam` section at all.
    #[error(
        "the module is not prepared (it has no `roam` section); run `roam prepare` on it first"
    )]
    NoSection,
    /// The section cannot be read.
    #[error(transparent)]
    Section(#[from] SectionError),
    /// The module fails the validation every input gets.
    #[error("the module carries a `roam` section but is refused: {0}")]
    Invalid(#[from] ValidateError),
    /// The module was prepared with `--capture eh-points`, a measurement
    /// ablation that nothing can restore.
    #[error(
        "the module was prepared with `--capture eh-points`, an ablation made only \
         to measure what points cost: roam cannot run, checkpoint or restore it; \
         prepare the original module without `--capture eh-points`"
    )]
    Experimental,
    /// The section does not describe this module.
    #[error(
        "the module carries a `roam` section that does not match its contents: {why}; \
         it was not prepared by roam or was altered afterwards, so prepare the original module again"
    )]
    Inconsistent {
        /// What does not match.
        why: String,
    },
}

fn inconsistent(why: impl Into<String>) -> CheckError {
    CheckError::Inconsistent { why: why.into() }
}

/// What the checks need from the module, in one pass.
#[derive(Default)]
struct Facts {
    /// Mutability of every global, in index order (imports first).
    global_mutable: Vec<bool>,
    /// Export name to (kind, index).
    exports: HashMap<String, (ExternalKind, u32)>,
}

fn facts(module: &[u8]) -> Result<Facts, CheckError> {
    let mut f = Facts::default();
    let malformed = |e| CheckError::Section(SectionError::Malformed(e));
    for payload in Parser::new(0).parse_all(module) {
        match payload.map_err(malformed)? {
            Payload::ImportSection(r) => {
                for imp in r.into_imports() {
                    if let TypeRef::Global(g) = imp.map_err(malformed)?.ty {
                        f.global_mutable.push(g.mutable);
                    }
                }
            }
            Payload::GlobalSection(r) => {
                for g in r {
                    f.global_mutable.push(g.map_err(malformed)?.ty.mutable);
                }
            }
            Payload::ExportSection(r) => {
                for e in r {
                    let e = e.map_err(malformed)?;
                    f.exports.insert(e.name.to_string(), (e.kind, e.index));
                }
            }
            _ => {}
        }
    }
    Ok(f)
}

/// Revision of what [`check_prepared`] accepts. A runtime may remember that
/// a module passed the check (by the module's hash and this number) so that
/// it does not validate megabytes of code on every run; raise it whenever
/// the check starts refusing something it accepted, so that no remembered
/// pass outlives a stricter check.
pub const CHECK_REVISION: u32 = 1;

/// Check that `module` is a prepared module whose `roam` section matches its
/// contents (see the module docs). Returns the section.
pub fn check_prepared(module: &[u8]) -> Result<RoamSection, CheckError> {
    let section = read_section(module)?.ok_or(CheckError::NoSection)?;
    if section.options.contains(";capture=eh-points") {
        return Err(CheckError::Experimental);
    }
    let eh = section.capture().by_records();
    let info = validate_as(module, eh)?;
    if info.shared_memory && section.capture() != crate::Capture::Returns {
        return Err(inconsistent(
            "it shares its memory (threads) but its section names a capture other than by returns, which roam does not run threads on",
        ));
    }
    let f = facts(module)?;
    let is_mutable_global = |index: u32| f.global_mutable.get(index as usize) == Some(&true);

    let funcs: &[&str] = if eh {
        &[REWIND_EXPORT]
    } else {
        ASYNCIFY_EXPORTS
    };
    for name in funcs {
        if !matches!(f.exports.get(*name), Some((ExternalKind::Func, _))) {
            return Err(inconsistent(format!(
                "it lacks the function export `{name}`"
            )));
        }
    }
    let eh_globals: &[&str] = if eh {
        &[STATE_EXPORT, CAPTURE_GLOBAL_EXPORT, CAPTURE_END_EXPORT]
    } else {
        &[]
    };
    match f.exports.get(FLAG_GLOBAL_EXPORT) {
        Some((ExternalKind::Global, i)) if is_mutable_global(*i) => {}
        _ => {
            return Err(inconsistent(format!(
                "it lacks the mutable global export `{FLAG_GLOBAL_EXPORT}`"
            )))
        }
    }
    if !matches!(
        f.exports.get(MEMORY_EXPORT),
        Some((ExternalKind::Memory, _))
    ) {
        return Err(inconsistent(format!(
            "it lacks the memory export `{MEMORY_EXPORT}`"
        )));
    }

    let mut exported_globals = BTreeSet::new();
    let mut exported_tables = BTreeSet::new();
    let mut accounted = BTreeSet::new();
    for (name, &(kind, index)) in &f.exports {
        if let Some(n) = name.strip_prefix(GLOBAL_EXPORT_PREFIX) {
            if kind != ExternalKind::Global || !is_mutable_global(index) {
                return Err(inconsistent(format!(
                    "export `{name}` is not a mutable global"
                )));
            }
            let n = n
                .parse::<u32>()
                .map_err(|_| inconsistent(format!("export `{name}` has no global number")))?;
            exported_globals.insert(n);
            accounted.insert(index);
        } else if let Some(n) = name.strip_prefix(TABLE_EXPORT_PREFIX) {
            let n = n
                .parse::<u32>()
                .ok()
                .filter(|_| kind == ExternalKind::Table)
                .ok_or_else(|| inconsistent(format!("export `{name}` is not a numbered table")))?;
            exported_tables.insert(n);
        } else if name.starts_with(SPILL_EXPORT_PREFIX)
            || name.starts_with(EXIT_ARG_EXPORT_PREFIX)
            || name == EXIT_GLOBAL_EXPORT
            || name == ABORT_GLOBAL_EXPORT
            || name == BUDGET_GLOBAL_EXPORT
            || eh_globals.contains(&name.as_str())
        {
            if kind != ExternalKind::Global || !is_mutable_global(index) {
                return Err(inconsistent(format!(
                    "export `{name}` is not a mutable global"
                )));
            }
            accounted.insert(index);
        }
    }
    let listed: BTreeSet<u32> = section.mutable_globals.iter().copied().collect();
    if exported_globals != listed {
        return Err(inconsistent(format!(
            "the section lists mutable globals {listed:?} but the module exports {exported_globals:?}"
        )));
    }
    let tables: BTreeSet<u32> = (0..section.tables).collect();
    // `--capture eh` may add one table of its own (rewind copies by site).
    let own_tables = u32::from(eh && info.tables == section.tables + 1);
    if exported_tables != tables || info.tables != section.tables + own_tables {
        return Err(inconsistent(format!(
            "the section counts {} tables, the module has {} and exports {exported_tables:?}",
            section.tables, info.tables
        )));
    }
    if let Some((_, flag)) = f.exports.get(FLAG_GLOBAL_EXPORT) {
        accounted.insert(*flag);
    }
    let unexported = (0..f.global_mutable.len() as u32)
        .filter(|&i| is_mutable_global(i) && !accounted.contains(&i))
        .count();
    if unexported > ASYNCIFY_OWN_GLOBALS {
        return Err(inconsistent(format!(
            "{unexported} mutable globals are not exported (at most {ASYNCIFY_OWN_GLOBALS}, \
             Asyncify's own, may be), so their state would be lost on migration"
        )));
    }
    let s = section.stats;
    let points = s.loop_points + s.function_points + s.manual_points;
    if points > 0 && info.migration_point_import.is_none() {
        return Err(inconsistent(format!(
            "the section counts {points} migration points but the module does not import `roam.migration_point`"
        )));
    }
    if section.points == PointPolicy::Manual && s.loop_points + s.function_points > 0 {
        return Err(inconsistent(
            "the section says points were manual only but counts inserted points",
        ));
    }
    Ok(section)
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
