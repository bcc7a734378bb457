//! Result tables: printed as markdown, written as CSV and markdown files.
//!
//! Why it exists: every benchmark ends the same way — a table on stdout and
//! `bench/results/<benchmark>/<YYYY-MM-DD>-<label>.{csv,md}`, the `.md`
//! recording the machine, date, commit and prepare revision — so a result
//! can always be traced to its hardware, date and code. Writing one also
//! regenerates the index, `bench/results/README.md` (`index.rs`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// One table of results.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// Column names.
    pub headers: Vec<String>,
    /// Rows, each as long as `headers`.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these columns.
    pub fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Append a row (padded or truncated to the header width).
    pub fn push(&mut self, mut row: Vec<String>) {
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
    }

    /// GitHub-flavoured markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        s.push_str(&line(&self.headers));
        let sep: Vec<String> = self.headers.iter().map(|_| "---".to_string()).collect();
        s.push_str(&line(&sep));
        for r in &self.rows {
            s.push_str(&line(r));
        }
        s
    }

    /// RFC 4180 CSV (fields with commas, quotes or newlines are quoted).
    pub fn csv(&self) -> String {
        let field = |f: &String| {
            if f.contains([',', '"', '\n']) {
                format!("\"{}\"", f.replace('"', "\"\""))
            } else {
                f.clone()
            }
        };
        let mut s = String::new();
        for r in std::iter::once(&self.headers).chain(&self.rows) {
            let cells: Vec<String> = r.iter().map(field).collect();
            let _ = writeln!(s, "{}", cells.join(","));
        }
        s
    }
}

fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The commit the bench was built from, as `git describe --always
/// --dirty` says in the repository, or `unknown` when git or the
/// repository is not there.
pub fn commit() -> String {
    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    command_line("git", &["-C", repo, "describe", "--always", "--dirty"])
}

/// A UTC time as `(YYYY-MM-DD, YYYY-MM-DDTHH:MM:SSZ)`.
pub fn utc(t: SystemTime) -> (String, String) {
    let t = time::OffsetDateTime::from(t);
    let date = format!("{:04}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day());
    let time = format!(
        "{date}T{:02}:{:02}:{:02}Z",
        t.hour(),
        t.minute(),
        t.second()
    );
    (date, time)
}

/// `uname -m`, core count, CPU model and kernel, as markdown list items.
pub fn machine_info() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    format!(
        "- machine: `{}`, {} cores, {}\n- kernel: {}\n",
        command_line("uname", &["-m"]),
        cores,
        cpu,
        command_line("uname", &["-sr"]),
    )
}

/// Where and when a result was made: what [`Report::markdown`] writes
/// above the table.
#[derive(Debug, Clone)]
pub struct Provenance {
    /// [`machine_info`].
    pub machine: String,
    /// UTC date and time, `YYYY-MM-DDTHH:MM:SSZ`.
    pub time: String,
    /// [`commit`].
    pub commit: String,
    /// `roam_prepare::OUTPUT_REVISION` of the `roam-prepare` the bench was
    /// built with.
    pub revision: u32,
}

impl Provenance {
    /// This machine, now, this build.
    pub fn here(time: String) -> Self {
        Provenance {
            machine: machine_info(),
            time,
            commit: commit(),
            revision: roam_prepare::OUTPUT_REVISION,
        }
    }
}

/// A benchmark's full result.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The benchmark: the directory under `bench/results` (`t1`, `t13`,
    /// `t1-real`, `t4-pause`, ...).
    pub name: String,
    /// What sets this run apart from others of the same benchmark (a size,
    /// a capture, a backend; `roam-bench --label` adds to it). The file is
    /// `<date>-<label>`; an empty label is written as `run`.
    pub label: String,
    /// Heading of the markdown file.
    pub title: String,
    /// How it was run (command line, sizes).
    pub setup: String,
    /// The table (also the CSV).
    pub table: Table,
    /// Summary lines under the table (targets, geomeans, caveats). The
    /// headline is picked from them ([`crate::index::pick_headline`]): put
    /// the main figure in bold in one of them.
    pub notes: Vec<String>,
    /// A plot, as SVG: written beside the table as `<date>-<label>.svg` and
    /// shown in the markdown.
    pub figure: Option<String>,
}

impl Report {
    /// The headline: the first note with a bold figure, else the first
    /// that says whether a target is met, else the first with a figure and
    /// a geomean, a p99 or a count of cases, else
    /// [`crate::index::SEE_TABLE`].
    pub fn headline(&self) -> &str {
        let notes: Vec<&str> = self.notes.iter().map(String::as_str).collect();
        crate::index::pick_headline(&notes).unwrap_or(crate::index::SEE_TABLE)
    }

    /// The markdown document; `figure` is the file name of the plot, when
    /// there is one.
    pub fn markdown(&self, p: &Provenance, figure: Option<&str>) -> String {
        let mut s = format!(
            "# {}\n\n{}- date: {}\n- commit: `{}`\n- prepare revision: {}\n- setup: {}\n- headline: {}\n\n",
            self.title,
            p.machine,
            p.time,
            p.commit,
            p.revision,
            self.setup,
            self.headline().replace('\n', " "),
        );
        s.push_str(&self.table.markdown());
        if let Some(f) = figure {
            let _ = write!(s, "\n![{}]({f})\n", self.title);
        }
        if !self.notes.is_empty() {
            s.push('\n');
            for n in &self.notes {
                let _ = writeln!(s, "- {n}");
            }
        }
        s
    }

    /// Print the markdown to stdout, write
    /// `<dir>/<name>/<YYYY-MM-DD>-<label>.csv` and `.md` (with `-2`, `-3`,
    /// ... after the label when that run already has files there), then
    /// regenerate `<dir>/README.md`, the index. Returns the `.md` written.
    ///
    /// The CSV is the table alone, plain RFC 4180 that any reader takes;
    /// the `.md` beside it, same name, is its record of machine, date,
    /// commit and prepare revision.
    pub fn emit(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let (date, time) = utc(SystemTime::now());
        let bench = dir.join(&self.name);
        std::fs::create_dir_all(&bench)?;
        let stem = free_stem(&bench, &date, &self.label);
        let svg = format!("{stem}.svg");
        let md = self.markdown(
            &Provenance::here(time),
            self.figure.as_ref().map(|_| svg.as_str()),
        );
        println!("{md}");
        if let Some(f) = &self.figure {
            std::fs::write(bench.join(&svg), f)?;
        }
        std::fs::write(bench.join(format!("{stem}.csv")), self.table.csv())?;
        let written = bench.join(format!("{stem}.md"));
        std::fs::write(&written, md)?;
        eprintln!("wrote {}/{stem}.{{csv,md}}", bench.display());
        crate::index::write(dir)?;
        Ok(written)
    }
}

/// `<date>-<label>`, or with `-2`, `-3`, ... after it, whichever has no
/// `.md` or `.csv` in `dir` yet.
fn free_stem(dir: &Path, date: &str, label: &str) -> String {
    let label = if label.is_empty() { "run" } else { label };
    let base = format!("{date}-{label}");
    let taken = |s: &str| {
        ["md", "csv", "svg"]
            .iter()
            .any(|e| dir.join(format!("{s}.{e}")).exists())
    };
    (1..)
        .map(|n| match n {
            1 => base.clone(),
            n => format!("{base}-{n}"),
        })
        .find(|s| !taken(s))
        .expect("some suffix is free")
}

/// A label and the one given on the command line (`--label`), joined by
/// `-`.
pub fn join_label(label: &str, extra: Option<&str>) -> String {
    match extra.filter(|e| !e.is_empty()) {
        None => label.to_string(),
        Some(e) if label.is_empty() => e.to_string(),
        Some(e) => format!("{label}-{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new(&["name", "value"]);
        t.push(vec!["a".into(), "1".into()]);
        t.push(vec!["b, \"c\"".into()]);
        t
    }

    #[test]
    fn markdown_has_header_separator_and_rows() {
        assert_eq!(
            sample().markdown(),
            "| name | value |\n| --- | --- |\n| a | 1 |\n| b, \"c\" |  |\n"
        );
    }

    #[test]
    fn csv_quotes_special_fields() {
        assert_eq!(sample().csv(), "name,value\na,1\n\"b, \"\"c\"\"\",\n");
    }

    fn report() -> Report {
        Report {
            figure: None,
            name: "tx".into(),
            label: "M".into(),
            title: "Test".into(),
            setup: "none".into(),
            table: sample(),
            notes: vec!["note one".into(), "geomean **1.25×**".into()],
        }
    }

    fn today() -> String {
        utc(SystemTime::now()).0
    }

    #[test]
    fn emit_writes_both_files_under_the_benchmark_and_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let r = report();
        let written = r.emit(dir.path()).unwrap();
        let stem = format!("{}-M", today());
        assert_eq!(written, dir.path().join("tx").join(format!("{stem}.md")));
        let md = std::fs::read_to_string(&written).unwrap();
        assert!(md.starts_with("# Test\n\n- machine: `"));
        assert!(md.contains("cores"));
        assert!(md.ends_with("- geomean **1.25×**\n"));
        let csv = std::fs::read_to_string(dir.path().join(format!("tx/{stem}.csv"))).unwrap();
        assert_eq!(csv, sample().csv());
        let index = std::fs::read_to_string(dir.path().join("README.md")).unwrap();
        assert!(index.contains(&format!("tx/{stem}.md")), "{index}");
        assert!(index.contains("geomean **1.25×**"), "{index}");
        // The same run again does not overwrite the first.
        let again = r.emit(dir.path()).unwrap();
        assert_eq!(again, dir.path().join(format!("tx/{stem}-2.md")));
    }

    #[test]
    fn the_md_records_commit_revision_date_and_headline() {
        let dir = tempfile::tempdir().unwrap();
        let md = std::fs::read_to_string(report().emit(dir.path()).unwrap()).unwrap();
        let line = |key: &str| {
            md.lines()
                .find_map(|l| l.strip_prefix(&format!("- {key}: ")))
                .unwrap_or_else(|| panic!("no `- {key}:` line in\n{md}"))
                .to_string()
        };
        let commit = line("commit");
        assert!(commit.starts_with('`') && commit.ends_with('`') && commit.len() > 2);
        assert_eq!(commit.trim_matches('`'), super::commit());
        assert_eq!(
            line("prepare revision"),
            roam_prepare::OUTPUT_REVISION.to_string()
        );
        assert!(line("date").starts_with(&today()));
        assert_eq!(line("headline"), "geomean **1.25×**");
    }

    #[test]
    fn provenance_goes_above_the_table() {
        let p = Provenance {
            machine: "- machine: `x`\n".into(),
            time: "2026-01-02T03:04:05Z".into(),
            commit: "unknown".into(),
            revision: 7,
        };
        let md = report().markdown(&p, None);
        assert!(md.starts_with(
            "# Test\n\n- machine: `x`\n- date: 2026-01-02T03:04:05Z\n- commit: `unknown`\n\
             - prepare revision: 7\n- setup: none\n- headline: geomean **1.25×**\n\n| name |"
        ));
    }

    #[test]
    fn headline_is_the_first_bold_note_else_one_with_a_verdict() {
        let mut r = report();
        assert_eq!(r.headline(), "geomean **1.25×**");
        r.notes = vec!["note one".into(), "target T1: NOT met".into()];
        assert_eq!(r.headline(), "target T1: NOT met");
        r.notes.pop();
        assert_eq!(r.headline(), crate::index::SEE_TABLE);
    }

    #[test]
    fn labels_and_dates() {
        assert_eq!(join_label("M", None), "M");
        assert_eq!(join_label("M", Some("final")), "M-final");
        assert_eq!(join_label("", Some("final")), "final");
        assert_eq!(join_label("", Some("")), "");
        let d = tempfile::tempdir().unwrap();
        assert_eq!(free_stem(d.path(), "2026-01-02", ""), "2026-01-02-run");
        std::fs::write(d.path().join("2026-01-02-run.csv"), "").unwrap();
        assert_eq!(free_stem(d.path(), "2026-01-02", ""), "2026-01-02-run-2");
        let at = |s: u64| utc(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        assert_eq!(at(0).1, "1970-01-01T00:00:00Z");
        // 2000-02-29 (a leap day) 12:34:56 and 2026-11-29 23:59:59 UTC.
        assert_eq!(at(951_827_696).1, "2000-02-29T12:34:56Z");
        assert_eq!(at(1_795_996_799).0, "2026-11-29");
    }
}
