//! Capture by Wasm exceptions against Asyncify: what each costs a running
//! program, and its size (issue 31, section 3, first step).
//!
//! Why it exists: it showed that capture by exceptions costs a running
//! program far less than Asyncify before restore was built on it, and it
//! still splits that cost: `roam prepare --capture eh` wraps every call
//! that may unwind in a `try_table` whose handler stores the frame's live
//! locals, and `eh-points` has its points alone (no wrapped call, no copy).
//! This runs the builds of each program on `plain-wasmtime` (stock
//! wasmtime 48 and wasmtime-wasi, exceptions on), so the prepared code is
//! all that differs: the unprepared module, the default preparation
//! (Asyncify) and `eh`, interleaved per repetition, median of the
//! repetitions, as ratios to the unprepared module. Time is CPU time of
//! the process, not wall time: it was written on a machine shared with
//! several builds, where wall time ran ten times the CPU time. It also reports the
//! time `roam prepare` took, the code section's size and the machine code
//! wasmtime compiled (the `.text` of the `.cwasm` that `plain-wasmtime`
//! caches).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};

use crate::paths::Paths;
use crate::prepare::code_bytes;
use crate::proc::run_cpu;
use crate::report::{Report, Table};
use crate::stats::{geomean, median};

/// A program from outside the workload suite: `NAME=PATH ARG...`; an
/// argument `--dir=HOST::GUEST` is a preopened directory instead, and
/// `--stdin=FILE` the file fed on standard input, and `--warm=A,B` the
/// (shorter) arguments of the run that fills the compile cache.
#[derive(Debug, Clone)]
pub struct Extra {
    name: String,
    path: PathBuf,
    args: Vec<String>,
    dirs: Vec<String>,
    stdin: Option<PathBuf>,
    warm: Option<Vec<String>>,
}

impl Extra {
    /// Parse `NAME=PATH ARG...`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let (name, rest) = s
            .split_once('=')
            .with_context(|| format!("`{s}`: expected NAME=PATH ARG..."))?;
        let mut words = rest.split_whitespace();
        let path = PathBuf::from(words.next().context("no module path")?);
        let (opts, args): (Vec<&str>, Vec<&str>) = words.partition(|w| {
            ["--dir=", "--stdin=", "--warm="]
                .iter()
                .any(|p| w.starts_with(p))
        });
        let (warm, opts): (Vec<&str>, Vec<&str>) =
            opts.into_iter().partition(|w| w.starts_with("--warm="));
        let (stdin, dirs): (Vec<&str>, Vec<&str>) =
            opts.into_iter().partition(|w| w.starts_with("--stdin="));
        Ok(Extra {
            warm: warm.last().map(|w| {
                w.trim_start_matches("--warm=")
                    .split(',')
                    .map(String::from)
                    .collect()
            }),
            stdin: stdin
                .last()
                .map(|s| PathBuf::from(s.trim_start_matches("--stdin="))),
            name: name.into(),
            path,
            args: args.into_iter().map(String::from).collect(),
            dirs: dirs
                .into_iter()
                .map(|d| d.trim_start_matches("--dir=").to_string())
                .collect(),
        })
    }
}

/// Options of `roam-bench eh`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Size class of the suite's workloads.
    pub size: String,
    /// Repetitions (median reported).
    pub reps: usize,
    /// Restrict the suite to these workloads (`Some(empty)`: none).
    pub only: Option<Vec<String>>,
    /// Programs from outside the suite.
    pub extra: Vec<Extra>,
    /// Repetitions for those (they run longer).
    pub extra_reps: usize,
}

/// The builds, in run order; the first is the reference.
const BUILDS: [(&str, Option<&str>); 4] = [
    ("plain", None),
    ("default", Some("")),
    ("eh", Some("--capture eh")),
    // Its points alone: what the wrapped calls add is eh ÷ this.
    ("eh-points", Some("--capture eh-points")),
];

struct Program {
    name: String,
    /// Per build: the module, `roam prepare` seconds, `eh` sites.
    modules: Vec<(PathBuf, Option<f64>, String)>,
    args: Vec<String>,
    dirs: Vec<String>,
    /// filework writes into a fresh `/data`.
    data: bool,
    /// Not a suite workload: `args` as given, no size class.
    extra: bool,
    stdin: Option<PathBuf>,
    warm: Option<Vec<String>>,
}

/// `roam prepare` `input` into `out`: seconds taken, and what `eh`
/// did. An output newer than its input is reused with the time recorded
/// beside it (`<out>.prep`), since preparing a large program takes a minute.
pub(crate) fn prepare(
    roam: &Path,
    input: &Path,
    out: &Path,
    args: &str,
) -> anyhow::Result<(f64, String)> {
    let record = out.with_extension("wasm.prep");
    // Reused only when made by this very `roam` from this very input.
    if crate::paths::newer(out, input) && crate::paths::newer(out, roam) {
        let recorded = std::fs::read_to_string(&record).ok().and_then(|r| {
            r.split_once('\n')
                .and_then(|(a, b)| Some((a.parse::<f64>().ok()?, b.to_string())))
        });
        if let Some((secs, sites)) = recorded {
            return Ok((secs, sites));
        }
    }
    let started = Instant::now();
    let o = Command::new(roam)
        .arg("prepare")
        .arg(input)
        .arg("-o")
        .arg(out)
        .args(args.split_whitespace())
        .output()
        .context("cannot run roam prepare")?;
    let secs = started.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() {
        bail!("roam prepare {} {args}: {}", input.display(), err.trim());
    }
    let sites = err
        .lines()
        .find_map(|l| {
            l.split_once("capture by exceptions: ")
                .or_else(|| l.split_once("capture by returns: "))
        })
        .map(|(_, rest)| rest.split(',').take(3).collect::<Vec<_>>().join(","))
        .unwrap_or_default();
    std::fs::write(&record, format!("{secs}\n{sites}"))?;
    Ok((secs, sites))
}

/// Size of the `.text` section of an ELF64 file (wasmtime's `.cwasm`).
fn elf_text(elf: &[u8]) -> Option<u64> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(elf.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    if elf.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let shoff = u64_at(0x28)? as usize;
    let (size, count, names) = (
        u16_at(0x3a)? as usize,
        u16_at(0x3c)? as usize,
        u16_at(0x3e)? as usize,
    );
    let strtab = u64_at(shoff + names * size + 0x18)? as usize;
    (0..count).find_map(|i| {
        let h = shoff + i * size;
        let name = strtab + u32_at(h)? as usize;
        (elf.get(name..name + 6)? == b".text\0").then(|| u64_at(h + 0x20))?
    })
}

/// Machine code bytes of `wasm` as `plain-wasmtime` cached it.
fn compiled_text(cache: &Path, wasm: &Path) -> Option<u64> {
    let key = blake3::hash(&std::fs::read(wasm).ok()?)
        .to_hex()
        .to_string();
    let entry = std::fs::read_dir(cache).ok()?.flatten().find(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        n.starts_with(&key) && n.ends_with(".cwasm")
    })?;
    elf_text(&std::fs::read(entry.path()).ok()?)
}

/// One run on `plain-wasmtime`: CPU seconds and a hash of stdout.
fn run_once(
    plain: &Path,
    paths: &Paths,
    p: &Program,
    module: &Path,
    args: &[String],
) -> anyhow::Result<(f64, String)> {
    let mut c = Command::new(plain);
    if p.data {
        let d = paths.fresh_dir("data-eh")?;
        c.arg("--dir").arg(format!("{}::/data", d.display()));
    }
    for d in &p.dirs {
        c.arg("--dir").arg(d);
    }
    c.arg(module)
        .args(args)
        .env("PLAIN_WASMTIME_CACHE", paths.scratch.join("plain-cache-eh"));
    match &p.stdin {
        Some(f) => {
            c.stdin(std::fs::File::open(f).with_context(|| format!("cannot open {}", f.display()))?)
        }
        None => c.stdin(Stdio::null()),
    };
    let (secs, stdout) = run_cpu(&mut c, &module.display().to_string())?;
    Ok((secs, blake3::hash(&stdout).to_hex()[..16].to_string()))
}

/// Run the comparison and return its report.
pub fn run(paths: &Paths, opts: &Options) -> anyhow::Result<Report> {
    let roam = paths.tool("roam")?;
    let plain = paths.tool("plain-wasmtime")?;
    let dir = paths.scratch.join("prepared-eh");
    std::fs::create_dir_all(&dir)?;
    type Input = (
        String,
        PathBuf,
        Vec<String>,
        Vec<String>,
        Option<PathBuf>,
        Option<Vec<String>>,
    );
    let mut inputs: Vec<Input> = crate::t1::WORKLOADS
        .into_iter()
        .filter(|n| opts.only.as_ref().is_none_or(|o| o.iter().any(|x| x == n)))
        .map(|n| {
            Ok((
                n.to_string(),
                paths.wasm(n)?,
                Vec::new(),
                Vec::new(),
                None,
                None,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    for e in &opts.extra {
        inputs.push((
            e.name.clone(),
            e.path.clone(),
            e.args.clone(),
            e.dirs.clone(),
            e.stdin.clone().or(Some(PathBuf::new())),
            e.warm.clone(),
        ));
    }
    let mut programs = Vec::new();
    for (name, wasm, args, dirs, stdin, warm) in inputs {
        let mut modules = Vec::new();
        for (label, flags) in BUILDS {
            match flags {
                None => modules.push((wasm.clone(), None, String::new())),
                Some(flags) => {
                    let out = dir.join(format!("{name}.{label}.wasm"));
                    let (secs, sites) = prepare(&roam, &wasm, &out, flags)?;
                    eprintln!("eh: prepared {name} ({label}) in {secs:.1} s {sites}");
                    modules.push((out, Some(secs), sites));
                }
            }
        }
        programs.push(Program {
            data: name == "filework",
            extra: stdin.is_some(),
            stdin: stdin.filter(|p| !p.as_os_str().is_empty()),
            warm,
            name,
            modules,
            args,
            dirs,
        });
    }
    let mut table = Table::new(&[
        "program",
        "plain CPU s",
        "default ÷ plain",
        "eh ÷ plain",
        "eh-points ÷ plain",
        "eh ÷ default",
        "code KiB plain / default / eh",
        ".text KiB plain / default / eh",
        "prepare s default / eh",
        "eh sites / blocking imports / calls in try_table",
        "output",
    ]);
    let (mut r_default, mut r_eh, mut r_points) = (Vec::new(), Vec::new(), Vec::new());
    let mut notes = Vec::new();
    let cache = paths.scratch.join("plain-cache-eh");
    for p in &programs {
        let args = |warm: bool| -> Vec<String> {
            if p.extra {
                match (&p.warm, warm) {
                    (Some(w), true) => w.clone(),
                    _ => p.args.clone(),
                }
            } else {
                vec![if warm { "S".into() } else { opts.size.clone() }]
            }
        };
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); BUILDS.len()];
        let mut outputs: Vec<String> = Vec::new();
        let mut failed = None;
        let reps = if p.extra { opts.extra_reps } else { opts.reps };
        'reps: for rep in 0..=reps {
            for (b, (m, _, _)) in p.modules.iter().enumerate() {
                match run_once(&plain, paths, p, m, &args(rep == 0)) {
                    Ok((secs, out)) if rep > 0 => {
                        eprintln!(
                            "eh: {:<10} {:<9} rep {rep}: {secs:7.3} s",
                            p.name, BUILDS[b].0
                        );
                        times[b].push(secs);
                        if !outputs.contains(&out) {
                            outputs.push(out);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!("eh: {} / {} FAILED: {e:#}", p.name, BUILDS[b].0);
                        failed = Some(format!("{} failed", BUILDS[b].0));
                        break 'reps;
                    }
                }
            }
        }
        let med: Vec<Option<f64>> = times.iter().map(|t| median(t)).collect();
        let ratio = |b: usize, of: usize| Some(med[b]? / med[of]?);
        if let (Some(d), Some(e), Some(p)) = (ratio(1, 0), ratio(2, 0), ratio(3, 0)) {
            r_default.push(d);
            r_eh.push(e);
            r_points.push(p);
        }
        let kib = |x: Option<u64>| x.map_or("-".into(), |x| format!("{:.0}", x as f64 / 1024.0));
        let sizes = |f: &dyn Fn(&Path) -> Option<u64>| {
            p.modules
                .iter()
                .take(3)
                .map(|(m, _, _)| kib(f(m)))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let f2 = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.3}"));
        table.push(vec![
            p.name.clone(),
            f2(med[0]),
            f2(ratio(1, 0)),
            f2(ratio(2, 0)),
            f2(ratio(3, 0)),
            f2(ratio(2, 1)),
            sizes(&|m| code_bytes(&std::fs::read(m).ok()?)),
            sizes(&|m| compiled_text(&cache, m)),
            format!(
                "{:.1} / {:.1}",
                p.modules[1].1.unwrap_or(f64::NAN),
                p.modules[2].1.unwrap_or(f64::NAN)
            ),
            p.modules[2]
                .2
                .split(',')
                .filter_map(|x| x.split_whitespace().next())
                .collect::<Vec<_>>()
                .join(" / "),
            failed.unwrap_or_else(|| match outputs.len() {
                1 => "same".into(),
                _ => "DIFFERS".into(),
            }),
        ]);
    }
    let g = |xs: &[f64]| geomean(xs).map_or("-".into(), |x| format!("{x:.3}"));
    let worst = |xs: &[f64]| xs.iter().copied().fold(f64::NAN, f64::max);
    notes.push(format!(
        "geomean over {} programs (those whose every build ran): default (Asyncify) ÷ plain {}, eh ÷ plain {}, eh-points ÷ plain {}; worst {:.3}, {:.3} and {:.3}",
        r_eh.len(),
        g(&r_default),
        g(&r_eh),
        g(&r_points),
        worst(&r_default),
        worst(&r_eh),
        worst(&r_points)
    ));
    notes.push("all four builds run on plain-wasmtime (wasmtime 48, Cranelift, exceptions on), so only the prepared code differs; \"output\" compares all of stdout across builds and repetitions (coremark prints its own timings, so it always differs); code KiB is the code section, .text KiB the machine code in wasmtime's compiled artifact".into());
    Ok(Report {
        figure: None,
        name: "eh".into(),
        label: opts.size.clone(),
        title: "Capture by exceptions against Asyncify, on plain wasmtime".into(),
        setup: format!(
            "`roam-bench eh --size {} --reps {} --extra-reps {}{}`; CPU time (user + system) per process, compile cache warm, median of {} repetitions ({} for programs outside the suite), builds interleaved",
            opts.size,
            opts.reps,
            opts.extra_reps,
            opts.extra
                .iter()
                .map(|e| format!(" --extra '{}=…'", e.name))
                .collect::<String>(),
            opts.reps,
            opts.extra_reps
        ),
        table,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_programs_parse_with_dirs_and_args() {
        let e = Extra::parse("lua=/x/lua.wasm --dir=/a::/b - 3 --stdin=/x/b.lua").unwrap();
        assert_eq!(e.name, "lua");
        assert_eq!(e.path, PathBuf::from("/x/lua.wasm"));
        assert_eq!(e.args, ["-", "3"]);
        assert_eq!(e.dirs, ["/a::/b"]);
        assert_eq!(e.stdin, Some(PathBuf::from("/x/b.lua")));
        assert!(Extra::parse("nopath").is_err());
    }

    #[test]
    fn elf_text_needs_an_elf() {
        assert_eq!(elf_text(b"not an elf"), None);
    }
}
