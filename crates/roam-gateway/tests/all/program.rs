//! A cell's program played in-process: an echo server over a real
//! `NetHub` (through `roam_wasi::net::program`), whose own state (the
//! connections it accepted, bytes read but not yet written back) moves
//! with it, as a wasm program's memory would. It answers every byte `b`
//! with `b + 1`, so an echo cannot pass for the original.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use roam_wasi::net::{program, ConnId, NetHub};
use roam_wasi::{Interrupt, OsState, WasiConfig, WasiCtx};

/// A cell: its WASI context (for snapshots) and its program's state.
pub struct Cell {
    pub ctx: WasiCtx,
    pub conns: Vec<ConnId>,
    pub pending: BTreeMap<ConnId, Vec<u8>>,
    /// Bytes echoed, over the cell's life (all its hosts).
    pub echoed: Arc<AtomicU64>,
    /// Errors the program saw (resets, bad fds).
    pub errors: Arc<AtomicU64>,
    /// Whether the program reads its input (backpressure tests stop it).
    pub reading: Arc<AtomicBool>,
}

impl Cell {
    pub fn new() -> Cell {
        let cfg = WasiConfig {
            args: vec!["echo".into()],
            listeners: vec!["kv".into()],
            ..WasiConfig::default()
        };
        Cell {
            ctx: WasiCtx::new(cfg, Interrupt::new()).expect("a context with one listener"),
            conns: Vec::new(),
            pending: BTreeMap::new(),
            echoed: Arc::default(),
            errors: Arc::default(),
            reading: Arc::new(AtomicBool::new(true)),
        }
    }

    pub fn hub(&self) -> Arc<NetHub> {
        self.ctx.net().expect("the cell has a listener")
    }

    /// The cell as a destination restores it: its OS state through the
    /// snapshot encoding, its program state as it was.
    pub fn migrate(self) -> Cell {
        let bytes = self.ctx.save().expect("saves").encode();
        let state = OsState::decode(&bytes).expect("decodes");
        Cell {
            ctx: WasiCtx::restore(state, vec![], Interrupt::new()).expect("restores"),
            ..self
        }
    }

    fn step(&mut self) -> bool {
        let mut progress = false;
        while let Ok(Some(c)) = program::accept(&mut self.ctx, 0) {
            self.conns.push(c);
            progress = true;
        }
        let mut done = Vec::new();
        let mut closed = Vec::new();
        for &c in &self.conns {
            let p = self.pending.entry(c).or_default();
            if !p.is_empty() {
                match program::send(&self.ctx, c, p) {
                    Ok(n) => {
                        p.drain(..n);
                        self.echoed.fetch_add(n as u64, Ordering::Relaxed);
                        progress |= n > 0;
                    }
                    Err(_) => {
                        self.errors.fetch_add(1, Ordering::Relaxed);
                        done.push(c);
                        continue;
                    }
                }
            }
            if !self.reading.load(Ordering::Relaxed) || p.len() >= 64 << 10 {
                continue;
            }
            match program::recv(&self.ctx, c, 16 << 10) {
                Ok(Some(d)) if d.is_empty() => {
                    if p.is_empty() {
                        let _ = program::shutdown_write(&self.ctx, c);
                        closed.push(c);
                        done.push(c);
                        progress = true;
                    }
                }
                Ok(Some(d)) => {
                    p.extend(d.iter().map(|b| b.wrapping_add(1)));
                    progress = true;
                }
                Ok(None) => {}
                Err(_) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    done.push(c);
                }
            }
        }
        for c in closed {
            program::close(&mut self.ctx, c);
            done.push(c);
        }
        self.conns.retain(|c| !done.contains(c));
        progress
    }

    /// Run the program until [`Running::pause`].
    pub fn start(self) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let mut cell = self;
            while !s.load(Ordering::SeqCst) {
                if !cell.step() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            cell
        });
        Running { stop, task }
    }
}

/// A running program.
pub struct Running {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Cell>,
}

impl Running {
    /// Pause the program (as the runtime does before a snapshot).
    pub async fn pause(self) -> Cell {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the program task")
    }
}
