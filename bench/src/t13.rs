//! T1 and T3 together: the steady-state cost of each way of preparing and
//! running a module, next to the migration response it buys.
//!
//! Why one benchmark: T1 (slowdown ≤ 1.10×) and T3 (response p99 ≤ 1 ms) are
//! one trade-off. Fewer migration points run faster and answer later, so a
//! variant is only good if it meets both, and both must be measured on the
//! *same* prepared modules. Each variant is a set of `roam prepare`
//! arguments plus environment variables for `roam run` and the runtime; the
//! default set covers the policies, and `--variant` adds more, which is how
//! the ablation table (each technique switched off in turn) is made.
//!
//! T1: wall-clock time of `roam run <prepared> -- SIZE` against the
//! unprepared module on `plain-wasmtime` (same wasmtime), variants
//! interleaved per repetition so drift hits all alike. T3: in this process,
//! a `Cell` per run with continue-checkpoints requested every 20–50 ms
//! (see `t3`), at a smaller size.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use roam_runtime::Runtime;

use crate::paths::Paths;
use crate::proc::run_timed;
use crate::report::{Report, Table};
use crate::stats::{geomean, median, percentile, us};

/// One way of preparing and running a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantSpec {
    /// Column label.
    pub name: String,
    /// Extra `roam prepare` arguments.
    pub prepare_args: Vec<String>,
    /// Environment for `roam run` and for the in-process runtime of T3.
    pub env: Vec<(String, String)>,
}

impl VariantSpec {
    /// Parse `NAME=TOKENS`: tokens shaped `UPPER_CASE=value` are environment
    /// variables, the rest are `roam prepare` arguments, e.g.
    /// `no-flag=ROAM_EPOCH_INTERRUPT=1` or `all-fns=--asyncify-scope all`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let (name, rest) = s.split_once('=').unwrap_or((s, ""));
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.+".contains(c))
        {
            bail!("variant `{s}`: the name before `=` must be non-empty [A-Za-z0-9-_.+]");
        }
        let mut v = VariantSpec {
            name: name.into(),
            prepare_args: Vec::new(),
            env: Vec::new(),
        };
        for tok in rest.split_whitespace() {
            match tok.split_once('=') {
                Some((k, val))
                    if !k.is_empty()
                        && k.chars()
                            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') =>
                {
                    v.env.push((k.into(), val.into()))
                }
                _ => v.prepare_args.push(tok.into()),
            }
        }
        Ok(v)
    }

    fn describe(&self) -> String {
        let mut parts: Vec<String> = self.prepare_args.clone();
        parts.extend(self.env.iter().map(|(k, v)| format!("{k}={v}")));
        if parts.is_empty() {
            "defaults".into()
        } else {
            parts.join(" ")
        }
    }
}

/// The variants measured when none is given: the default preparation and
/// every point policy.
pub fn default_variants() -> Vec<VariantSpec> {
    ["default=", "loops=--points loops", "outer=--points outer"]
        .into_iter()
        .chain(["functions=--points functions", "manual=--points manual"])
        .map(|s| VariantSpec::parse(s).expect("built-in variants parse"))
        .collect()
}

/// Options of `roam-bench t13`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Size class for T1 (S, M or L).
    pub size: String,
    /// Repetitions per variant for T1 (the median is reported).
    pub reps: usize,
    /// Size class for T3.
    pub t3_size: String,
    /// Minimum T3 samples per workload and variant (0: skip T3).
    pub t3_samples: usize,
    /// Restrict to these workloads.
    pub only: Option<Vec<String>>,
    /// The variants, the first being the reference for "÷ first".
    pub variants: Vec<VariantSpec>,
}

struct Prepared {
    path: PathBuf,
    points: (u32, u32, u32),
}

/// Prepare `wasm` for every variant with the `roam` executable, so that the
/// flags are exactly what a user would type.
fn prepare_all(
    roam: &Path,
    paths: &Paths,
    name: &str,
    variants: &[VariantSpec],
) -> anyhow::Result<Vec<Prepared>> {
    let wasm = paths.wasm(name)?;
    let dir = paths.scratch.join("prepared-t13");
    std::fs::create_dir_all(&dir)?;
    variants
        .iter()
        .map(|v| {
            let out = dir.join(format!("{name}.{}.wasm", v.name));
            let status = Command::new(roam)
                .arg("prepare")
                .arg(&wasm)
                .arg("-o")
                .arg(&out)
                .args(&v.prepare_args)
                .envs(v.env.iter().cloned())
                .output()
                .context("cannot run roam prepare")?;
            if !status.status.success() {
                bail!(
                    "roam prepare {name} ({}) failed: {}",
                    v.describe(),
                    String::from_utf8_lossy(&status.stderr).trim()
                );
            }
            let bytes = std::fs::read(&out)?;
            let s = roam_prepare::read_section(&bytes)?
                .with_context(|| format!("{} has no roam section", out.display()))?
                .stats;
            Ok(Prepared {
                path: out,
                points: (s.loop_points, s.function_points, s.manual_points),
            })
        })
        .collect()
}

/// Timings and response samples of one workload.
#[derive(Default)]
struct Row {
    plain: Vec<f64>,
    roam: BTreeMap<usize, Vec<f64>>,
    /// Per variant: samples, p99 and maximum of the response, µs.
    response_us: BTreeMap<usize, (usize, Option<f64>, Option<f64>)>,
    checksums: Vec<Option<String>>,
    failed: Vec<String>,
}

fn command(
    roam: &Path,
    plain: &Path,
    paths: &Paths,
    name: &str,
    target: Option<(&Prepared, &VariantSpec)>,
    size: &str,
) -> anyhow::Result<Command> {
    let data = if name == "filework" {
        Some(paths.fresh_dir("data-t13")?)
    } else {
        None
    };
    let mut c;
    match target {
        None => {
            c = Command::new(plain);
            if let Some(d) = &data {
                c.arg("--dir").arg(format!("{}::/data", d.display()));
            }
            c.arg(paths.wasm(name)?).arg(size);
        }
        Some((p, v)) => {
            c = Command::new(roam);
            c.arg("run");
            if let Some(d) = &data {
                c.arg("--dir").arg(format!("{}::/data", d.display()));
            }
            c.arg(&p.path).arg("--").arg(size);
            c.envs(v.env.iter().cloned());
        }
    }
    c.env("ROAM_CACHE_DIR", paths.scratch.join("roam-cache-t13"))
        .env("PLAIN_WASMTIME_CACHE", paths.scratch.join("plain-cache"));
    Ok(c)
}

/// Set exactly `v`'s variables among every variant's variables, for the
/// in-process runtime (read when a `Runtime` is built).
fn set_env(all: &[VariantSpec], v: &VariantSpec) {
    for other in all {
        for (k, _) in &other.env {
            std::env::remove_var(k);
        }
    }
    for (k, val) in &v.env {
        std::env::set_var(k, val);
    }
}

/// Run the benchmark and return its report.
pub fn run(paths: &Paths, opts: &Options) -> anyhow::Result<Report> {
    let roam = paths.tool("roam")?;
    let plain = paths.tool("plain-wasmtime")?;
    let names: Vec<&str> = crate::t1::WORKLOADS
        .into_iter()
        .filter(|n| opts.only.as_ref().is_none_or(|o| o.iter().any(|x| x == n)))
        .collect();
    let vs = &opts.variants;
    let mut prepared = BTreeMap::new();
    for name in &names {
        let p = prepare_all(&roam, paths, name, vs)?;
        eprintln!(
            "t13: prepared {name}: {}",
            vs.iter()
                .zip(&p)
                .map(|(v, p)| format!("{} {}+{}", v.name, p.points.0, p.points.1))
                .collect::<Vec<_>>()
                .join(", ")
        );
        prepared.insert(*name, p);
    }
    let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
    // T1, after one warm-up run of each (compile caches).
    for name in &names {
        let row = rows.entry(name).or_default();
        let p = &prepared[name];
        let targets: Vec<Option<usize>> = std::iter::once(None)
            .chain((0..vs.len()).map(Some))
            .collect();
        for rep in 0..=opts.reps {
            for &t in &targets {
                let target = t.map(|i| (&p[i], &vs[i]));
                let label = t.map_or("plain", |i| vs[i].name.as_str());
                if row.failed.iter().any(|f| f == label) {
                    continue;
                }
                let size = if rep == 0 { "S" } else { opts.size.as_str() };
                let timed = command(&roam, &plain, paths, name, target, size)
                    .and_then(|mut c| run_timed(&mut c));
                let timed = match timed {
                    Ok(x) => x,
                    Err(e) => {
                        eprintln!("t13: {name} / {label} FAILED: {e:#}");
                        row.failed.push(label.into());
                        continue;
                    }
                };
                if rep == 0 {
                    continue;
                }
                let secs = timed.wall.as_secs_f64();
                eprintln!(
                    "t13: {name:<9} {label:<14} rep {rep}/{}: {secs:8.3} s",
                    opts.reps
                );
                match t {
                    None => row.plain.push(secs),
                    Some(i) => row.roam.entry(i).or_default().push(secs),
                }
                row.checksums.push(timed.checksum);
            }
        }
    }
    // T3 on the same prepared files.
    if opts.t3_samples > 0 {
        for (i, v) in vs.iter().enumerate() {
            set_env(vs, v);
            let rt: Runtime = crate::runtime(paths).context("cannot build the runtime")?;
            for name in &names {
                let path = &prepared[name][i].path;
                let s = crate::t3::measure_file(
                    &rt,
                    paths,
                    name,
                    path,
                    &opts.t3_size,
                    crate::t3::Interval::default(),
                    opts.t3_samples,
                );
                let row = rows.get_mut(name).expect("row exists");
                match s {
                    Ok(s) => {
                        let xs: Vec<f64> = s.response.iter().map(|d| us(*d)).collect();
                        eprintln!(
                            "t13: {name:<9} {:<14} response p99 {:.1} µs over {} samples",
                            v.name,
                            percentile(&xs, 99.0).unwrap_or(f64::NAN),
                            xs.len()
                        );
                        row.response_us
                            .insert(i, (xs.len(), percentile(&xs, 99.0), percentile(&xs, 100.0)));
                    }
                    Err(e) => {
                        eprintln!("t13: {name} / {} response FAILED: {e:#}", v.name);
                        row.failed.push(format!("{} (T3)", v.name));
                    }
                }
            }
        }
        set_env(vs, &VariantSpec::parse("none=")?);
    }
    Ok(build_report(&names, &rows, &prepared, opts))
}

fn f(x: Option<f64>, prec: usize) -> String {
    x.map_or("-".into(), |x| format!("{x:.prec$}"))
}

fn build_report(
    names: &[&str],
    rows: &BTreeMap<&str, Row>,
    prepared: &BTreeMap<&str, Vec<Prepared>>,
    opts: &Options,
) -> Report {
    let vs = &opts.variants;
    let mut headers = vec!["workload".to_string(), "plain s".to_string()];
    for v in vs {
        headers.push(format!("{} ÷ plain", v.name));
        headers.push(format!("{} p99 µs", v.name));
        headers.push(format!("{} max µs", v.name));
    }
    headers.push(format!("points loop+func ({})", vs[0].name));
    headers.push("checksums".into());
    headers.push("failed".into());
    let hdr: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut t = Table::new(&hdr);
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); vs.len()];
    let mut worst: Vec<Option<f64>> = vec![None; vs.len()];
    let mut mismatch = Vec::new();
    for name in names {
        let Some(r) = rows.get(name) else { continue };
        let plain = median(&r.plain);
        let mut row = vec![name.to_string(), f(plain, 3)];
        for i in 0..vs.len() {
            let ratio = r
                .roam
                .get(&i)
                .and_then(|x| median(x))
                .zip(plain)
                .map(|(a, b)| a / b);
            if let Some(x) = ratio {
                ratios[i].push(x);
            }
            let (p99, max) = r.response_us.get(&i).map_or((None, None), |x| (x.1, x.2));
            if let Some(p) = p99 {
                worst[i] = Some(worst[i].map_or(p, |w: f64| w.max(p)));
            }
            row.push(f(ratio, 3));
            row.push(f(p99, 0));
            row.push(f(max, 0));
        }
        let p = &prepared[name][0];
        row.push(format!("{}+{}", p.points.0, p.points.1));
        let sums: Vec<&Option<String>> = r.checksums.iter().collect();
        let same = !sums.is_empty() && sums.iter().all(|c| c.is_some() && *c == sums[0]);
        if !same {
            mismatch.push(name.to_string());
        }
        row.push(if same { "all equal" } else { "MISMATCH" }.into());
        row.push(r.failed.join(", "));
        t.push(row);
    }
    let mut notes = Vec::new();
    for (i, v) in vs.iter().enumerate() {
        let g = geomean(&ratios[i]);
        let t1 = g.is_some_and(|g| g <= 1.10) && ratios[i].len() == names.len();
        let t3 = worst[i].is_some_and(|w| w <= 1000.0);
        notes.push(format!(
            "{} ({}): geomean ÷ plain {} over {} workloads, worst response p99 {} µs; T1 {}, T3 {}",
            v.name,
            v.describe(),
            f(g, 3),
            ratios[i].len(),
            f(worst[i], 0),
            if t1 { "met" } else { "NOT met" },
            if opts.t3_samples == 0 {
                "not measured"
            } else if t3 {
                "met"
            } else {
                "NOT met"
            },
        ));
        if i > 0 {
            if let (Some(a), Some(b)) = (g, geomean(&ratios[0])) {
                notes.push(format!(
                    "{} ÷ {}: {:.3} (geomean)",
                    v.name,
                    vs[0].name,
                    a / b
                ));
            }
        }
    }
    notes.push(if mismatch.is_empty() {
        "every run printed the same checksum for every workload".into()
    } else {
        format!("checksum MISMATCH in: {}", mismatch.join(", "))
    });
    notes.push(format!(
        "T1: wall-clock per process (spawn to exit, compile caches warm), median of {} repetitions at size {}, variants interleaved; T3: response (request → migration point) of continue checkpoints every 20–50 ms, ≥ {} samples per workload at size {}, in-process; p99 is over each workload's samples (with 30 samples it is nearly the maximum, so one preemption of the guest's thread decides it), the maximum is shown beside it",
        opts.reps, opts.size, opts.t3_samples, opts.t3_size
    ));
    let vflags: Vec<String> = vs
        .iter()
        .map(|v| {
            format!("--variant '{}={}'", v.name, {
                let mut p = v.prepare_args.clone();
                p.extend(v.env.iter().map(|(k, x)| format!("{k}={x}")));
                p.join(" ")
            })
        })
        .collect();
    Report {
        figure: None,
        name: "t13".into(),
        label: opts.size.clone(),
        title: "T1 and T3 together, per variant".into(),
        setup: format!(
            "`roam-bench t13 --size {} --reps {} --t3-size {} --t3-samples {} {}`",
            opts.size,
            opts.reps,
            opts.t3_size,
            opts.t3_samples,
            vflags.join(" ")
        ),
        table: t,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_specs_split_env_from_prepare_args() {
        let v = VariantSpec::parse("x=--points outer ROAM_EPOCH_INTERRUPT=1 --opt=O3").unwrap();
        assert_eq!(v.name, "x");
        assert_eq!(v.prepare_args, vec!["--points", "outer", "--opt=O3"]);
        assert_eq!(v.env, vec![("ROAM_EPOCH_INTERRUPT".into(), "1".into())]);
        assert_eq!(VariantSpec::parse("d=").unwrap().describe(), "defaults");
        assert!(VariantSpec::parse("=--points loops").is_err());
        assert!(VariantSpec::parse("a/b=").is_err());
        assert_eq!(default_variants()[0].name, "default");
    }

    #[test]
    fn report_has_ratio_and_p99_per_variant_and_flags_targets() {
        let opts = Options {
            size: "S".into(),
            reps: 1,
            t3_size: "S".into(),
            t3_samples: 1,
            only: None,
            variants: vec![
                VariantSpec::parse("a=").unwrap(),
                VariantSpec::parse("b=--points manual").unwrap(),
            ],
        };
        let mut rows = BTreeMap::new();
        let mut r = Row {
            plain: vec![2.0],
            ..Default::default()
        };
        r.roam.insert(0, vec![2.1]);
        r.roam.insert(1, vec![3.0]);
        r.response_us.insert(0, (10, Some(500.0), Some(700.0)));
        r.response_us.insert(1, (10, Some(5000.0), Some(6000.0)));
        r.checksums = vec![Some("aa".into()); 3];
        rows.insert("ep", r);
        let mut prepared = BTreeMap::new();
        let p = |n| Prepared {
            path: PathBuf::from("x"),
            points: (n, 1, 0),
        };
        prepared.insert("ep", vec![p(3), p(0)]);
        let rep = build_report(&["ep"], &rows, &prepared, &opts);
        let row = &rep.table.rows[0];
        assert_eq!(row.len(), rep.table.headers.len());
        assert_eq!(row[2], "1.050");
        assert_eq!(row[3], "500");
        assert_eq!(row[4], "700");
        assert_eq!(row[5], "1.500");
        assert_eq!(row[8], "3+1");
        assert_eq!(row[9], "all equal");
        assert!(rep.notes[0].ends_with("T1 met, T3 met"), "{}", rep.notes[0]);
        assert!(
            rep.notes[1].ends_with("T1 NOT met, T3 NOT met"),
            "{}",
            rep.notes[1]
        );
    }
}
