//! Result tables: printed as markdown, written as CSV and markdown files.
//!
//! Why it exists: every benchmark ends the same way — a table on stdout and
//! `bench/results/<name>.{csv,md}` with the machine it ran on — so a result
//! can always be traced to its hardware and date.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

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

/// `uname -m`, core count, CPU model, UTC date, and the commit and
/// prepare revision that produced the result, as a markdown list.
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
    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    format!(
        "- machine: `{}`, {} cores, {}\n- kernel: {}\n- date: {}\n- commit: `{}`, prepare revision {}\n",
        command_line("uname", &["-m"]),
        cores,
        cpu,
        command_line("uname", &["-sr"]),
        command_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        command_line("git", &["-C", repo, "describe", "--always", "--dirty"]),
        roam_prepare::OUTPUT_REVISION,
    )
}

/// A benchmark's full result.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// File stem: `t1`, `t2`, `t3`.
    pub name: String,
    /// Heading of the markdown file.
    pub title: String,
    /// How it was run (command line, sizes).
    pub setup: String,
    /// The table (also the CSV).
    pub table: Table,
    /// Summary lines under the table (targets, geomeans, caveats).
    pub notes: Vec<String>,
}

impl Report {
    /// The markdown document.
    pub fn markdown(&self, machine: &str) -> String {
        let mut s = format!("# {}\n\n{machine}- setup: {}\n\n", self.title, self.setup);
        s.push_str(&self.table.markdown());
        if !self.notes.is_empty() {
            s.push('\n');
            for n in &self.notes {
                let _ = writeln!(s, "- {n}");
            }
        }
        s
    }

    /// Print the markdown to stdout and write `<dir>/<name>.csv` and `.md`.
    pub fn emit(&self, dir: &Path) -> std::io::Result<()> {
        let md = self.markdown(&machine_info());
        println!("{md}");
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join(format!("{}.csv", self.name)), self.table.csv())?;
        std::fs::write(dir.join(format!("{}.md", self.name)), md)?;
        eprintln!("wrote {}/{}.{{csv,md}}", dir.display(), self.name);
        Ok(())
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

    #[test]
    fn emit_writes_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let r = Report {
            name: "tx".into(),
            title: "Test".into(),
            setup: "none".into(),
            table: sample(),
            notes: vec!["note one".into()],
        };
        r.emit(dir.path()).unwrap();
        let md = std::fs::read_to_string(dir.path().join("tx.md")).unwrap();
        assert!(md.starts_with("# Test\n\n- machine: `"));
        assert!(md.contains("cores"));
        assert!(md.ends_with("- note one\n"));
        let csv = std::fs::read_to_string(dir.path().join("tx.csv")).unwrap();
        assert_eq!(csv, sample().csv());
    }
}
