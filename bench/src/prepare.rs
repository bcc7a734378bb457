//! Preparing each workload under each migration-point policy, once.
//!
//! Why it exists: T1 explains roam's overhead by comparing three prepared
//! builds of the same program — `loops` (the default), `functions` and
//! `manual` (Asyncify only, no inserted points) — so it needs all three on
//! disk, with their point counts and sizes.

use std::path::{Path, PathBuf};

use anyhow::Context;
use roam_prepare::{PointPolicy, PrepareOptions};

/// The policies T1 measures, with their CLI names.
pub const POLICIES: [(&str, PointPolicy); 4] = [
    ("loops", PointPolicy::Loops),
    ("functions", PointPolicy::Functions),
    ("manual", PointPolicy::Manual),
    ("outer", PointPolicy::Outer),
];

/// One prepared build.
#[derive(Debug, Clone)]
pub struct PreparedFile {
    /// Where it is.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its code section's size in bytes.
    pub code: u64,
    /// Migration points: loop headers, function entries, manual calls.
    pub points: (u32, u32, u32),
}

/// Prepare `input` with `policy` into `out_dir/<stem>.<policy>.wasm`,
/// reusing an existing output that is newer than the input.
pub fn prepare_to(
    input: &Path,
    out_dir: &Path,
    policy_name: &str,
    policy: PointPolicy,
) -> anyhow::Result<PreparedFile> {
    let stem = input.file_stem().unwrap_or_default().to_string_lossy();
    let path = out_dir.join(format!("{stem}.{policy_name}.wasm"));
    let bytes = if crate::paths::newer(&path, input) {
        std::fs::read(&path)?
    } else {
        let src =
            std::fs::read(input).with_context(|| format!("cannot read {}", input.display()))?;
        let opts = PrepareOptions {
            points: policy,
            ..Default::default()
        };
        let out = roam_prepare::prepare(&src, &opts)
            .with_context(|| format!("cannot prepare {} ({policy_name})", input.display()))?;
        std::fs::create_dir_all(out_dir)?;
        std::fs::write(&path, &out.bytes)?;
        out.bytes
    };
    let section = roam_prepare::read_section(&bytes)?
        .with_context(|| format!("{} has no roam section", path.display()))?;
    let s = section.stats;
    Ok(PreparedFile {
        bytes: bytes.len() as u64,
        code: code_bytes(&bytes).unwrap_or(0),
        points: (s.loop_points, s.function_points, s.manual_points),
        path,
    })
}

fn leb_u32(b: &[u8], i: &mut usize) -> Option<u64> {
    let (mut r, mut shift) = (0u64, 0);
    loop {
        let x = *b.get(*i)?;
        *i += 1;
        r |= u64::from(x & 0x7f) << shift;
        if x < 0x80 {
            return Some(r);
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
}

/// Size of the code section (id 10) of a module: the part of the size that
/// Asyncify and migration points change. Custom sections (clang leaves
/// DWARF in wasi-libc builds; `roam prepare` drops it) would otherwise
/// dominate the comparison. `None` if the bytes are not a module.
pub fn code_bytes(wasm: &[u8]) -> Option<u64> {
    if wasm.get(..4)? != b"\0asm" {
        return None;
    }
    let mut i = 8;
    while i < wasm.len() {
        let id = wasm[i];
        i += 1;
        let len = leb_u32(wasm, &mut i)?;
        if id == 10 {
            return Some(len);
        }
        i = i.checked_add(usize::try_from(len).ok()?)?;
    }
    Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_bytes_finds_the_code_section() {
        let m = wat::parse_str(LOOPY).unwrap();
        let n = code_bytes(&m).unwrap();
        assert!(n > 10 && n < m.len() as u64, "{n}");
        let empty = wat::parse_str("(module)").unwrap();
        assert_eq!(code_bytes(&empty), Some(0));
        assert_eq!(code_bytes(b"nope"), None);
        assert_eq!(
            code_bytes(&[0, b'a', b's', b'm', 1, 0, 0, 0, 10, 0xff]),
            None
        );
    }

    const LOOPY: &str = r#"(module
        (memory (export "memory") 1)
        (func $f (param i32) (result i32) (local.get 0))
        (func (export "_start") (local i32)
          (loop $l
            (local.set 0 (call $f (i32.add (local.get 0) (i32.const 1))))
            (br_if $l (i32.lt_u (local.get 0) (i32.const 10))))))"#;

    #[test]
    fn policies_differ_in_points_and_outputs_are_reused() {
        let d = tempfile::tempdir().unwrap();
        let input = d.path().join("loopy.wasm");
        std::fs::write(&input, wat::parse_str(LOOPY).unwrap()).unwrap();
        let out = d.path().join("out");
        let loops = prepare_to(&input, &out, "loops", PointPolicy::Loops).unwrap();
        let manual = prepare_to(&input, &out, "manual", PointPolicy::Manual).unwrap();
        assert!(loops.points.0 >= 1, "{:?}", loops.points);
        assert_eq!(manual.points, (0, 0, 0));
        assert!(loops.path.ends_with("loopy.loops.wasm"));
        let before = std::fs::metadata(&loops.path).unwrap().modified().unwrap();
        let again = prepare_to(&input, &out, "loops", PointPolicy::Loops).unwrap();
        assert_eq!(again.points, loops.points);
        assert_eq!(
            std::fs::metadata(&again.path).unwrap().modified().unwrap(),
            before
        );
    }

    #[test]
    fn an_invalid_module_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let input = d.path().join("bad.wasm");
        std::fs::write(&input, b"not wasm").unwrap();
        assert!(prepare_to(&input, d.path(), "loops", PointPolicy::Loops).is_err());
    }
}
