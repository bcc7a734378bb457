//! The records the store keeps are the planner API's own types (they live
//! in `roam-api`, below both), so what the API shows is what is stored.

pub use roam_api::planner::{
    CellRecord, CellState, Kept, Maintenance, ModuleRecord, NodeRecord, NodeState, NodeStatus,
};
