//! Tests of live migration support on small WAT programs: pause/resume,
//! incoming cells, dirty tracking and lazy memory, each compared with an
//! uninterrupted run.

mod common;
mod dirty;
mod far;
mod flag;
mod from_file;
mod kill;
mod lazy;
mod limits;
mod mapped;
mod pause;
