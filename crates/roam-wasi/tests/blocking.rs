//! The blocking-call protocol: enter_blocking first, suspend (with no side
//! effect) when a checkpoint is requested or on-block is armed.

use roam_wasi::{add_to_linker, Interrupt, ProcExit, WasiConfig, WasiCtx, WasiView};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::{Caller, Engine, Instance, Linker, Module, Store};

const WAT: &str = r#"
(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "sleep") (param $ns i64) (param $in i32) (result i32)
    (i64.store (i32.const 0) (i64.const 7))
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (local.get $ns))
    (i64.store (i32.const 32) (i64.const 0))
    (i32.store16 (i32.const 40) (i32.const 0))
    (i32.store (i32.const 128) (i32.const 99))
    (call $poll (local.get $in) (i32.const 64) (i32.const 1) (i32.const 128)))
  (func (export "nevents") (result i32) (i32.load (i32.const 128)))
  (func (export "userdata") (result i64) (i64.load (i32.const 64)))
  (func (export "quit") (param i32) (call $exit (local.get 0))))
"#;

#[derive(Default)]
struct Counts {
    entered: u32,
    suspended: u32,
}

struct Host {
    ctx: WasiCtx,
    counts: Counts,
    /// Memory no longer trusted: `check_memory` refuses.
    untrusted: bool,
}

impl WasiView for Host {
    type Guard<'a> = &'a mut WasiCtx;
    fn wasi(&mut self) -> &mut WasiCtx {
        &mut self.ctx
    }
    fn check_memory(&self) -> wasmtime::Result<()> {
        if self.untrusted {
            wasmtime::bail!("memory not trusted");
        }
        Ok(())
    }
    fn enter_blocking(c: &mut Caller<'_, Self>) -> wasmtime::Result<()> {
        c.data_mut().counts.entered += 1;
        Ok(())
    }
    fn suspend(c: &mut Caller<'_, Self>) -> wasmtime::Result<()> {
        c.data_mut().counts.suspended += 1;
        Ok(())
    }
}

fn setup() -> (Store<Host>, Instance, Arc<Interrupt>) {
    let engine = Engine::default();
    let module = Module::new(&engine, WAT).unwrap();
    let mut linker = Linker::new(&engine);
    add_to_linker(&mut linker).unwrap();
    let intr = Interrupt::new();
    let ctx = WasiCtx::new(WasiConfig::default(), intr.clone()).unwrap();
    let mut store = Store::new(
        &engine,
        Host {
            ctx,
            counts: Counts::default(),
            untrusted: false,
        },
    );
    let inst = linker.instantiate(&mut store, &module).unwrap();
    (store, inst, intr)
}

fn sleep(store: &mut Store<Host>, inst: &Instance, ns: u64, input: i32) -> i32 {
    let f = inst
        .get_typed_func::<(i64, i32), i32>(&mut *store, "sleep")
        .unwrap();
    f.call(&mut *store, (ns as i64, input)).unwrap()
}

fn get<R: wasmtime::WasmResults>(store: &mut Store<Host>, inst: &Instance, name: &str) -> R {
    inst.get_typed_func::<(), R>(&mut *store, name)
        .unwrap()
        .call(&mut *store, ())
        .unwrap()
}

#[test]
fn sleep_completes_when_not_interrupted() {
    let (mut store, inst, _) = setup();
    let t = Instant::now();
    assert_eq!(sleep(&mut store, &inst, 120_000_000, 0), 0);
    assert!(t.elapsed() >= Duration::from_millis(120));
    assert_eq!(get::<i32>(&mut store, &inst, "nevents"), 1);
    assert_eq!(get::<i64>(&mut store, &inst, "userdata"), 7);
    assert_eq!(
        (store.data().counts.entered, store.data().counts.suspended),
        (1, 0)
    );
}

#[test]
fn request_mid_sleep_suspends_without_writing_events() {
    let (mut store, inst, intr) = setup();
    let i2 = intr.clone();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(80));
        i2.request();
    });
    let t = Instant::now();
    sleep(&mut store, &inst, 30_000_000_000, 0);
    assert!(t.elapsed() < Duration::from_secs(5));
    h.join().unwrap();
    assert_eq!(store.data().counts.suspended, 1);
    assert_eq!(
        get::<i32>(&mut store, &inst, "nevents"),
        99,
        "no event may be written"
    );
}

#[test]
fn on_block_suspends_only_calls_that_would_block() {
    let (mut store, inst, intr) = setup();
    intr.set_on_block(true);
    assert_eq!(sleep(&mut store, &inst, 0, 0), 0);
    assert_eq!(get::<i32>(&mut store, &inst, "nevents"), 1);
    assert_eq!(store.data().counts.suspended, 0);
    let t = Instant::now();
    sleep(&mut store, &inst, 10_000_000_000, 0);
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(store.data().counts.suspended, 1);
    assert_eq!(store.data().counts.entered, 2);
}

#[test]
fn bad_pointers_give_efault_and_exit_is_a_trap() {
    let (mut store, inst, _) = setup();
    assert_eq!(sleep(&mut store, &inst, 0, 65_530), 21);
    assert_eq!(sleep(&mut store, &inst, 0, -8), 21);
    let quit = inst.get_typed_func::<i32, ()>(&mut store, "quit").unwrap();
    let err = quit.call(&mut store, 3).unwrap_err();
    assert_eq!(err.downcast_ref::<ProcExit>(), Some(&ProcExit(3)));
}

#[test]
fn a_call_on_untrusted_memory_is_refused_before_it_does_anything() {
    let (mut store, inst, _intr) = setup();
    store.data_mut().untrusted = true;
    let f = inst
        .get_typed_func::<(i64, i32), i32>(&mut store, "sleep")
        .unwrap();
    let err = f.call(&mut store, (0, 0)).unwrap_err();
    assert!(format!("{err:?}").contains("memory not trusted"), "{err:?}");
    // No events written, nothing suspended.
    assert_eq!(store.data().counts.suspended, 0);
    assert_eq!(get::<i32>(&mut store, &inst, "nevents"), 99);
}
