//! The HTTP/JSON APIs of roam's daemons: their request and answer types,
//! and the clients that speak them.
//!
//! Why a crate of its own: the node, the planner and the `roam` command all
//! speak to each other. The planner drives nodes, and nodes register with
//! the planner; if each API lived in its daemon's crate, the two daemons
//! would depend on each other. Here, below both, the types are shared and
//! neither daemon knows the other's internals.
//!
//! - [`types`], [`client`]: a node's control API (`docs/node-api.md`);
//! - [`planner`], [`planner_client`]: the planner's API and the cluster's records
//!   (`docs/control-plane.md`);
//! - [`sysinfo`]: what a node reports about its machine;
//! - [`serve`]: the TLS listener and token check both daemons serve with.

#![deny(missing_docs)]

pub mod client;
pub mod human;
pub mod planner;
pub mod planner_client;
pub mod power;
pub mod serve;
pub mod sysinfo;
pub mod types;

pub use client::{Client, ClientAuth, ClientError, Refusal};
pub use planner_client::{PlannerClient, PlannerError};
