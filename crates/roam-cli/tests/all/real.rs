//! Differential tests of `roam prepare` on the real-program suite
//! (`workloads/real/suite.toml`): programs that no one here wrote, prepared
//! under each points policy and each switch, must print what the
//! unprepared module prints (the reference pinned in the manifest), both
//! run straight through and stopped at a migration point chosen at random
//! and restored, on the host and on aarch64 under qemu-user.
//!
//! Our own workloads are what the passes were tuned on; these programs are
//! not, and they found a bug the workloads never hit (an outlined loop
//! that left an output unset on some way out,
//! `outline_tests.rs::a_local_set_on_some_paths_only_keeps_the_callers_value`).
//! So every option is run on them, not only the default.
//!
//! **What CI runs.** CoreMark, the smallest module, under every option
//! (each prepare of a module of a megabyte or more takes 20 s to two
//! minutes here, so the whole sample did not fit CI's time), with the
//! default's snapshot also restored on aarch64. The other programs' tests
//! are `#[ignore]`d in CI; `ROAM_DIFF=sample scripts/difftest.sh` runs
//! them (`--include-ignored`): every program under the default options, and
//! every other value of every option on one program each ([`sample`]),
//! with the default's snapshot of three small programs also restored on
//! aarch64. `ROAM_DIFF=full` runs every program under every option and
//! restores every snapshot on aarch64 too. Each test prints its seed;
//! `ROAM_DIFF_SEED=<n>` repeats its choice of points. An option whose
//! prepared module is byte for byte one already tested for the program
//! (the Asyncify path's switches under the default capture, or a switch
//! that finds nothing to change in that program) is reported and not run
//! again: the same bytes run the same way.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use roam_testkit::real::{Program, Suite};

use super::common::*;

/// Every non-default value of every `roam prepare` option, one per entry.
/// The first entry of the list is the default itself.
const OPTIONS: &[&[&str]] = &[
    &[],
    &["--points", "outer"],
    &["--points", "functions"],
    &["--points", "manual"],
    &["--asyncify-scope", "reachable"],
    &["--entry-points", "all"],
    &["--loop-points", "hoisted"],
    &["--loop-points", "versioned"],
    &["--loop-points", "inline"],
    &["--point-calls", "plain"],
    &["--outline-loops", "off"],
    &["--rerun-calls", "off"],
    &["--quiet-indirect", "off"],
    &["--unroll-checks", "off"],
    &["--hoist-calls", "off"],
    &["--counted-loops", "off"],
    &["--counted-nests", "off"],
    &["--bulk-chunks", "off"],
    &["--trim-outlined", "off"],
    &["--turn-compares", "off"],
    &["--lift-exits", "off"],
    &["--opt", "O0"],
    &["--opt", "Os"],
    // Capture by exceptions, with the policies and optimisation that
    // change where its sites are.
    &["--capture", "eh"],
    &["--capture", "eh", "--points", "outer"],
    &["--capture", "eh", "--points", "functions"],
    &["--capture", "eh", "--points", "manual"],
    &["--capture", "eh", "--opt", "O0"],
    // Frames that leave by returning.
    &["--capture", "returns"],
    &["--capture", "returns", "--points", "outer"],
    &["--capture", "returns", "--points", "manual"],
];

/// Programs whose default snapshot CI also restores on aarch64: the
/// smallest modules, since Cranelift compiles the module under emulation.
const CROSS_IN_CI: &[&str] = &["coremark", "lua", "json-stl"];

fn full() -> bool {
    std::env::var("ROAM_DIFF").is_ok_and(|v| v == "full")
}

fn suite() -> Suite {
    Suite::load(&repo_root()).unwrap_or_else(|e| panic!("{e}"))
}

/// The options `program` is prepared with: the default plus every
/// `OPTIONS` entry whose turn it is (entries dealt round the programs in
/// manifest order, so each runs on exactly one program); in full, and for
/// the programs CI runs ([`IN_CI`]), all.
fn sample(suite: &Suite, program: &str) -> Vec<&'static [&'static str]> {
    if full() || IN_CI.contains(&program) {
        return OPTIONS.to_vec();
    }
    let at = suite
        .programs
        .iter()
        .position(|p| p.name == program)
        .expect("the program is in the manifest");
    let n = suite.programs.len();
    let mut picked = vec![OPTIONS[0]];
    picked.extend(
        OPTIONS[1..]
            .iter()
            .enumerate()
            .filter(|(i, _)| i % n == at)
            .map(|(_, o)| *o),
    );
    picked
}

fn seed(program: &str) -> u64 {
    let seed = match std::env::var("ROAM_DIFF_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("ROAM_DIFF_SEED={s:?} is not a number")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    };
    eprintln!("{program}: ROAM_DIFF_SEED={seed}");
    seed
}

/// A xorshift step: the next pseudo-random number after `x`.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Runs roam with `stdin` (a duplicate of it: the offset is shared).
fn with_stdin(mut cmd: Command, stdin: Option<&File>) -> Output {
    if let Some(f) = stdin {
        cmd.stdin(Stdio::from(f.try_clone().unwrap()));
    }
    output(cmd)
}

struct Case<'a> {
    program: &'a Program,
    module: PathBuf,
    stdin: Option<PathBuf>,
    dir: tempfile::TempDir,
}

impl Case<'_> {
    /// The program `name` of `suite`, with a fresh directory.
    fn of<'a>(suite: &'a Suite, name: &str) -> Case<'a> {
        let program = suite
            .get(name)
            .unwrap_or_else(|| panic!("workloads/real/suite.toml has no {name}"));
        let root = repo_root();
        let module = program.module(&root);
        assert!(
            module.exists(),
            "{} is missing: run workloads/build.sh (or scripts/test.sh)",
            module.display()
        );
        Case {
            program,
            module,
            stdin: program
                .test
                .stdin
                .as_ref()
                .map(|s| root.join("target/workloads/real").join(s)),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn open_stdin(&self) -> Option<File> {
        self.stdin
            .as_ref()
            .map(|p| File::open(p).unwrap_or_else(|e| panic!("cannot open {}: {e}", p.display())))
    }

    fn run_args(&self, cmd: &mut Command, prepared: &Path) {
        if let Some(guest) = &self.program.test.dir {
            cmd.arg("--dir")
                .arg(format!("{}::{guest}", self.dir.path().display()));
        }
        cmd.arg(prepared).arg("--").args(&self.program.test.args);
    }

    fn check(&self, what: &str, out: &Output, stdout: &[u8]) {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{what}: exit status {}\n--- stderr\n{}",
            out.status,
            text(&out.stderr)
        );
        if let Err(e) = self.program.check(&self.program.test, stdout) {
            panic!(
                "{what}: {e}\n--- compared stdout\n{}\n--- stderr\n{}",
                text(&self.program.compared(stdout)),
                text(&out.stderr)
            );
        }
    }

    /// Prepare with `flags`, run through, then stop at a random point and
    /// restore on the host (and on aarch64 when `cross`). `seen` holds the
    /// hashes of the modules already tested for this program, with their
    /// options: an option that yields the same bytes as one tested before
    /// (a switch of the Asyncify path under the default capture, say) is
    /// reported and not run again, unless it is to cross where the first
    /// did not.
    fn differential(
        &self,
        flags: &[&str],
        rng: &mut u64,
        cross: bool,
        seen: &mut Vec<(blake3::Hash, String, bool)>,
    ) {
        let name = &self.program.name;
        let label = if flags.is_empty() {
            "default".to_string()
        } else {
            flags.join(" ")
        };
        let what = format!("{name} [{label}]");
        let prepared = self
            .dir
            .path()
            .join(format!("{}.wasm", label.replace([' ', '-'], "")));
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("prepare")
            .args(flags)
            .arg(&self.module)
            .arg("-o")
            .arg(&prepared);
        let out = output(cmd);
        assert!(
            out.status.success(),
            "{what}: prepare failed\n{}",
            text(&out.stderr)
        );
        let hash = blake3::hash(&std::fs::read(&prepared).unwrap());
        if let Some((_, first, _)) = seen.iter().find(|(h, _, c)| *h == hash && (*c || !cross)) {
            eprintln!("{what}: the same module as [{first}], tested already");
            return;
        }
        seen.push((hash, label.clone(), cross));

        // Straight through, counting the points reached.
        let stdin = self.open_stdin();
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["run", "--checkpoint-at-point", &u64::MAX.to_string()]);
        self.run_args(&mut cmd, &prepared);
        let whole = with_stdin(cmd, stdin.as_ref());
        self.check(&format!("{what}: uninterrupted run"), &whole, &whole.stdout);
        let points = points_reached(&whole.stderr);
        if points == 0 {
            // Nothing to stop at (`--points manual`: these programs ask
            // for no point).
            return;
        }

        let k = 1 + next(rng) % points;
        let snap = self.dir.path().join(format!("{label}.roam"));
        let _ = std::fs::remove_file(&snap);
        let stdin = self.open_stdin();
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["run", "--checkpoint-at-point", &k.to_string(), "--snapshot"])
            .arg(&snap);
        self.run_args(&mut cmd, &prepared);
        let first = with_stdin(cmd, stdin.as_ref());
        assert!(
            first.status.success() && snap.exists(),
            "{what}: checkpoint at point {k} of {points}: {}\n{}",
            first.status,
            text(&first.stderr)
        );
        // Where the first half left its stdin: each restore goes on from
        // there (roam carries no stdin; a restoring host gives its own).
        let at = stdin.as_ref().map(|mut f| f.stream_position().unwrap());
        let mut isas = vec![Isa::X86_64];
        if cross {
            isas.push(Isa::Aarch64);
        }
        for isa in isas {
            if let (Some(mut f), Some(at)) = (stdin.as_ref(), at) {
                f.seek(SeekFrom::Start(at)).unwrap();
            }
            let mut cmd = roam(isa);
            cmd.arg("restore").arg(&snap).arg("--module").arg(&prepared);
            if let Some(guest) = &self.program.test.dir {
                cmd.arg("--dir")
                    .arg(format!("{}::{guest}", self.dir.path().display()));
            }
            let second = with_stdin(cmd, stdin.as_ref());
            let mut both = first.stdout.clone();
            both.extend_from_slice(&second.stdout);
            self.check(
                &format!(
                    "{what}: stopped at point {k} of {points}, restored on {}",
                    isa.name()
                ),
                &second,
                &both,
            );
        }
    }
}

impl Case<'_> {
    /// Run with at most `local` of memory resident and the rest paged to a
    /// swap file, under `eviction`: the output must be the reference's,
    /// and (`must_page`) pages must have left. Returns the peak resident
    /// memory, MiB.
    fn far(&self, local: &str, eviction: &str, must_page: bool) -> f64 {
        let stdin = self.open_stdin();
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["run", "--local-memory", local, "--eviction", eviction])
            .arg("--swap-dir")
            .arg(self.dir.path());
        self.run_args(&mut cmd, &self.module);
        let out = with_stdin(cmd, stdin.as_ref());
        let what = format!("{} with {local} local ({eviction})", self.program.name);
        self.check(&what, &out, &out.stdout);
        let err = text(&out.stderr);
        let figure = |unit: &str| -> f64 {
            err.split(unit)
                .next()
                .and_then(|s| s.rsplit(' ').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{what}: no far-memory summary in\n{err}"))
        };
        if must_page {
            assert!(
                figure(" MiB written out") > 0.0,
                "{what}: nothing was paged out\n{err}"
            );
        }
        figure(" MiB resident)")
    }
}

/// [`Case::far`] for the program `name`: half of its working set resident
/// under clock, three quarters under random.
fn far(name: &str) {
    let suite = suite();
    let case = Case::of(&suite, name);
    // First with room for all of it, to learn its working set; then with
    // half of it under clock and three quarters under random.
    // A program smaller than twice the smallest budget (256 KiB) cannot
    // be made to page; its output is still checked.
    let peak = case.far("4GiB", "clock", false);
    for (share, eviction) in [(0.5, "clock"), (0.75, "random")] {
        let kib = ((peak * 1024.0 * share) as u64).max(256);
        let pages = (kib as f64) < peak * 1024.0;
        case.far(&format!("{kib}KiB"), eviction, pages);
    }
}

/// The count in roam's "reached only N migration points" note.
fn points_reached(stderr: &[u8]) -> u64 {
    let text = text(stderr);
    text.split("reached only ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("roam did not report the points reached:\n{text}"))
}

/// Prepare, run and stop-and-restore one program under its sample of
/// options.
fn differential(name: &str) {
    differential_under(name, None);
}

/// [`differential`] under `only` these options instead of the sample.
fn differential_under(name: &str, only: Option<&[&'static [&'static str]]>) {
    let suite = suite();
    let case = Case::of(&suite, name);
    let mut rng = seed(name) | 1;
    // The eh-only runs stay on the host: compiling their copies under qemu
    // takes minutes for the larger programs.
    let cross_default = only.is_none() && (full() || CROSS_IN_CI.contains(&name));
    let options = match only {
        Some(o) => o.to_vec(),
        None => sample(&suite, name),
    };
    let mut seen = Vec::new();
    for (i, flags) in options.into_iter().enumerate() {
        // The first of each capture crosses to aarch64.
        let first = i == 0 || flags == ["--capture", "eh"] || flags == ["--capture", "returns"];
        case.differential(
            flags,
            &mut rng,
            (full() && only.is_none()) || (first && cross_default),
            &mut seen,
        );
    }
}

macro_rules! real_program_tests {
    (ci { $($ci:ident => $ci_name:literal,)* } ignored { $($test:ident => $name:literal,)* }) => {
        /// The programs CI tests, each under every option.
        const IN_CI: &[&str] = &[$($ci_name),*];

        $(
            #[test]
            fn $ci() {
                differential($ci_name);
            }
        )*
        $(
            #[test]
            #[ignore = "too slow to prepare for CI's time (see the module docs); run scripts/difftest.sh"]
            fn $test() {
                differential($name);
            }
        )*

        /// Capture by exceptions prepares in seconds, so CI runs every
        /// program under it, frames leaving by exceptions and by returns
        /// (without the Asyncify sample).
        mod eh {
            use super::*;
            $(
                #[test]
                fn $test() {
                    differential_under(
                        $name,
                        Some(&[&["--capture", "eh"], &["--capture", "returns"]]),
                    );
                }
            )*
        }

        /// Far memory (`docs/far-memory.md`): every program, run with a
        /// few hundred KiB of its memory resident and the rest in a swap
        /// file, prints its reference.
        mod far {
            $(
                #[test]
                fn $ci() {
                    super::far($ci_name);
                }
            )*
            $(
                #[test]
                fn $test() {
                    super::far($name);
                }
            )*
        }

        /// A program added to the manifest without a test here would be
        /// tested by nothing.
        #[test]
        fn every_real_program_has_a_differential_test() {
            let tested = [$($ci_name,)* $($name),*];
            for p in &suite().programs {
                assert!(
                    tested.contains(&p.name.as_str()),
                    "{} has no test in tests/all/real.rs",
                    p.name
                );
            }
        }
    };
}

real_program_tests! {
    ci {
        real_coremark_matches_its_reference => "coremark",
    }
    ignored {
        real_lua_matches_its_reference => "lua",
        real_zstd_matches_its_reference => "zstd",
        real_unzstd_matches_its_reference => "unzstd",
        real_crates_mix_matches_its_reference => "crates-mix",
        real_json_stl_matches_its_reference => "json-stl",
        real_golua_matches_its_reference => "golua",
        real_sqlite_matches_its_reference => "sqlite",
        real_quickjs_matches_its_reference => "quickjs",
    }
}
