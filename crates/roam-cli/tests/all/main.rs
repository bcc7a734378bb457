//! roam's integration tests: one binary, driving the real `roam` executables
//! (the host build, and the aarch64 and riscv64 builds under qemu-user) on
//! the workload suite.
//!
//! Prerequisites, all made by `scripts/test.sh`: the cross builds of roam
//! (`scripts/build-all.sh`) and the workloads (`workloads/build.sh`). A
//! missing prerequisite fails the test with the command that makes it.

mod auth;
mod bigstate;
mod cli;
mod cluster;
mod common;
mod cpu;
mod cross_isa;
mod dashboard;
mod energy;
mod far;
mod hostile;
mod kvserver;
mod limits;
mod maintenance;
mod nodes;
mod offload;
mod real;
mod snapshot_errors;
mod sockets;
mod stop;
mod threads;
