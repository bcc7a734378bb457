//! Runs real WASI programs (C via wasi-libc, Rust via std) on wasmtime with
//! this crate's imports and compares their output to a reference.

use roam_testkit::{have, missing, CLANG_WASI, GCC, RUST_WASM32};
use roam_wasi::{add_to_linker, Interrupt, Preopen, ProcExit, WasiConfig, WasiCtx, WasiView};
use std::path::Path;
use std::process::Command;
use wasmtime::{Caller, Engine, Linker, Module, Store};

struct Host {
    ctx: WasiCtx,
}

impl WasiView for Host {
    type Guard<'a> = &'a mut WasiCtx;
    fn wasi(&mut self) -> &mut WasiCtx {
        &mut self.ctx
    }
    fn suspend(_caller: &mut Caller<'_, Self>) -> wasmtime::Result<()> {
        Err(wasmtime::Error::msg("suspend requested"))
    }
}

/// Run `wasm` with `dir` preopened as `/sb`; returns (exit code, stdout, stderr).
fn run(wasm: &Path, dir: &Path, args: &[&str]) -> (i32, String, String) {
    let engine = Engine::default();
    let module = Module::from_file(&engine, wasm).unwrap();
    let mut linker = Linker::new(&engine);
    add_to_linker(&mut linker).unwrap();
    let cfg = WasiConfig {
        args: args.iter().map(|s| s.to_string()).collect(),
        env: vec![("ROAM_GREETING".into(), "bonjour".into())],
        preopens: vec![Preopen {
            host: dir.to_path_buf(),
            guest: "/sb".into(),
        }],
        listeners: vec![],
    };
    let mut ctx = WasiCtx::new(cfg, Interrupt::new()).unwrap();
    let out = ctx.capture_output();
    let mut store = Store::new(&engine, Host { ctx });
    let inst = linker.instantiate(&mut store, &module).unwrap();
    let start = inst.get_typed_func::<(), ()>(&mut store, "_start").unwrap();
    let code = match start.call(&mut store, ()) {
        Ok(()) => 0,
        Err(e) => e
            .downcast_ref::<ProcExit>()
            .map(|p| p.0)
            .unwrap_or_else(|| panic!("trap: {e:?}")),
    };
    let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (code, s(out.stdout()), s(out.stderr()))
}

fn programs_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs")
}

const C_EXPECTED: &str = "\
argc=3 arg2=second
env=bonjour
clock mono_ok=1 realtime_after_2020=1
wrote=18
pread=5 'roam '
offset=18
tail=6 'world'
size_after_truncate=5
entries: b.txt c.txt sub z.txt
z.size=5 z.reg=1 sub.dir=1
z=hello
write_to_rdonly_fails=1
missing: ENOENT
rmdir nonempty: ENOTEMPTY
cleanup ok
done
";

#[test]
fn c_program_matches_reference_and_native_build() {
    if !have("clang-16") {
        missing(&CLANG_WASI, "clang-16 --version does not run");
        return;
    }
    let build = tempfile::tempdir().unwrap();
    let src = programs_dir().join("fsprobe.c");
    let wasm = build.path().join("fsprobe.wasm");
    let st = Command::new("clang-16")
        .args(["--target=wasm32-wasi", "-O2"])
        .arg(&src)
        .arg("-o")
        .arg(&wasm)
        .status()
        .unwrap();
    assert!(st.success(), "clang-16 failed to build {src:?}");
    let sb = tempfile::tempdir().unwrap();
    let (code, out, err) = run(&wasm, sb.path(), &["fsprobe", "/sb", "second"]);
    assert_eq!(out, C_EXPECTED);
    assert_eq!(err, "to stderr\n");
    assert_eq!(code, 0);
    assert_eq!(
        std::fs::read_dir(sb.path()).unwrap().count(),
        0,
        "program cleans up"
    );

    if !have("gcc") {
        missing(
            &GCC,
            "gcc --version does not run; the native comparison is skipped",
        );
        return;
    }
    let native = build.path().join("fsprobe-native");
    let st = Command::new("gcc")
        .arg("-O2")
        .arg(&src)
        .arg("-o")
        .arg(&native)
        .status()
        .unwrap();
    assert!(st.success());
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(&native)
        .arg(dir.path())
        .arg("second")
        .env("ROAM_GREETING", "bonjour")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(o.stdout).unwrap(),
        out,
        "wasm and native runs differ"
    );
}

#[test]
fn rust_std_program_runs() {
    let build = tempfile::tempdir().unwrap();
    let wasm = build.path().join("stdprobe.wasm");
    let st = Command::new("rustc")
        .args(["--target", "wasm32-wasip1", "-O", "--edition", "2021"])
        .arg(programs_dir().join("stdprobe.rs"))
        .arg("-o")
        .arg(&wasm)
        .status();
    if !st.is_ok_and(|s| s.success()) {
        missing(&RUST_WASM32, "rustc cannot build for wasm32-wasip1 here");
        return;
    }
    let sb = tempfile::tempdir().unwrap();
    let (code, out, _) = run(&wasm, sb.path(), &["stdprobe", "/sb"]);
    let expected = "\
args=2
env=bonjour
realtime_after_2020=true
seek_read=\"line2\\n\"
tree=[\"deep\", \"log\", \"three\"]
three.len=2 is_file=true
missing=NotFound
removed=true
elapsed_ok=true
";
    assert_eq!(out, expected);
    assert_eq!(code, 0);
}

const LINK_EXPECTED: &str = "\
open_trunc=ok
size_after_open_trunc=0
a.txt=1 '!'
rdwr_trunc=ok size=0
rdonly_trunc=ok size=0
link=ok
nlink a=2 b=2
same_inode=1
a.txt=5 'FRESH'
link_onto_existing=EEXIST
link_missing=ENOENT
link_dir=EPERM
link_into_missing_dir=ENOENT
link_into_subdir=ok
nlink a=3
link_symlink=ok
s2_is_symlink=1
linkat_follow=ok
f_is_reg=1 nlink a=4
f=5 'FRESH'
after_unlink nlink b=3
b.txt=5 'FRESH'
cleanup ok
";

/// `tool` is installed; if not, skip on a developer's machine and fail
/// under CI, naming the tool.
fn require(tool: &str) -> bool {
    if have(tool) {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{tool} is required under CI but is not installed"
    );
    println!("skipping: {tool} is not installed");
    false
}

/// Hard links and `O_TRUNC` on existing files, against the reference and a
/// native build of the same program.
#[test]
fn links_and_truncation_match_reference_and_native_build() {
    if !require("clang-16") {
        return;
    }
    let build = tempfile::tempdir().unwrap();
    let src = programs_dir().join("linkprobe.c");
    let wasm = build.path().join("linkprobe.wasm");
    let st = Command::new("clang-16")
        .args(["--target=wasm32-wasi", "-O2"])
        .arg(&src)
        .arg("-o")
        .arg(&wasm)
        .status()
        .unwrap();
    assert!(st.success(), "clang-16 failed to build {src:?}");
    let sb = tempfile::tempdir().unwrap();
    let (code, out, _) = run(&wasm, sb.path(), &["linkprobe", "/sb"]);
    assert_eq!(out, LINK_EXPECTED);
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_dir(sb.path()).unwrap().count(), 0);

    if !require("gcc") {
        return;
    }
    let native = build.path().join("linkprobe-native");
    let st = Command::new("gcc")
        .arg("-O2")
        .arg(&src)
        .arg("-o")
        .arg(&native)
        .status()
        .unwrap();
    assert!(st.success());
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(&native).arg(dir.path()).output().unwrap();
    assert_eq!(
        String::from_utf8(o.stdout).unwrap(),
        out,
        "wasm and native runs differ"
    );
}
