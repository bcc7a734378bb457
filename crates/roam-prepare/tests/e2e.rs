//! End to end: compile real C and Rust programs to WASI, prepare them, and
//! check that the output validates and carries what the runtime needs.
//! Each test is skipped (with a printed reason) when its compiler or
//! `wasm-opt` is not installed, and fails instead under CI (`roam-testkit`).

use std::path::Path;
use std::process::Command;

use roam_prepare::{
    prepare, read_section, Capture, PointPolicy, PrepareError, PrepareOptions, ASYNCIFY_EXPORTS,
    CAPTURE_END_EXPORT, CAPTURE_GLOBAL_EXPORT, FLAG_GLOBAL_EXPORT, MEMORY_EXPORT, REWIND_EXPORT,
    STATE_EXPORT,
};
use wasmparser::{ExternalKind, Parser, Payload};

const C_SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
static long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
int main(void) {
  long s = 0;
  for (int i = 0; i < 25; i++) s += fib(i % 20);
  char *p = malloc(100);
  snprintf(p, 100, "sum=%ld", s);
  puts(p);
  return 0;
}
"#;

const RUST_SOURCE: &str = r#"
use std::collections::BTreeMap;
fn main() {
    let mut m = BTreeMap::new();
    for i in 0..1000u64 { *m.entry(i % 17).or_insert(0u64) += i * i; }
    let s: u64 = m.values().sum();
    println!("sum={s} {:?}", std::env::args().collect::<Vec<_>>());
}
"#;

/// Run `cmd`; `None` with a printed reason if `tool` is not installed (a
/// failure under CI).
fn compile(mut cmd: Command, out: &Path, tool: &roam_testkit::Tool) -> Option<Vec<u8>> {
    match cmd.status() {
        Ok(status) => {
            assert!(status.success(), "compiler failed: {cmd:?}");
            Some(std::fs::read(out).unwrap())
        }
        Err(e) => {
            roam_testkit::missing(
                tool,
                format_args!("cannot run {:?}: {e}", cmd.get_program()),
            );
            None
        }
    }
}

fn exports(wasm: &[u8]) -> Vec<(String, ExternalKind)> {
    let mut out = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        if let Payload::ExportSection(r) = payload.unwrap() {
            for e in r {
                let e = e.unwrap();
                out.push((e.name.to_string(), e.kind));
            }
        }
    }
    out
}

fn check_prepared(input: &[u8], label: &str) {
    for (points, capture) in [
        (PointPolicy::Loops, Capture::Returns),
        (PointPolicy::Loops, Capture::Eh),
        (PointPolicy::Functions, Capture::Eh),
        (PointPolicy::Loops, Capture::Asyncify),
    ] {
        let opts = PrepareOptions {
            points,
            capture,
            ..PrepareOptions::default()
        };
        let start = std::time::Instant::now();
        let p = match prepare(input, &opts) {
            Err(PrepareError::WasmOptMissing { path }) => {
                roam_testkit::missing(&roam_testkit::WASM_OPT, path.display());
                return;
            }
            other => other.unwrap(),
        };
        eprintln!(
            "{label} {points}: {} -> {} bytes in {:?}, {:?}",
            input.len(),
            p.bytes.len(),
            start.elapsed(),
            p.stats
        );
        wasmparser::Validator::new().validate_all(&p.bytes).unwrap();
        let names = exports(&p.bytes);
        assert_eq!(p.section.capture(), capture, "{label}");
        let (funcs, globals): (&[&str], &[&str]) = match capture {
            Capture::Asyncify => (ASYNCIFY_EXPORTS, &[]),
            _ => (
                &[REWIND_EXPORT],
                &[STATE_EXPORT, CAPTURE_GLOBAL_EXPORT, CAPTURE_END_EXPORT],
            ),
        };
        for &name in funcs.iter().chain(&["_start"]) {
            assert!(
                names.contains(&(name.into(), ExternalKind::Func)),
                "{label}: {name}"
            );
        }
        for &name in globals {
            assert!(
                names.contains(&(name.into(), ExternalKind::Global)),
                "{label}: {name}"
            );
        }
        assert!(names.contains(&(FLAG_GLOBAL_EXPORT.into(), ExternalKind::Global)));
        assert!(names.contains(&(MEMORY_EXPORT.into(), ExternalKind::Memory)));
        // `__stack_pointer` is global 0 in both toolchains' output.
        assert!(
            names.contains(&("roam.global.0".into(), ExternalKind::Global)),
            "{label}"
        );
        assert!(p.stats.function_points > 0, "{label}: {:?}", p.stats);
        assert_eq!(read_section(&p.bytes).unwrap().unwrap(), p.section);
        assert!(prepare(&p.bytes, &opts).unwrap().already_prepared);
    }
}

#[test]
fn c_program_prepares() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("prog.c");
    let out = dir.path().join("prog.wasm");
    std::fs::write(&src, C_SOURCE).unwrap();
    let mut cmd = Command::new("clang-16");
    cmd.args(["--target=wasm32-wasi", "-O2"])
        .arg(&src)
        .arg("-o")
        .arg(&out);
    if let Some(wasm) = compile(cmd, &out, &roam_testkit::CLANG_WASI) {
        check_prepared(&wasm, "C");
    }
}

#[test]
fn rust_program_prepares() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("prog.rs");
    let out = dir.path().join("prog.wasm");
    std::fs::write(&src, RUST_SOURCE).unwrap();
    let mut cmd = Command::new("rustc");
    cmd.args(["--target", "wasm32-wasip1", "-O"])
        .arg(&src)
        .arg("-o")
        .arg(&out);
    if let Some(wasm) = compile(cmd, &out, &roam_testkit::RUST_WASM32) {
        check_prepared(&wasm, "Rust");
    }
}
