//! `roam inspect`: a human-readable account of a snapshot.

use anyhow::Context;

use crate::args::InspectArgs;

pub fn main(a: InspectArgs) -> anyhow::Result<i32> {
    let (snap, header) = roam_snapshot::Snapshot::read_file_with_header(&a.snapshot)
        .with_context(|| format!("cannot load snapshot {}", a.snapshot.display()))?;
    println!("{}", snap.summary().with_header(&header));
    Ok(0)
}
