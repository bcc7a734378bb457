//! The harness every test module shares, by concern: finding and running
//! the roam builds ([`roam`](mod@roam)), what a workload run must print
//! ([`check`]), bounded waits and processes ([`process`]), the control
//! APIs over plain HTTP ([`http`]), and the processes a test starts: nodes
//! ([`node`], [`test_node`]), planners ([`planner`]), gateways
//! ([`gateway`]), link proxies ([`link`]), the credentials and nodes of
//! the authentication tests ([`auth`](mod@auth)), and the headless
//! browser of the dashboard's tests ([`browser`]).
//!
//! Test modules `use super::common::*` and keep only what is particular to
//! them; anything two modules need lives here, once.

mod auth;
mod browser;
mod check;
mod gateway;
mod http;
mod link;
mod node;
mod planner;
mod process;
mod roam;
mod test_node;

pub use auth::*;
pub use browser::*;
pub use check::*;
pub use gateway::*;
pub use http::*;
pub use link::*;
pub use node::*;
pub use planner::*;
pub use process::*;
pub use roam::*;
pub use test_node::*;
