//! The roam node: a daemon that runs many cells and moves them between
//! machines while they run (C4), through the transfer pipeline (C5).
//!
//! Why a crate of its own: the node is where the runtime (one cell), the
//! wire protocol and the transfer pipeline meet tokio, HTTP and the
//! network; none of them needs to know about the others.
//!
//! ```text
//!   roam CLI ──HTTP/JSON──► control API (axum) ──► cells (one OS thread each)
//!                                 │
//!                                 └─► migration source ══TCP frames══► migration dest (other node)
//!
//!   both arrows: mutual TLS and a bearer token when configured (see docs/trust.md)
//!                                        encoder threads                  decoder → receiving instance
//! ```
//!
//! The control API is documented in `docs/node-api.md`, the migration
//! protocol and its modes in `docs/migration.md`.

#![deny(missing_docs)]

// The modules form layers, from the bottom up: size, ids, limits, cpu,
// config, error, log, cell, metrics, secure, state, cells, kept, cluster,
// migrate, http, node. Each uses only the layers below it
// (`tests/layers.rs` checks it).
mod cell;
mod cells;
mod cluster;
mod config;
pub mod cpu;
mod error;
mod grants;
mod http;
mod ids;
mod kept;
pub mod limits;
mod log;
mod metrics;
mod migrate;
mod node;
mod power;
mod secure;
pub mod size;
mod state;
pub use roam_api::{client, sysinfo, types};

pub use client::{Client, ClientAuth, ClientError};
pub use config::{NodeConfig, DEFAULT_PLANNER_TIMEOUT};
#[doc(hidden)]
pub use kept::fuzz_upload;
pub use limits::NodeLimits;
pub use node::Node;
pub use roam_auth;
pub use secure::ExposureError;
