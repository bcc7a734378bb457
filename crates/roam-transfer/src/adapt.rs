//! Choosing the operating mode while the transfer runs.
//!
//! Because the pipeline overlaps processing and sending, its input rate is
//! the smaller of what the workers can process and what the network can carry
//! once compressed. Each window the adapter measures the current mode's
//! per-page cost P and output/input ratio R, scales every mode's reference
//! (P, R) by how the current mode does now against its own reference, and
//! predicts each mode's input rate. It switches only when another mode is
//! predicted to be clearly better for several windows in a row, so one noisy
//! window cannot make it oscillate.

use crate::mode::{Mode, ModeTable};
use crate::PAGE_SIZE;
use std::time::Duration;

/// How the encoder picks its mode.
#[derive(Debug, Clone)]
pub enum ModeSelect {
    /// Always this mode.
    Static(Mode),
    /// Adapt to measured processing cost, ratio and bandwidth.
    Adaptive(AdaptConfig),
}

/// Parameters of adaptation.
#[derive(Debug, Clone)]
pub struct AdaptConfig {
    /// Reference costs of the candidate modes.
    pub table: ModeTable,
    /// Mode to start in (should be in the table).
    pub initial: Mode,
    /// Measurement window.
    pub window: Duration,
    /// Minimum predicted relative gain to consider switching (0.10 = 10 %).
    pub min_gain: f64,
    /// Consecutive windows that must agree before switching.
    pub confirm_windows: u32,
}

impl Default for AdaptConfig {
    fn default() -> Self {
        AdaptConfig {
            table: ModeTable::builtin(),
            initial: Mode::new(true, crate::Codec::Lz4),
            window: Duration::from_millis(100),
            min_gain: 0.10,
            confirm_windows: 2,
        }
    }
}

/// Measurements of one window, for pages compressed in the current mode.
#[derive(Debug, Clone, Copy, Default)]
pub struct Window {
    /// Window length in seconds.
    pub seconds: f64,
    /// Pages compressed in the current mode.
    pub pages: u64,
    /// Of those, pages that had a previous version (delta-eligible).
    pub with_base: u64,
    /// Mean XOR + compression time per page, nanoseconds.
    pub p_nanos: f64,
    /// Mean hashing time per submitted page, nanoseconds.
    pub hash_nanos: f64,
    /// Output/input ratio of those pages.
    pub ratio: f64,
    /// Bytes the consumer reported written to the wire during the window.
    pub wire_bytes: u64,
    /// Whether the consumer was the bottleneck (the pipeline waited on it or
    /// its queue was full).
    pub network_bound: bool,
    /// Worker threads.
    pub workers: usize,
}

/// The adaptation state machine (pure: no clocks, no threads).
#[derive(Debug, Clone)]
pub struct Adapter {
    cfg: AdaptConfig,
    current: Mode,
    bandwidth: f64,
    streak: u32,
}

/// Predicted input throughput of a mode, pages per second.
#[derive(Debug, Clone, Copy)]
pub struct Prediction {
    /// The mode.
    pub mode: Mode,
    /// Pages/s the workers could process.
    pub processing: f64,
    /// Pages/s the network could carry.
    pub network: f64,
}

impl Prediction {
    /// The pipeline's rate: the smaller of the two.
    pub fn system(&self) -> f64 {
        self.processing.min(self.network)
    }
}

impl Adapter {
    /// Start in `cfg.initial`.
    pub fn new(cfg: AdaptConfig) -> Self {
        Adapter {
            current: cfg.initial,
            cfg,
            bandwidth: 0.0,
            streak: 0,
        }
    }

    /// The mode in use.
    pub fn current(&self) -> Mode {
        self.current
    }

    /// The current bandwidth estimate in bytes/s (0 = unknown).
    pub fn bandwidth(&self) -> f64 {
        self.bandwidth
    }

    /// Expected (P, R) of `mode` on the reference workload when a fraction
    /// `f` of pages is delta-eligible.
    fn reference(&self, mode: Mode, f: f64) -> Option<(f64, f64)> {
        let e = self.cfg.table.get(mode)?;
        if !mode.delta {
            return Some((e.p_nanos, e.ratio));
        }
        let plain = self
            .cfg
            .table
            .get(Mode::new(false, mode.codec))
            .unwrap_or(e);
        Some((
            f * e.p_nanos + (1.0 - f) * plain.p_nanos,
            f * e.ratio + (1.0 - f) * plain.ratio,
        ))
    }

    /// Predict every table mode's throughput from window `w`.
    pub fn predict(&self, w: &Window) -> Vec<Prediction> {
        let f = if w.pages == 0 {
            0.0
        } else {
            w.with_base as f64 / w.pages as f64
        };
        let (sp, sr) = match self.reference(self.current, f) {
            // Clamped: a mode whose reference cost is tiny (no compression)
            // would otherwise turn timer noise into huge scale factors.
            Some((p, r)) if p > 0.0 && r > 0.0 => (
                (w.p_nanos / p).clamp(1.0 / 8.0, 8.0),
                (w.ratio / r).clamp(1.0 / 8.0, 8.0),
            ),
            _ => (1.0, 1.0),
        };
        let workers = w.workers.max(1) as f64;
        self.cfg
            .table
            .entries
            .iter()
            .filter_map(|e| {
                let (p, r) = self.reference(e.mode, f)?;
                let per_page = (p * sp + w.hash_nanos).max(1.0);
                let out = (r * sr).clamp(0.0, 1.0) * PAGE_SIZE as f64 + 8.0;
                Some(Prediction {
                    mode: e.mode,
                    processing: workers * 1e9 / per_page,
                    network: if self.bandwidth > 0.0 {
                        self.bandwidth / out
                    } else {
                        f64::INFINITY
                    },
                })
            })
            .collect()
    }

    /// Feed one window; returns the new mode and why, if it switches.
    pub fn on_window(&mut self, w: &Window) -> Option<(Mode, String)> {
        if w.seconds <= 0.0 {
            return None;
        }
        let measured = w.wire_bytes as f64 / w.seconds;
        if w.network_bound {
            self.bandwidth = measured;
        } else if measured > 0.0 {
            // The consumer kept up, so the network can carry at least this
            // much and probably more: probe upwards.
            self.bandwidth = self.bandwidth.max(2.0 * measured);
        }
        if w.pages < 4 || self.bandwidth <= 0.0 {
            // Too little to judge: neither confirms nor breaks a streak.
            return None;
        }
        let preds = self.predict(w);
        let cur = preds.iter().find(|p| p.mode == self.current)?.system();
        // On ties keep the earlier table entry (cheaper, or without delta).
        let best = preds
            .iter()
            .reduce(|a, b| if b.system() > a.system() { b } else { a })?;
        if best.mode == self.current || best.system() <= cur * (1.0 + self.cfg.min_gain) {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        if self.streak < self.cfg.confirm_windows {
            return None;
        }
        self.streak = 0;
        let why = format!(
            "predicted {:.1} MB/s input vs {:.1} MB/s now ({}: P {:.0} ns/page, R {:.3}; \
             bandwidth {:.2} MB/s{}; processing {:.1} MB/s, network {:.1} MB/s)",
            best.system() * PAGE_SIZE as f64 / 1e6,
            cur * PAGE_SIZE as f64 / 1e6,
            self.current,
            w.p_nanos,
            w.ratio,
            self.bandwidth / 1e6,
            if w.network_bound {
                ", network-bound"
            } else {
                ", probed"
            },
            best.processing * PAGE_SIZE as f64 / 1e6,
            best.network.min(1e12) * PAGE_SIZE as f64 / 1e6,
        );
        self.current = best.mode;
        Some((best.mode, why))
    }
}
