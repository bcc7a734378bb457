//! The real-program suite's manifest, `workloads/real/suite.toml`.
//!
//! The suite is programs that no one on the roam team wrote (Lua, zstd,
//! SQLite, QuickJS, ...), built from pinned registry sources by
//! `workloads/real/build.sh`. Tests and benchmarks both read the manifest
//! through this module, so that what "the right output" means for each
//! program is said once: which part of stdout is compared (some programs
//! print run times), and what it must match.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The whole manifest.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    /// Every entry, in file order.
    #[serde(rename = "program")]
    pub programs: Vec<Program>,
}

/// One run configuration of one module.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Program {
    /// Unique name of the entry.
    pub name: String,
    /// Module path, relative to `target/workloads/real/`.
    pub wasm: String,
    /// The program's licence (SPDX), for reference.
    pub license: String,
    /// `stdout` (all of it is compared) or `lines` (only lines matching
    /// [`Program::lines`]).
    pub compare: Compare,
    /// With [`Compare::Lines`]: the lines compared.
    #[serde(default)]
    pub lines: Option<String>,
    /// The small size: tests, many times over, and under qemu-user.
    pub test: Size,
    /// The benchmark size, if the program has one.
    #[serde(default)]
    pub bench: Option<Size>,
}

/// What of stdout is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compare {
    /// All of stdout.
    Stdout,
    /// Only the lines matching the entry's `lines` regex.
    Lines,
}

/// One size of a program: how to run it and what it must print.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Size {
    /// argv after argv\[0\].
    pub args: Vec<String>,
    /// A file fed on stdin, relative to `target/workloads/real/`.
    #[serde(default)]
    pub stdin: Option<String>,
    /// A guest path for a writable preopened directory.
    #[serde(default)]
    pub dir: Option<String>,
    /// A regex that must match somewhere in stdout.
    #[serde(default)]
    pub expect: Option<String>,
    /// The sha256 (hex) of the compared stdout.
    #[serde(default)]
    pub expect_sha256: Option<String>,
}

/// Why the manifest could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The manifest.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid manifest.
    #[error("{path}: {message}")]
    Invalid {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl Suite {
    /// The manifest of the checkout at `root`.
    pub fn load(root: &Path) -> Result<Suite, SuiteError> {
        let path = root.join("workloads/real/suite.toml");
        let text = std::fs::read_to_string(&path).map_err(|source| SuiteError::Read {
            path: path.clone(),
            source,
        })?;
        let suite: Suite = toml::from_str(&text).map_err(|e| SuiteError::Invalid {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let invalid = |message: String| SuiteError::Invalid {
            path: path.clone(),
            message,
        };
        for (i, p) in suite.programs.iter().enumerate() {
            if suite.programs[..i].iter().any(|q| q.name == p.name) {
                return Err(invalid(format!("two entries are named {:?}", p.name)));
            }
            match (p.compare, &p.lines) {
                (Compare::Lines, None) => {
                    return Err(invalid(format!(
                        "{}: compare = \"lines\" needs `lines`",
                        p.name
                    )))
                }
                (Compare::Lines, Some(re)) => {
                    regex::Regex::new(re)
                        .map_err(|e| invalid(format!("{}: `lines`: {e}", p.name)))?;
                }
                (Compare::Stdout, Some(_)) => {
                    return Err(invalid(format!(
                        "{}: `lines` without compare = \"lines\"",
                        p.name
                    )))
                }
                (Compare::Stdout, None) => {}
            }
            for size in std::iter::once(&p.test).chain(&p.bench) {
                if size.expect.is_none() && size.expect_sha256.is_none() {
                    return Err(invalid(format!(
                        "{}: a size without `expect` or `expect_sha256`",
                        p.name
                    )));
                }
                if let Some(re) = &size.expect {
                    regex::Regex::new(re)
                        .map_err(|e| invalid(format!("{}: `expect`: {e}", p.name)))?;
                }
            }
        }
        Ok(suite)
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&Program> {
        self.programs.iter().find(|p| p.name == name)
    }
}

impl Program {
    /// The module, under the checkout at `root`.
    pub fn module(&self, root: &Path) -> PathBuf {
        root.join("target/workloads/real").join(&self.wasm)
    }

    /// The part of `stdout` that is compared.
    pub fn compared(&self, stdout: &[u8]) -> Vec<u8> {
        match (self.compare, &self.lines) {
            (Compare::Lines, Some(re)) => {
                let re = regex::Regex::new(re).expect("checked by Suite::load");
                let mut out = Vec::new();
                for line in String::from_utf8_lossy(stdout).lines() {
                    if re.is_match(line) {
                        out.extend_from_slice(line.as_bytes());
                        out.push(b'\n');
                    }
                }
                out
            }
            _ => stdout.to_vec(),
        }
    }

    /// Whether `stdout` is what `size` must print; the error says what
    /// differs.
    pub fn check(&self, size: &Size, stdout: &[u8]) -> Result<(), String> {
        let compared = self.compared(stdout);
        if let Some(re) = &size.expect {
            let re = regex::Regex::new(re).expect("checked by Suite::load");
            if !re.is_match(&String::from_utf8_lossy(stdout)) {
                return Err(format!("{}: stdout does not match {re}", self.name));
            }
        }
        if let Some(want) = &size.expect_sha256 {
            let got = hex(&Sha256::digest(&compared));
            if !got.eq_ignore_ascii_case(want) {
                return Err(format!(
                    "{}: sha256 of the compared stdout is {got}, expected {want}",
                    self.name
                ));
            }
        }
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .nth(2)
            .unwrap()
            .to_path_buf()
    }

    #[test]
    fn the_committed_manifest_loads() {
        let suite = Suite::load(&root()).unwrap();
        assert!(
            suite.programs.len() >= 8,
            "{} entries",
            suite.programs.len()
        );
    }

    #[test]
    fn lines_keep_only_matches_and_checks_fail_on_difference() {
        let p = Program {
            name: "x".into(),
            wasm: "x.wasm".into(),
            license: "MIT".into(),
            compare: Compare::Lines,
            lines: Some("^hash".into()),
            test: Size {
                args: vec![],
                stdin: None,
                dir: None,
                expect: Some("hash 1".into()),
                expect_sha256: Some(hex(&Sha256::digest(b"hash 1\n"))),
            },
            bench: None,
        };
        assert_eq!(p.compared(b"t 3 ms\nhash 1\nt 4 ms\n"), b"hash 1\n");
        p.check(&p.test, b"took 9 ms\nhash 1\n").unwrap();
        assert!(p.check(&p.test, b"hash 2\n").is_err());
        assert!(p.check(&p.test, b"hash 1\nhash 1\n").is_err());
    }
}
