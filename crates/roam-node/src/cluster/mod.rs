//! The node in its cluster: the planner link (registration, heartbeats,
//! ownership transactions) and the fence that keeps a cut-off node from
//! running cells the planner may give away.
//!
//! The gateway link is part of the node's state (`state::services`)
//! rather than here, because every change of a cell's state must reach it
//! in order, and the state is where those changes happen.

pub(crate) mod fence;
pub(crate) mod planner;
