//! The node's modules form layers: each uses only the modules below it in
//! [`LAYERS`], and only `http` speaks HTTP (axum).
//!
//! Why a test: an import that runs back up (the state calling into the
//! HTTP layer, a migration reaching into a handler) compiles without a
//! word, and is how a crate's modules end up importing each other in a
//! circle. This reads the sources and fails with the line that does it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The crate's modules, from the bottom layer up (`docs/architecture.md`, "Inside
/// roam-node").
const LAYERS: &[&str] = &[
    "size", "ids", "limits", "cpu", "power", "config", "error", "grants", "log", "cell", "metrics",
    "secure", "state", "cells", "kept", "cluster", "migrate", "http", "node",
];

fn layers() -> Vec<String> {
    LAYERS.iter().map(|s| s.to_string()).collect()
}

/// The crate's top-level modules, as `lib.rs` declares them.
fn declared() -> Vec<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    lib.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.to_string())
        })
        .collect()
}

/// Every `.rs` file under `dir`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("readable source directory") {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a source file belongs to.
fn module_of(file: &Path) -> String {
    let rel = file.strip_prefix(src()).expect("under src");
    let first = rel.components().next().expect("a path").as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

/// The code of a line, without its comment.
fn code(line: &str) -> &str {
    match line.find("//") {
        Some(i) => &line[..i],
        None => line,
    }
}

/// The modules named by `crate::NAME` in a line of code.
fn crate_refs(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        let tail = &rest[i + "crate::".len()..];
        let name: String = tail
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.push(name);
        }
        rest = tail;
    }
    out
}

#[test]
fn every_module_has_a_layer() {
    let mut declared = declared();
    let mut layers = layers();
    declared.sort();
    layers.sort();
    assert_eq!(declared, layers, "lib.rs's modules and LAYERS differ");
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let order = layers();
    assert!(order.len() > 10, "lib.rs lists its modules: {order:?}");
    let rank: HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, m)| (m.as_str(), i))
        .collect();
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut upward = Vec::new();
    for f in &all {
        let from = module_of(f);
        if from == "lib" {
            continue;
        }
        let Some(&own) = rank.get(from.as_str()) else {
            panic!("{} is not declared in lib.rs", f.display());
        };
        let text = std::fs::read_to_string(f).expect("readable source");
        for (n, line) in text.lines().enumerate() {
            for to in crate_refs(code(line)) {
                // Re-exports of other crates (`types`, `client`, ...) are
                // not layers of this one.
                let Some(&theirs) = rank.get(to.as_str()) else {
                    continue;
                };
                if theirs > own {
                    upward.push(format!(
                        "{}:{}: `{from}` uses `{to}`, a layer above it",
                        f.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that run upward:\n{}",
        upward.join("\n")
    );
}

#[test]
fn only_the_http_layer_knows_axum() {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut found = Vec::new();
    for f in &all {
        if module_of(f) == "http" {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("readable source");
        for (n, line) in text.lines().enumerate() {
            if code(line).contains("axum") {
                found.push(format!("{}:{}", f.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "axum outside http/:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checks_see_a_module_that_runs_upward() {
    // The test above must be able to fail: a line of the state that names
    // the HTTP layer is one it reports.
    assert_eq!(
        crate_refs(code("use crate::http::serve; // crate::x")),
        ["http"]
    );
    let order = layers();
    let pos = |m: &str| order.iter().position(|x| x == m).expect(m);
    assert!(pos("state") < pos("http"));
}
