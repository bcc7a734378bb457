//! T1: steady-state overhead of a prepared program, against plain wasmtime,
//! native code and qemu.
//!
//! Why it exists: roam's promise is that a migratable program runs nearly as
//! fast as the same program on plain wasmtime (target: prepared ÷ unprepared
//! ≤ 1.10× geomean). The `functions` and `manual` builds split the overhead
//! into its causes: `manual` is Asyncify alone (plus roam's epoch checks),
//! `functions` adds a point per non-leaf function entry, `loops` (the
//! default) adds one per loop header. Native and qemu runs put the numbers in
//! context (T6: is wasm on this ISA better than emulating the other ISA?).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;

use crate::paths::Paths;
use crate::prepare::{prepare_to, PreparedFile, POLICIES};
use crate::proc::{run_timed, Timed};
use crate::report::{Report, Table};
use crate::stats::{geomean, median};

/// Every workload, in table order.
pub use roam_testkit::WORKLOADS;

/// Options of `roam-bench t1`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Size class passed as argv[1]: S, M or L.
    pub size: String,
    /// Repetitions per variant (the median is reported).
    pub reps: usize,
    /// Restrict to these workloads.
    pub only: Option<Vec<String>>,
}

/// One way of running a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    Native,
    Plain,
    Roam(usize),
    Qemu,
}

impl Variant {
    fn label(self) -> String {
        match self {
            Variant::Native => "native".into(),
            Variant::Plain => "plain".into(),
            Variant::Roam(i) => format!("roam-{}", POLICIES[i].0),
            Variant::Qemu => "qemu-aarch64".into(),
        }
    }
}

struct Workload {
    name: String,
    wasm: PathBuf,
    prepared: Vec<PreparedFile>,
    native: Option<PathBuf>,
    qemu: Option<PathBuf>,
}

impl Workload {
    fn variants(&self) -> Vec<Variant> {
        let mut v = Vec::new();
        if self.native.is_some() {
            v.push(Variant::Native);
        }
        v.push(Variant::Plain);
        v.extend((0..POLICIES.len()).map(Variant::Roam));
        if self.qemu.is_some() {
            v.push(Variant::Qemu);
        }
        v
    }
}

struct Tools {
    roam: PathBuf,
    plain: PathBuf,
    paths: Paths,
}

impl Tools {
    fn command(&self, w: &Workload, v: Variant, size: &str) -> anyhow::Result<Command> {
        let needs_dir = w.name == "filework";
        let data = if needs_dir {
            Some(self.paths.fresh_dir(&format!("data-{}", v.label()))?)
        } else {
            None
        };
        let native_args = |c: &mut Command| {
            c.arg(size);
            if let Some(d) = &data {
                c.arg(d);
            }
        };
        let dir_flag = |c: &mut Command| {
            if let Some(d) = &data {
                c.arg("--dir").arg(format!("{}::/data", d.display()));
            }
        };
        let mut c;
        match v {
            Variant::Native => {
                c = Command::new(w.native.as_ref().context("no native build")?);
                native_args(&mut c);
            }
            Variant::Qemu => {
                c = Command::new("qemu-aarch64");
                c.arg(w.qemu.as_ref().context("no aarch64 build")?);
                native_args(&mut c);
            }
            Variant::Plain => {
                c = Command::new(&self.plain);
                dir_flag(&mut c);
                c.arg(&w.wasm).arg(size);
            }
            Variant::Roam(i) => {
                c = Command::new(&self.roam);
                c.arg("run");
                dir_flag(&mut c);
                c.arg(&w.prepared[i].path).arg("--").arg(size);
            }
        }
        c.env("ROAM_CACHE_DIR", self.paths.scratch.join("roam-cache"))
            .env(
                "PLAIN_WASMTIME_CACHE",
                self.paths.scratch.join("plain-cache"),
            );
        Ok(c)
    }

    fn run(&self, w: &Workload, v: Variant, size: &str) -> anyhow::Result<Timed> {
        run_timed(&mut self.command(w, v, size)?)
            .with_context(|| format!("{} / {}", w.name, v.label()))
    }
}

fn load_workloads(paths: &Paths, only: &Option<Vec<String>>) -> anyhow::Result<Vec<Workload>> {
    let prepared_dir = paths.scratch.join("prepared");
    let mut out = Vec::new();
    for name in WORKLOADS {
        if only.as_ref().is_some_and(|o| !o.iter().any(|n| n == name)) {
            continue;
        }
        let wasm = paths.wasm(name)?;
        let prepared = POLICIES
            .iter()
            .map(|(pn, p)| prepare_to(&wasm, &prepared_dir, pn, *p))
            .collect::<anyhow::Result<Vec<_>>>()?;
        eprintln!(
            "t1: prepared {name} ({} points, loops policy)",
            prepared[0].points.0 + prepared[0].points.1
        );
        out.push(Workload {
            name: name.to_string(),
            native: paths.native(std::env::consts::ARCH, name),
            qemu: paths
                .native("aarch64", name)
                .filter(|_| std::env::consts::ARCH != "aarch64"),
            wasm,
            prepared,
        });
    }
    Ok(out)
}

type Samples = BTreeMap<Variant, (Vec<f64>, Option<String>)>;

/// Run T1 and return its report.
pub fn run(paths: &Paths, opts: &Options) -> anyhow::Result<Report> {
    let tools = Tools {
        roam: paths.tool("roam")?,
        plain: paths.tool("plain-wasmtime")?,
        paths: paths.clone(),
    };
    let workloads = load_workloads(paths, &opts.only)?;
    // Warm the compile caches with the small size, and check every variant
    // works; a variant that fails is reported and left out, not fatal.
    let mut failed: Vec<(String, Variant, String)> = Vec::new();
    for w in &workloads {
        for v in w.variants() {
            if matches!(v, Variant::Plain | Variant::Roam(_)) {
                if let Err(e) = tools.run(w, v, "S") {
                    eprintln!("t1: {} / {} FAILED: {e:#}", w.name, v.label());
                    failed.push((w.name.clone(), v, format!("{e:#}")));
                }
            }
        }
    }
    let mut results: Vec<(&Workload, Samples)> = Vec::new();
    for w in &workloads {
        let mut s = Samples::new();
        for rep in 0..opts.reps {
            // Variants interleaved per repetition, so drift hits all alike.
            for v in w.variants() {
                if failed.iter().any(|(n, fv, _)| *n == w.name && *fv == v) {
                    continue;
                }
                let t = match tools.run(w, v, &opts.size) {
                    Ok(t) => t,
                    Err(e) => {
                        eprintln!("t1: {} / {} FAILED: {e:#}", w.name, v.label());
                        failed.push((w.name.clone(), v, format!("{e:#}")));
                        continue;
                    }
                };
                eprintln!(
                    "t1: {:<9} {:<15} rep {}/{}: {:8.3} s  checksum {}",
                    w.name,
                    v.label(),
                    rep + 1,
                    opts.reps,
                    t.wall.as_secs_f64(),
                    t.checksum.as_deref().unwrap_or("-")
                );
                let e = s.entry(v).or_default();
                e.0.push(t.wall.as_secs_f64());
                e.1 = t.checksum;
            }
        }
        results.push((w, s));
    }
    let mut report = build_report(&results, opts);
    for (name, v, e) in &failed {
        let e: String = e.chars().take(300).collect();
        report.notes.push(format!(
            "FAILED {name} / {}: {}",
            v.label(),
            e.replace('|', "/")
        ));
        if let Some(row) = report.table.rows.iter_mut().find(|r| r[0] == *name) {
            if let Some(last) = row.last_mut() {
                if !last.is_empty() {
                    last.push_str(", ");
                }
                last.push_str(&v.label());
            }
        }
    }
    Ok(report)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b?)
}

fn fmt(x: Option<f64>, prec: usize) -> String {
    x.map_or("-".into(), |x| format!("{x:.prec$}"))
}

fn build_report(results: &[(&Workload, Samples)], opts: &Options) -> Report {
    let mut t = Table::new(&[
        "workload",
        "native s",
        "plain s",
        "roam loops s",
        "roam functions s",
        "roam manual s",
        "roam outer s",
        "qemu-aarch64 s",
        "loops ÷ plain",
        "functions ÷ plain",
        "manual ÷ plain",
        "outer ÷ plain",
        "plain ÷ native",
        "roam ÷ native",
        "qemu ÷ native",
        "points loop+func",
        "points (functions policy)",
        "file KiB unprepared→prepared",
        "code section ×",
        "checksums",
        "failed variants",
    ]);
    let mut geo: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut mismatches = Vec::new();
    for (w, s) in results {
        let m = |v: Variant| s.get(&v).and_then(|x| median(&x.0));
        let (native, plain, qemu) = (m(Variant::Native), m(Variant::Plain), m(Variant::Qemu));
        let roam: Vec<Option<f64>> = (0..POLICIES.len()).map(|i| m(Variant::Roam(i))).collect();
        let ratios = [
            ("loops ÷ plain", ratio(roam[0], plain)),
            ("functions ÷ plain", ratio(roam[1], plain)),
            ("manual ÷ plain", ratio(roam[2], plain)),
            ("outer ÷ plain", ratio(roam[3], plain)),
            ("plain ÷ native", ratio(plain, native)),
            ("roam ÷ native", ratio(roam[0], native)),
            ("qemu ÷ native", ratio(qemu, native)),
        ];
        for (k, r) in ratios {
            if let Some(r) = r {
                geo.entry(k).or_default().push(r);
            }
        }
        let sums: Vec<&String> = s.values().filter_map(|x| x.1.as_ref()).collect();
        let same = !sums.is_empty() && sums.len() == s.len() && sums.iter().all(|c| *c == sums[0]);
        if !same {
            mismatches.push(w.name.clone());
        }
        let src = std::fs::read(&w.wasm).unwrap_or_default();
        let code = crate::prepare::code_bytes(&src).unwrap_or(0);
        let p = &w.prepared;
        let mut row = vec![w.name.clone(), fmt(native, 3), fmt(plain, 3)];
        row.extend(roam.iter().map(|r| fmt(*r, 3)));
        row.push(fmt(qemu, 3));
        row.extend(ratios.iter().map(|(_, r)| fmt(*r, 3)));
        row.push(format!("{}+{}", p[0].points.0, p[0].points.1));
        row.push(format!("{}", p[1].points.1));
        row.push(format!("{}→{}", src.len() / 1024, p[0].bytes / 1024));
        row.push(fmt(Some(p[0].code as f64 / code.max(1) as f64), 2));
        row.push(if same {
            "all equal".into()
        } else {
            "MISMATCH".into()
        });
        t.push(row);
    }
    let mut notes: Vec<String> = geo
        .iter()
        .map(|(k, v)| {
            format!(
                "geomean {k}: {} over {} workloads",
                fmt(geomean(v), 3),
                v.len()
            )
        })
        .collect();
    if let Some(g) = geo.get("loops ÷ plain").and_then(|v| geomean(v)) {
        notes.push(format!(
            "target T1 (prepared ÷ unprepared ≤ 1.10×): {}",
            if g <= 1.10 { "met" } else { "NOT met" }
        ));
    }
    notes.push(if mismatches.is_empty() {
        "every variant printed the same checksum for every workload".into()
    } else {
        format!("checksum MISMATCH in: {}", mismatches.join(", "))
    });
    notes.push("times are wall-clock per process (spawn to exit, compile caches warm), median of the repetitions".into());
    Report {
        figure: None,
        name: "t1".into(),
        label: opts.size.clone(),
        title: "T1: steady-state overhead".into(),
        setup: format!("`roam-bench t1 --size {} --reps {}`", opts.size, opts.reps),
        table: t,
        notes,
    }
}

/// Parse `--only a,b`, rejecting unknown names.
pub fn parse_only(s: &str) -> anyhow::Result<Vec<String>> {
    s.split(',')
        .filter(|n| !n.is_empty())
        .map(|n| {
            if WORKLOADS.contains(&n) {
                Ok(n.to_string())
            } else {
                anyhow::bail!("unknown workload {n} (known: {})", WORKLOADS.join(","))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(native: bool) -> Workload {
        let pf = |p: u32| PreparedFile {
            path: PathBuf::from("x.wasm"),
            bytes: 2048,
            code: 1024,
            points: (p, 1, 0),
        };
        Workload {
            name: "ep".into(),
            wasm: PathBuf::from("/nonexistent/ep.wasm"),
            prepared: vec![pf(3), pf(0), pf(0), pf(2)],
            native: native.then(|| PathBuf::from("n")),
            qemu: native.then(|| PathBuf::from("q")),
        }
    }

    #[test]
    fn variants_follow_available_builds() {
        assert_eq!(workload(true).variants().len(), 7);
        assert_eq!(
            workload(false).variants(),
            vec![
                Variant::Plain,
                Variant::Roam(0),
                Variant::Roam(1),
                Variant::Roam(2),
                Variant::Roam(3)
            ]
        );
    }

    #[test]
    fn only_rejects_unknown_names() {
        assert_eq!(parse_only("ep,cg").unwrap(), vec!["ep", "cg"]);
        assert!(parse_only("ep,nope").is_err());
    }

    #[test]
    fn report_ratios_geomeans_and_checksum_mismatch() {
        let w = workload(true);
        let mut s = Samples::new();
        let sum = |c: &str| Some(c.to_string());
        s.insert(Variant::Native, (vec![1.0, 1.2, 1.1], sum("aa")));
        s.insert(Variant::Plain, (vec![2.0], sum("aa")));
        s.insert(Variant::Roam(0), (vec![2.1], sum("aa")));
        s.insert(Variant::Roam(1), (vec![2.1], sum("aa")));
        s.insert(Variant::Roam(2), (vec![2.0], sum("aa")));
        s.insert(Variant::Roam(3), (vec![2.0], sum("aa")));
        s.insert(Variant::Qemu, (vec![5.5], sum("bb")));
        let opts = Options {
            size: "S".into(),
            reps: 1,
            only: None,
        };
        let r = build_report(&[(&w, s)], &opts);
        let row = &r.table.rows[0];
        assert_eq!(row[1], "1.100");
        assert_eq!(row[8], "1.050"); // loops ÷ plain
        assert_eq!(row[11], "1.000"); // outer ÷ plain
        assert_eq!(row[14], "5.000"); // qemu ÷ native
        assert_eq!(row[15], "3+1");
        assert_eq!(row[row.len() - 2], "MISMATCH");
        assert_eq!(row.len(), r.table.headers.len());
        assert_eq!(row.last().unwrap(), "", "no failed variants");
        assert!(r
            .notes
            .iter()
            .any(|n| n == "target T1 (prepared ÷ unprepared ≤ 1.10×): met"));
        assert!(r.notes.iter().any(|n| n.contains("MISMATCH in: ep")));
    }
}
