//! Memory limits: a program that grows past its limit sees the growth fail
//! (as `malloc` returning NULL) and goes on; a snapshot over the limit is
//! refused before anything is allocated.

use super::common::*;
use crate::{Cell, CellOptions, Outcome, RestoreError};

/// Grows memory one wasm page at a time until `memory.grow` returns -1 (or
/// 4096 pages are reached), then prints `grow refused at NNNN pages\n` (the
/// page count in four decimal digits) and exits normally.
const GREEDY_WAT: &str = r#"
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 1024) "grow refused at 0000 pages\n")
  (func $_start (export "_start")
    (local $n i32) (local $k i32)
    (block $full
      (loop $more
        (br_if $full (i32.eq (memory.grow (i32.const 1)) (i32.const -1)))
        (br_if $more (i32.lt_u (memory.size) (i32.const 4096)))))
    (local.set $n (memory.size))
    (local.set $k (i32.const 3))
    (loop $digits
      (i32.store8 (i32.add (i32.const 1040) (local.get $k))
        (i32.add (i32.const 48) (i32.rem_u (local.get $n) (i32.const 10))))
      (local.set $n (i32.div_u (local.get $n) (i32.const 10)))
      (local.set $k (i32.sub (local.get $k) (i32.const 1)))
      (br_if $digits (i32.ge_s (local.get $k) (i32.const 0))))
    (i32.store (i32.const 2048) (i32.const 1024))
    (i32.store (i32.const 2052) (i32.const 27))
    (drop (call $fd_write (i32.const 1) (i32.const 2048) (i32.const 1) (i32.const 2056))))
)
"#;

fn limited(max_memory: u64) -> CellOptions {
    CellOptions {
        max_memory,
        ..CellOptions::default()
    }
}

#[test]
fn growth_past_the_limit_fails_cleanly_and_the_program_decides() {
    let env = env();
    let Some(m) = load(&env.rt, GREEDY_WAT) else {
        return;
    };
    // 1 MiB = 16 wasm pages.
    let (mut cell, out) = start(&env.rt, &m, limited(1 << 20));
    assert!(matches!(run(&mut cell), Outcome::Exited(0)));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout()),
        "grow refused at 0016 pages\n"
    );
    assert_eq!(cell.memory().len(), 1 << 20);

    // The default limit lets it grow to 4096 pages (256 MiB) here.
    let (mut cell, out) = start(&env.rt, &m, CellOptions::default());
    assert!(matches!(run(&mut cell), Outcome::Exited(0)));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout()),
        "grow refused at 4096 pages\n"
    );
}

#[test]
fn a_snapshot_over_the_limit_is_refused_before_allocating() {
    let env = env();
    let Some(m) = load(&env.rt, COMPUTE_WAT) else {
        return;
    };
    let (_cell, snap, _out) = stopped_at(&env.rt, &m, 20_000);
    let bytes = snap.memory.byte_len();
    assert!(bytes > 64 * 1024);
    let err = Cell::restore(&env.rt, m.clone(), &snap, Vec::new(), limited(64 * 1024))
        .err()
        .expect("a snapshot over the limit must be refused");
    assert!(
        matches!(err, RestoreError::OverLimit { bytes: b, limit } if b == bytes && limit == 64 * 1024),
        "{err}"
    );
    assert!(err.to_string().contains("--max-memory"), "{err}");

    // An incoming migration: the size is checked before growing.
    let mut inc = Cell::incoming(&env.rt, m.clone(), limited(bytes)).unwrap();
    let e = inc.grow_to(bytes + 65536).unwrap_err();
    assert!(matches!(e, RestoreError::OverLimit { .. }), "{e}");
    inc.grow_to(bytes).unwrap();
}

#[test]
fn the_limit_holds_after_a_restore() {
    let env = env();
    let Some(m) = load(&env.rt, GREEDY_WAT) else {
        return;
    };
    let opts = CellOptions {
        checkpoint_at_point: Some(5),
        ..limited(1 << 20)
    };
    let (mut cell, _out) = start(&env.rt, &m, opts);
    let snap = match run(&mut cell) {
        Outcome::Stopped(s, _) => *s,
        other => panic!("expected a stop, got {other:?}"),
    };
    let mut cell = Cell::restore(&env.rt, m.clone(), &snap, Vec::new(), limited(1 << 20)).unwrap();
    let out = cell.capture_output();
    assert!(matches!(run(&mut cell), Outcome::Exited(0)));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout()),
        "grow refused at 0016 pages\n"
    );
}
