//! `roam inspect`: a human-readable account of a snapshot.

use anyhow::Context;

use crate::args::InspectArgs;

pub fn main(a: InspectArgs) -> anyhow::Result<i32> {
    let snap = roam_snapshot::Snapshot::read_file(&a.snapshot)
        .with_context(|| format!("cannot load snapshot {}", a.snapshot.display()))?;
    println!("{}", snap.summary());
    Ok(0)
}
