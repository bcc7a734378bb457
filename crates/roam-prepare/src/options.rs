//! Options of `prepare` and their canonical text.
//!
//! The canonical text is stored in the `roam` section so that anyone holding
//! a prepared module can tell how it was made, and so that two preparations
//! with the same options are byte-identical. Machine-specific settings (the
//! path of `wasm-opt`) are deliberately left out of it.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where migration points are inserted.
///
/// A migration point costs one global load and one predictable branch while
/// the flag is clear; the policy trades that steady-state cost against how
/// quickly a running program reaches a point after the host asks it to stop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PointPolicy {
    /// Every loop header plus the entry of every function that makes a call
    /// (default). Bounds the time to the next point by the longest
    /// straight-line, call-free code path.
    #[default]
    Loops,
    /// Entry of every function that makes a call. Cheaper, but a long-running
    /// loop without calls never reaches a point.
    Functions,
    /// Only the program's own calls to the imported `roam.migration_point`.
    Manual,
    /// Like `Loops`, but without points in *leaf loops nested in another
    /// loop* (loops that contain no loop and no call). Asyncify then guards
    /// such a loop as one unit instead of instrumenting every iteration, so
    /// hot inner loops run at nearly plain speed; the price is that a
    /// checkpoint waits for the running inner loop to finish.
    Outer,
}

impl PointPolicy {
    /// The lowercase name used on the command line and in the `roam` section.
    pub fn as_str(self) -> &'static str {
        match self {
            PointPolicy::Loops => "loops",
            PointPolicy::Functions => "functions",
            PointPolicy::Manual => "manual",
            PointPolicy::Outer => "outer",
        }
    }
}

impl fmt::Display for PointPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`PointPolicy`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown migration-point policy `{0}`; use one of: loops, outer, functions, manual")]
pub struct ParsePolicyError(pub String);

impl FromStr for PointPolicy {
    type Err = ParsePolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "loops" => Ok(PointPolicy::Loops),
            "functions" => Ok(PointPolicy::Functions),
            "manual" => Ok(PointPolicy::Manual),
            "outer" => Ok(PointPolicy::Outer),
            other => Err(ParsePolicyError(other.to_string())),
        }
    }
}

/// Optimisation level passed to `wasm-opt` after Asyncify.
///
/// Asyncify roughly doubles code size when left unoptimised; the pass that
/// follows it removes most of that. See `docs/prepare.md` for measurements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OptLevel {
    /// No optimisation after Asyncify (fastest to prepare, largest output).
    O0,
    /// `-O1`.
    O1,
    /// `-O2` (default).
    #[default]
    O2,
    /// `-O3`.
    O3,
    /// `-Os`: optimise for size.
    Os,
    /// `-O4`: `-O3` plus flattening first (slowest to prepare).
    O4,
}

impl OptLevel {
    /// The `wasm-opt` flag for this level, if any.
    pub fn flag(self) -> Option<&'static str> {
        match self {
            OptLevel::O0 => None,
            OptLevel::O1 => Some("-O1"),
            OptLevel::O2 => Some("-O2"),
            OptLevel::O3 => Some("-O3"),
            OptLevel::Os => Some("-Os"),
            OptLevel::O4 => Some("-O4"),
        }
    }

    /// Binaryen's optimise and shrink levels for this setting, given to a
    /// `wasm-opt` run that must optimise its own output (Asyncify's) without
    /// running the whole pipeline yet.
    pub(crate) fn levels(self) -> (u32, u32) {
        match self {
            OptLevel::O0 => (0, 0),
            OptLevel::O1 => (1, 0),
            OptLevel::O2 => (2, 0),
            OptLevel::O3 => (3, 0),
            OptLevel::Os => (2, 1),
            OptLevel::O4 => (4, 0),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            OptLevel::O0 => "O0",
            OptLevel::O1 => "O1",
            OptLevel::O2 => "O2",
            OptLevel::O3 => "O3",
            OptLevel::Os => "Os",
            OptLevel::O4 => "O4",
        }
    }
}

impl FromStr for OptLevel {
    type Err = ParseOptionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "O0" => Ok(OptLevel::O0),
            "O1" => Ok(OptLevel::O1),
            "O2" => Ok(OptLevel::O2),
            "O3" => Ok(OptLevel::O3),
            "O4" => Ok(OptLevel::O4),
            "Os" => Ok(OptLevel::Os),
            other => Err(ParseOptionError {
                what: "optimisation level",
                found: other.to_string(),
                choices: "O0, O1, O2, O3, O4, Os",
            }),
        }
    }
}

/// A string that names no value of a `prepare` option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{found}`; use one of: {choices}")]
pub struct ParseOptionError {
    /// Which option, e.g. `Asyncify scope`.
    pub what: &'static str,
    /// The text that was given.
    pub found: String,
    /// The accepted values.
    pub choices: &'static str,
}

/// Which functions Asyncify instruments.
///
/// Asyncify's own analysis assumes that every indirect call may unwind, so
/// in a program with function pointers nearly every function gets
/// save/restore code. `Reachable` computes the set from roam's call graph
/// (indirect calls resolved by signature against the never-mutated tables,
/// see `callgraph.rs`) and passes it as `asyncify-onlylist`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AsyncifyScope {
    /// Only functions that can reach an unwinding import.
    Reachable,
    /// Asyncify's own analysis: every indirect call may unwind (default:
    /// with points at every loop nearly every function reaches one anyway,
    /// and on the interpreter workload `reachable` measured slower; see
    /// `docs/prepare.md`).
    #[default]
    All,
}

impl AsyncifyScope {
    /// The name used on the command line and in the canonical text.
    pub fn as_str(self) -> &'static str {
        match self {
            AsyncifyScope::Reachable => "reachable",
            AsyncifyScope::All => "all",
        }
    }
}

impl FromStr for AsyncifyScope {
    type Err = ParseOptionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reachable" => Ok(AsyncifyScope::Reachable),
            "all" => Ok(AsyncifyScope::All),
            other => Err(ParseOptionError {
                what: "Asyncify scope",
                found: other.to_string(),
                choices: "reachable, all",
            }),
        }
    }
}

/// Which function entries get a migration point (policies `loops`, `outer`
/// and `functions`).
///
/// Loop headers bound the time spent in one function; without recursion the
/// call depth is bounded too, so only functions on a call-graph cycle need a
/// point at their entry to keep the time to the next point bounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EntryPoints {
    /// Functions on a call-graph cycle (recursion, also through indirect
    /// calls resolved by signature) that make a call (default).
    #[default]
    Cycles,
    /// Every function that makes a call.
    All,
}

impl EntryPoints {
    /// The name used on the command line and in the canonical text.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryPoints::Cycles => "cycles",
            EntryPoints::All => "all",
        }
    }
}

impl FromStr for EntryPoints {
    type Err = ParseOptionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cycles" => Ok(EntryPoints::Cycles),
            "all" => Ok(EntryPoints::All),
            other => Err(ParseOptionError {
                what: "entry-point placement",
                found: other.to_string(),
                choices: "cycles, all",
            }),
        }
    }
}

/// How a loop's migration point is placed (see `hoist.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LoopPoints {
    /// A loop that makes no call that may unwind checks the flag at its
    /// back-edges and calls the point from a wrapper outside it, so Asyncify
    /// leaves its body alone. Other loops get an inline point, or, with
    /// [`HoistCalls::On`], the same form when only `br` and `br_if` branch
    /// back to them.
    Hoisted,
    /// A loop that makes no call that may unwind runs as a fast copy that
    /// checks the flag at its back-edges and hands over to a slow copy with
    /// an inline point when it is up (`hoist::version`). Other loops get an
    /// inline point.
    Versioned,
    /// `if flag { call point }` at the top of every loop body.
    Inline,
    /// As [`LoopPoints::Hoisted`], and an inner loop in a stretch of its
    /// enclosing loop's body that can be run again from the top leaves to
    /// that loop's point when the flag is up, and the iteration runs again
    /// (`rerun.rs`), so the whole nest makes no call (default).
    #[default]
    Rerun,
}

impl LoopPoints {
    /// The name used on the command line and in the canonical text.
    pub fn as_str(self) -> &'static str {
        match self {
            LoopPoints::Hoisted => "hoisted",
            LoopPoints::Versioned => "versioned",
            LoopPoints::Inline => "inline",
            LoopPoints::Rerun => "rerun",
        }
    }
}

impl FromStr for LoopPoints {
    type Err = ParseOptionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hoisted" => Ok(LoopPoints::Hoisted),
            "versioned" => Ok(LoopPoints::Versioned),
            "inline" => Ok(LoopPoints::Inline),
            "rerun" => Ok(LoopPoints::Rerun),
            other => Err(ParseOptionError {
                what: "loop-point placement",
                found: other.to_string(),
                choices: "hoisted, versioned, inline, rerun",
            }),
        }
    }
}

/// What a migration point's call does with the function's values (see
/// `spill.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PointCalls {
    /// Every local is copied to a scratch global before the call and back
    /// after it, so no value is live across the call and the register
    /// allocator has no reason to keep hot values in stack slots (default).
    #[default]
    Spilled,
    /// The call as Asyncify leaves it.
    Plain,
}

impl PointCalls {
    /// The name used on the command line and in the canonical text.
    pub fn as_str(self) -> &'static str {
        match self {
            PointCalls::Spilled => "spilled",
            PointCalls::Plain => "plain",
        }
    }
}

impl FromStr for PointCalls {
    type Err = ParseOptionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "spilled" => Ok(PointCalls::Spilled),
            "plain" => Ok(PointCalls::Plain),
            other => Err(ParseOptionError {
                what: "point-call form",
                found: other.to_string(),
                choices: "spilled, plain",
            }),
        }
    }
}

/// An option that is either `on` or `off`: the enum, its text and parsing.
macro_rules! on_off {
    ($(#[$doc:meta])* $name:ident, $what:literal, default: $default:ident, on: $on:literal, off: $off:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            #[doc = $on]
            On,
            #[doc = $off]
            Off,
        }

        impl Default for $name {
            fn default() -> Self {
                $name::$default
            }
        }

        impl $name {
            /// The name used on the command line and in the canonical text.
            pub fn as_str(self) -> &'static str {
                match self {
                    $name::On => "on",
                    $name::Off => "off",
                }
            }
        }

        impl FromStr for $name {
            type Err = ParseOptionError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    "on" => Ok($name::On),
                    "off" => Ok($name::Off),
                    other => Err(ParseOptionError {
                        what: $what,
                        found: other.to_string(),
                        choices: "on, off",
                    }),
                }
            }
        }
    };
}

on_off!(
    /// Whether loops of large functions move into functions of their own
    /// (see `outline.rs`).
    Outline,
    "loop outlining",
    default: On,
    on: "Loop nests that call nothing, and innermost loops that call nothing once points are placed, of functions with many locals (default).",
    off: "Every loop stays where it is."
);

on_off!(
    /// Whether pure functions that reach a point give up and run again
    /// instead of unwinding (see `pure.rs`).
    RerunCalls,
    "rerun calls",
    default: On,
    on: "A function that writes nothing but its locals and calls only such functions runs without Asyncify; at a point it gives up, and its caller's point runs the call again (default).",
    off: "Every function that reaches a point unwinds through Asyncify."
);

on_off!(
    /// Whether indirect calls that can only reach quiet functions become
    /// direct calls Asyncify leaves alone (see `indirect.rs`).
    QuietIndirect,
    "quiet indirect calls",
    default: On,
    on: "An indirect call whose every possible callee (by table and type) reaches no point and no blocking import calls a helper that Asyncify is told cannot unwind, and the call is put back in place of the helper once Asyncify is done (default).",
    off: "Asyncify assumes every indirect call may unwind."
);

on_off!(
    /// Whether short innermost loops check the flag at every other
    /// back-edge, their body run twice per trip (`unroll.rs`).
    UnrollChecks,
    "unrolled checks",
    default: On,
    on: "A short innermost loop that calls nothing and moves into a function of its own (or leaves to an outer loop's point) runs its body twice per trip and checks the flag once, at the second back-edge (default).",
    off: "Every back-edge of a loop with a hoisted point checks the flag."
);

on_off!(
    /// Whether loops that make a call that may unwind get a hoisted point
    /// too (`hoist.rs`), instead of an inline one at the top of their body.
    HoistCalls,
    "hoisted calling loops",
    default: On,
    on: "A loop that makes a call that may unwind checks the flag at its back-edges and calls its point from outside itself, as a loop that calls nothing does, with `--loop-points hoisted` or `rerun` (default).",
    off: "Such a loop calls its point at the top of its body."
);

on_off!(
    /// Whether a counted loop whose run is short, by its trip count on
    /// entry, runs as a copy without checks (`counted.rs`).
    CountedLoops,
    "counted loops",
    default: On,
    on: "A loop that counts to a bound it never changes, and calls nothing, tests its trip count on entry: a run short enough to end within a budget of instructions takes a copy of the loop without point or check (default).",
    off: "Every run of such a loop checks the flag as its point's form says."
);

on_off!(
    /// Whether a counted loop whose inner loops are all short counted
    /// loops runs as a copy without checks when the whole nest is short
    /// (`nest.rs`).
    CountedNests,
    "counted nests",
    default: On,
    on: "A counted loop that holds only counted innermost loops and calls nothing tests its own trip count on entry, and each inner loop's on its entry: a nest short enough to end within a budget of instructions runs as a copy without point or check, which moves into a function of its own (default; needs `--counted-loops on`).",
    off: "Only innermost loops get a copy without checks."
);

on_off!(
    /// Whether `memory.fill` and `memory.copy` longer than 64 KiB run in
    /// chunks with a migration point between them (`bulk.rs`).
    BulkChunks,
    "bulk chunks",
    default: On,
    on: "A `memory.fill` or `memory.copy` whose length is not a constant of at most 64 KiB tests its length: a longer one runs in chunks of 64 KiB with a point between chunks (default; with `--points loops` or `outer`).",
    off: "Each runs whole, however long."
);

on_off!(
    /// Whether a loop moved into a function of its own passes only the
    /// locals that cross the call (`loop_io.rs`).
    TrimOutlined,
    "trimmed outlined loops",
    default: On,
    on: "A moved loop takes only the locals it may read before it sets them, and gives back only those of its writes that are read after it or taken again (default).",
    off: "A moved loop takes every local it uses and gives back every local it writes."
);

on_off!(
    /// Whether float comparisons that choose a `select` are turned round
    /// into the form Cranelift makes a minimum or maximum of
    /// (`compares.rs`).
    TurnCompares,
    "turned compares",
    default: On,
    on: "After the last optimiser run, a float `gt` or `ge` of two locals that a `select` takes becomes `lt` or `le` with the locals swapped (default).",
    off: "Comparisons stay as the optimiser left them."
);

on_off!(
    /// Whether calls of functions that never return are made from the
    /// caller's caller, once the caller has returned (`leave.rs`).
    LiftExits,
    "lifted exits",
    default: On,
    on: "A function that only direct calls reach and that calls a function which never returns and may unwind (an error path that prints and exits) returns instead, and its caller makes the call (default).",
    off: "Every call stays where it is."
);

/// How the call stack is captured at a migration point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Capture {
    /// Binaryen Asyncify: the stack unwinds into linear memory and rewinds
    /// from it. The fallback, and the default up to output revision 17: it
    /// makes call-heavy programs several times slower.
    Asyncify,
    /// Wasm exceptions (`eh/`): points throw, every call that may unwind
    /// stores its frame's live locals in a `try_table` handler, and rewind
    /// copies of the functions rebuild the stack on restore. No Asyncify.
    /// The default in revision 18.
    Eh,
    /// Like [`Capture::Eh`] (the same records and rewind copies), but a
    /// frame leaves by returning instead of by an exception: after each
    /// call that may reach a point the caller checks `roam.state`, and
    /// while unwinding stores its record and returns. A check costs a load
    /// and a branch where a `try_table` makes Cranelift keep every value
    /// live across the call in a stack slot, and the output needs no
    /// exception support from the engine. The default since revision 19.
    #[default]
    Returns,
    /// Ablation of [`Capture::Eh`]: its points (stores and a `throw`)
    /// without any `try_table` or rewind copy, so no frame but the
    /// innermost is captured and nothing can restore it. Only for
    /// measuring what the points cost.
    EhPoints,
}

/// Environment variable that sets the capture of modules prepared without
/// an explicit `--capture` (`asyncify`, `eh` or `returns`); see [`Capture::from_env`].
pub const ENV_CAPTURE: &str = "ROAM_CAPTURE";

impl Capture {
    /// The capture [`ENV_CAPTURE`] names, or the default when it is unset or
    /// empty. A node or `roam run` prepares uploaded modules with it, so a
    /// whole deployment (or test run) can switch capture in one place.
    pub fn from_env() -> Result<Capture, ParseOptionError> {
        match std::env::var(ENV_CAPTURE) {
            Ok(v) if !v.is_empty() => v.parse(),
            _ => Ok(Capture::default()),
        }
    }

    /// The name used on the command line and in the canonical text.
    pub fn as_str(self) -> &'static str {
        match self {
            Capture::Asyncify => "asyncify",
            Capture::Eh => "eh",
            Capture::Returns => "returns",
            Capture::EhPoints => "eh-points",
        }
    }

    /// Whether the stack is captured by `eh/` (records and rewind copies),
    /// whichever way frames leave.
    pub fn by_records(self) -> bool {
        matches!(self, Capture::Eh | Capture::Returns)
    }
}

impl FromStr for Capture {
    type Err = ParseOptionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "asyncify" => Ok(Capture::Asyncify),
            "eh" => Ok(Capture::Eh),
            "returns" => Ok(Capture::Returns),
            "eh-points" => Ok(Capture::EhPoints),
            other => Err(ParseOptionError {
                what: "capture",
                found: other.to_string(),
                choices: "asyncify, eh, returns, eh-points",
            }),
        }
    }
}

/// How to prepare a module.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrepareOptions {
    /// Where to insert migration points. Default: [`PointPolicy::Loops`].
    pub points: PointPolicy,
    /// The `wasm-opt` binary to run. `None` (default) means `$ROAM_WASM_OPT`
    /// if set, else `wasm-opt` on `PATH`.
    pub wasm_opt: Option<PathBuf>,
    /// Optimisation after Asyncify. Default: [`OptLevel::O2`].
    pub opt_level: OptLevel,
    /// Drop the `name` section from the output (default `false`: keep it, so
    /// traps and profiles show function names).
    pub strip_names: bool,
    /// Which functions Asyncify instruments. Default: [`AsyncifyScope::All`].
    pub asyncify_scope: AsyncifyScope,
    /// Which function entries get a migration point. Default:
    /// [`EntryPoints::Cycles`].
    pub entry_points: EntryPoints,
    /// How loop points are placed. Default: [`LoopPoints::Rerun`].
    pub loop_points: LoopPoints,
    /// What a point's call does with live values. Default:
    /// [`PointCalls::Spilled`].
    pub point_calls: PointCalls,
    /// Which loops move into functions of their own. Default:
    /// [`Outline::On`].
    pub outline: Outline,
    /// Whether pure recursion gives up and runs again instead of unwinding.
    /// Default: [`RerunCalls::On`].
    pub rerun_calls: RerunCalls,
    /// Whether indirect calls that reach only quiet functions are taken as
    /// unable to unwind. Default: [`QuietIndirect::On`].
    pub quiet_indirect: QuietIndirect,
    /// Whether short innermost loops check the flag at every other
    /// back-edge. Default: [`UnrollChecks::On`].
    pub unroll_checks: UnrollChecks,
    /// Whether loops that make a call that may unwind get a hoisted point.
    /// Default: [`HoistCalls::On`].
    pub hoist_calls: HoistCalls,
    /// Whether short runs of counted loops skip their checks. Default:
    /// [`CountedLoops::On`].
    pub counted_loops: CountedLoops,
    /// Whether short runs of counted nests skip their checks. Default:
    /// [`CountedNests::On`].
    pub counted_nests: CountedNests,
    /// Whether long bulk-memory instructions run in chunks. Default:
    /// [`BulkChunks::On`].
    pub bulk_chunks: BulkChunks,
    /// Whether moved loops pass only the locals that cross the call.
    /// Default: [`TrimOutlined::On`].
    pub trim_outlined: TrimOutlined,
    /// Whether float comparisons that choose a `select` are turned round.
    /// Default: [`TurnCompares::On`].
    pub turn_compares: TurnCompares,
    /// Whether calls of functions that never return are made from the
    /// caller's caller. Default: [`LiftExits::On`].
    pub lift_exits: LiftExits,
    /// How the stack is captured. Default: [`Capture::Returns`].
    pub capture: Capture,
}

impl PrepareOptions {
    /// Canonical, stable text of the options that influence the output bytes,
    /// e.g. `points=loops;opt=O2;names=keep;scope=all;entries=cycles;loops=rerun;calls=spilled;outline=on;rerun-calls=on;quiet-indirect=on;unroll-checks=on;hoist-calls=on;counted-loops=on;counted-nests=on;bulk-chunks=on;trim-outlined=on;turn-compares=on;lift-exits=on;capture=eh`.
    pub fn canonical(&self) -> String {
        format!(
            "points={};opt={};names={}\
             ;scope={}\
             ;entries={};loops={};calls={};outline={};rerun-calls={};quiet-indirect={};unroll-checks={};hoist-calls={};counted-loops={};counted-nests={};bulk-chunks={};trim-outlined={};turn-compares={};lift-exits={}",
            self.points,
            self.opt_level.as_str(),
            if self.strip_names { "strip" } else { "keep" },
            self.asyncify_scope.as_str(),
            self.entry_points.as_str(),
            self.loop_points.as_str(),
            self.point_calls.as_str(),
            self.outline.as_str(),
            self.rerun_calls.as_str(),
            self.quiet_indirect.as_str(),
            self.unroll_checks.as_str(),
            self.hoist_calls.as_str(),
            self.counted_loops.as_str(),
            self.counted_nests.as_str(),
            self.bulk_chunks.as_str(),
            self.trim_outlined.as_str(),
            self.turn_compares.as_str(),
            self.lift_exits.as_str(),
        ) + match self.capture {
            // Absent for Asyncify, the default up to revision 17, so that
            // the text of a module prepared before reads as what it is.
            Capture::Asyncify => "",
            Capture::Eh => ";capture=eh",
            Capture::Returns => ";capture=returns",
            Capture::EhPoints => ";capture=eh-points",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_round_trips_through_text() {
        for p in [
            PointPolicy::Loops,
            PointPolicy::Functions,
            PointPolicy::Manual,
            PointPolicy::Outer,
        ] {
            assert_eq!(p.to_string().parse::<PointPolicy>(), Ok(p));
        }
    }

    #[test]
    fn unknown_policy_is_refused_with_the_choices() {
        let err = "everywhere".parse::<PointPolicy>().unwrap_err();
        assert!(err.to_string().contains("`everywhere`"));
        assert!(err.to_string().contains("loops, outer, functions, manual"));
    }

    #[test]
    fn canonical_text_ignores_the_tool_path() {
        let a = PrepareOptions::default();
        let b = PrepareOptions {
            wasm_opt: Some("/opt/binaryen/bin/wasm-opt".into()),
            ..PrepareOptions::default()
        };
        assert_eq!(
            a.canonical(),
            "points=loops;opt=O2;names=keep;scope=all;entries=cycles;loops=rerun;calls=spilled;outline=on;rerun-calls=on;quiet-indirect=on;unroll-checks=on;hoist-calls=on;counted-loops=on;counted-nests=on;bulk-chunks=on;trim-outlined=on;turn-compares=on;lift-exits=on;capture=returns"
        );
        assert_eq!(a.canonical(), b.canonical());
        let c = PrepareOptions {
            points: PointPolicy::Manual,
            opt_level: OptLevel::Os,
            strip_names: true,
            ..PrepareOptions::default()
        };
        assert_eq!(
            c.canonical(),
            "points=manual;opt=Os;names=strip;scope=all;entries=cycles;loops=rerun;calls=spilled;outline=on;rerun-calls=on;quiet-indirect=on;unroll-checks=on;hoist-calls=on;counted-loops=on;counted-nests=on;bulk-chunks=on;trim-outlined=on;turn-compares=on;lift-exits=on;capture=returns"
        );
    }
}
