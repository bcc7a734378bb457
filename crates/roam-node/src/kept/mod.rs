//! Kept checkpoints: a cell's owner checkpoints it without stopping it and
//! sends it to another node, the holder; if the owner dies, any node
//! restores the cell from it (`docs/control-plane.md`, "Kept checkpoints").
//!
//! [`store`] is the format, [`file`] reads and writes it a page at a time,
//! [`holder`] keeps the holder's files; [`ops`] the operations of the
//! owner, the holder and the restoring node.

pub(crate) mod file;
pub(crate) mod holder;
pub(crate) mod ops;
pub(crate) mod store;
