//! Programs and helpers shared by the live-migration tests.

use std::sync::Arc;

use roam_snapshot::Snapshot;
use roam_wasi::{CapturedOutput, WasiConfig};

use crate::{Cell, CellOptions, LoadedModule, Outcome, Runtime, RuntimeConfig};

/// The end of a `_start` that prints the global `$sum` as 16 hex digits
/// and a newline (locals `$k` and `$n`, memory at 1024..1041 and 2048..2060,
/// import `$fd_write`). A macro so that `concat!` can build whole modules.
macro_rules! print_sum_wat {
    () => {
        r#"    (local.set $k (i32.const 0))
    (loop $hex
      (local.set $n
        (i32.wrap_i64
          (i64.and
            (i64.shr_u (global.get $sum)
              (i64.extend_i32_u (i32.sub (i32.const 60) (i32.mul (local.get $k) (i32.const 4)))))
            (i64.const 15))))
      (i32.store8 (i32.add (i32.const 1024) (local.get $k))
        (select (i32.add (local.get $n) (i32.const 48)) (i32.add (local.get $n) (i32.const 87))
          (i32.lt_u (local.get $n) (i32.const 10))))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br_if $hex (i32.lt_u (local.get $k) (i32.const 16))))
    (i32.store8 (i32.const 1040) (i32.const 10))
    (i32.store (i32.const 2048) (i32.const 1024))
    (i32.store (i32.const 2052) (i32.const 17))
    (drop (call $fd_write (i32.const 1) (i32.const 2048) (i32.const 1) (i32.const 2056))))
"#
    };
}
pub(crate) use print_sum_wat;

/// Fills 75 pages over 200 rounds, keeps a data-segment page untouched and
/// the top of memory zero, and prints a checksum of everything it wrote.
pub(crate) const COMPUTE_WAT: &str = concat!(
    r#"
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 7)
  (data (i32.const 450560) "roam initial data page")
  (global $sum (mut i64) (i64.const 0))
  (func $_start (export "_start")
    (local $r i32) (local $i i32) (local $x i64) (local $k i32) (local $n i32)
    (drop (memory.grow (i32.const 1)))
    (loop $rounds
      (local.set $i (i32.const 16384))
      (loop $fill
        (local.set $x
          (i64.add
            (i64.mul (i64.load (local.get $i)) (i64.const 6364136223846793005))
            (i64.extend_i32_u (i32.add (local.get $r) (local.get $i)))))
        (i64.store (local.get $i) (local.get $x))
        (global.set $sum
          (i64.xor (i64.rotl (global.get $sum) (i64.const 7)) (local.get $x)))
        (local.set $i (i32.add (local.get $i) (i32.const 8)))
        (br_if $fill (i32.lt_u (local.get $i) (i32.const 323584))))
      (local.set $r (i32.add (local.get $r) (i32.const 1)))
      (br_if $rounds (i32.lt_u (local.get $r) (i32.const 200))))
    ;; the data page still reads as written by the data segment
    (global.set $sum (i64.xor (global.get $sum) (i64.load (i32.const 450560))))
"#,
    print_sum_wat!(),
    ")\n"
);

/// Spins on a mailbox in page 1 and, for each new command, grows memory
/// and writes the listed pages, then acknowledges in page 2. Command -1
/// exits.
///
/// Mailbox (page 1): `+0` sequence, `+4` page count, `+8` wasm pages to
/// grow by, `+12..` page indices. Acknowledgement: the sequence, at 8192.
pub(crate) const MAILBOX_WAT: &str = r#"
(module
  (memory (export "memory") 16 256)
  (func $_start (export "_start")
    (local $last i32) (local $c i32) (local $j i32) (local $n i32)
    (loop $wait
      (local.set $c (i32.load (i32.const 4096)))
      (if (i32.ne (local.get $c) (local.get $last))
        (then
          (if (i32.eq (local.get $c) (i32.const -1)) (then (return)))
          (local.set $last (local.get $c))
          (if (i32.load (i32.const 4104))
            (then (drop (memory.grow (i32.load (i32.const 4104))))))
          (local.set $n (i32.load (i32.const 4100)))
          (local.set $j (i32.const 0))
          (block $done
            (loop $pages
              (br_if $done (i32.ge_u (local.get $j) (local.get $n)))
              (i32.store
                (i32.add
                  (i32.mul
                    (i32.load (i32.add (i32.const 4108) (i32.mul (local.get $j) (i32.const 4))))
                    (i32.const 4096))
                  (i32.const 100))
                (local.get $c))
              (local.set $j (i32.add (local.get $j) (i32.const 1)))
              (br $pages)))
          (i32.store (i32.const 8192) (local.get $c))))
      (br $wait)))
)
"#;

/// Whether userfaultfd works here; when it does not, prints why the test is
/// skipped, or fails it under CI.
pub(crate) fn userfaultfd_or_skip() -> bool {
    let ok = crate::userfaultfd_available();
    if !ok {
        roam_testkit::missing(
            &roam_testkit::USERFAULTFD,
            "the userfaultfd system call is refused here",
        );
    }
    ok
}

pub(crate) struct Env {
    pub rt: Runtime,
    _dir: tempfile::TempDir,
}

pub(crate) fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::new(RuntimeConfig {
        cache_dir: dir.path().to_path_buf(),
        ..RuntimeConfig::default()
    })
    .unwrap();
    Env { rt, _dir: dir }
}

/// `None` (and a printed reason) when no `wasm-opt` is installed; under CI
/// that fails the test instead.
pub(crate) fn load(rt: &Runtime, wat: &str) -> Option<Arc<LoadedModule>> {
    let wasm = wat::parse_str(wat).unwrap();
    match rt.load_bytes(&wasm) {
        Err(crate::LoadError::Prepare(roam_prepare::PrepareError::WasmOptMissing { path })) => {
            roam_testkit::missing(&roam_testkit::WASM_OPT, path.display());
            None
        }
        other => Some(other.unwrap()),
    }
}

pub(crate) fn start(
    rt: &Runtime,
    m: &Arc<LoadedModule>,
    opts: CellOptions,
) -> (Cell, CapturedOutput) {
    let mut cell = Cell::start(rt, m.clone(), WasiConfig::default(), opts).unwrap();
    let out = cell.capture_output();
    (cell, out)
}

/// Run to the end, refusing checkpoints-and-continue.
pub(crate) fn run(cell: &mut Cell) -> Outcome {
    cell.run(&mut |_, _| Err("unexpected continue".into()))
        .unwrap()
}

/// The output of an uninterrupted run.
pub(crate) fn reference(rt: &Runtime, m: &Arc<LoadedModule>) -> Vec<u8> {
    let (mut cell, out) = start(rt, m, CellOptions::default());
    assert!(matches!(run(&mut cell), Outcome::Exited(0)));
    let stdout = out.stdout();
    assert_eq!(stdout.len(), 17, "{}", String::from_utf8_lossy(&stdout));
    stdout
}

/// Stop with a full snapshot at migration point `n`.
pub(crate) fn stopped_at(
    rt: &Runtime,
    m: &Arc<LoadedModule>,
    n: u64,
) -> (Cell, Snapshot, CapturedOutput) {
    let opts = CellOptions {
        checkpoint_at_point: Some(n),
        ..CellOptions::default()
    };
    let (mut cell, out) = start(rt, m, opts);
    match run(&mut cell) {
        Outcome::Stopped(s, _) => (cell, *s, out),
        other => panic!("expected a stop, got {other:?}"),
    }
}

/// The host side of [`MAILBOX_WAT`]: writes commands into the running
/// program's memory and waits for the acknowledgement.
pub(crate) struct Mailbox {
    live: crate::LiveMemory,
    seq: u32,
}

impl Mailbox {
    pub(crate) fn new(live: crate::LiveMemory) -> Self {
        Mailbox { live, seq: 0 }
    }

    fn word(&self, addr: usize) -> &std::sync::atomic::AtomicU32 {
        assert!(addr + 4 <= self.live.len() && addr.is_multiple_of(4));
        // SAFETY: an aligned word inside the accessible part of a mapping
        // kept alive by `self.live`; the program accesses it with plain
        // loads and stores, which is what a mailbox between threads needs.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.live.map.base().add(addr).cast()) }
    }

    /// Have the program grow by `grow` wasm pages and write `pages`; wait
    /// until it has. Returns the command's sequence number.
    pub(crate) fn command(&mut self, pages: &[u32], grow: u32) -> u32 {
        use std::sync::atomic::Ordering::{Acquire, Release};
        self.seq += 1;
        self.word(4100).store(pages.len() as u32, Release);
        self.word(4104).store(grow, Release);
        for (j, p) in pages.iter().enumerate() {
            self.word(4108 + 4 * j).store(*p, Release);
        }
        self.word(4096).store(self.seq, Release);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while self.word(8192).load(Acquire) != self.seq {
            assert!(
                std::time::Instant::now() < deadline,
                "the program did not answer"
            );
            std::thread::yield_now();
        }
        self.seq
    }

    /// Have the program exit.
    pub(crate) fn exit(&mut self) {
        self.word(4096)
            .store(u32::MAX, std::sync::atomic::Ordering::Release);
    }
}
