//! Identifiers that arrive from outside, checked before they are used.
//!
//! Why: a node turns some identifiers into host paths (a cell id names the
//! directory `state_dir/cells/{id}`), logs them, and echoes them in URLs. A
//! migration peer or an API client chooses them, so `../../x` or a NUL byte
//! must be refused at the boundary, before anything touches a path. Every
//! entry point (the migration port, the HTTP API, a node's own `--name`)
//! calls these checks; code behind them may rely on the result.
//!
//! The charset is deliberately small: `[A-Za-z0-9][A-Za-z0-9._-]*`, at most
//! [`MAX_IDENT_LEN`] bytes (node names: [`MAX_NODE_NAME_LEN`], enough for a
//! DNS name), and never `..`. Module hashes are exactly 64 lowercase hex
//! digits. Guest directory names never become host paths, but they must
//! still be absolute and free of `.`/`..` components so the guest's view is
//! unambiguous.

use std::fmt;

use crate::msg::{CellSpec, Offer};

/// Longest cell id, migration id or service name, in bytes.
pub const MAX_IDENT_LEN: usize = 64;
/// Longest node name, in bytes (a fully qualified DNS name).
pub const MAX_NODE_NAME_LEN: usize = 253;
/// Longest guest directory path, in bytes.
pub const MAX_GUEST_DIR_LEN: usize = 1024;
/// Most sandbox directories one cell may have.
pub const MAX_GUEST_DIRS: usize = 64;

/// What an identifier names; used in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentKind {
    /// A cell's cluster-wide id.
    CellId,
    /// A migration's id.
    MigrationId,
    /// A node's name.
    NodeName,
    /// A service's name.
    ServiceName,
    /// The BLAKE3 hash of a prepared module, in hex.
    ModuleHash,
    /// The guest path of a sandbox directory.
    GuestDir,
}

impl fmt::Display for IdentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdentKind::CellId => "cell id",
            IdentKind::MigrationId => "migration id",
            IdentKind::NodeName => "node name",
            IdentKind::ServiceName => "service name",
            IdentKind::ModuleHash => "module hash",
            IdentKind::GuestDir => "guest directory",
        })
    }
}

/// An identifier failed its check. The message quotes (a bounded prefix of)
/// the value, says what is wrong and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {value:?} is invalid: {why}; {rule}")]
pub struct InvalidIdent {
    /// What the value was meant to be.
    pub kind: IdentKind,
    /// The value, cut to 80 characters so hostile input cannot flood a log.
    pub value: String,
    /// What is wrong with it.
    pub why: &'static str,
    /// What is accepted instead.
    pub rule: &'static str,
}

const NAME_RULE: &str =
    "use 1 to 64 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit, without \"..\"";
const NODE_RULE: &str =
    "use 1 to 253 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit, without \"..\"";
const HASH_RULE: &str = "give the 64 lowercase hex digits that `POST /v1/modules` returned";
const DIR_RULE: &str =
    "give an absolute guest path such as /data, without empty, \".\" or \"..\" components";

fn invalid(kind: IdentKind, value: &str, why: &'static str, rule: &'static str) -> InvalidIdent {
    InvalidIdent {
        kind,
        value: value.chars().take(80).collect(),
        why,
        rule,
    }
}

fn name(kind: IdentKind, s: &str, max: usize, rule: &'static str) -> Result<(), InvalidIdent> {
    let bad = |why| Err(invalid(kind, s, why, rule));
    let Some(first) = s.bytes().next() else {
        return bad("it is empty");
    };
    if s.len() > max {
        return bad("it is too long");
    }
    if !first.is_ascii_alphanumeric() {
        return bad("it must start with a letter or digit");
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return bad("it contains a character outside A-Z a-z 0-9 . _ -");
    }
    if s.contains("..") {
        return bad("it contains \"..\"");
    }
    Ok(())
}

/// Check a cell id.
pub fn check_cell_id(s: &str) -> Result<(), InvalidIdent> {
    name(IdentKind::CellId, s, MAX_IDENT_LEN, NAME_RULE)
}

/// Check a migration id.
pub fn check_migration_id(s: &str) -> Result<(), InvalidIdent> {
    name(IdentKind::MigrationId, s, MAX_IDENT_LEN, NAME_RULE)
}

/// Check a service name.
pub fn check_service_name(s: &str) -> Result<(), InvalidIdent> {
    name(IdentKind::ServiceName, s, MAX_IDENT_LEN, NAME_RULE)
}

/// Check a node name (ours at startup, a peer's in its `Hello`).
pub fn check_node_name(s: &str) -> Result<(), InvalidIdent> {
    name(IdentKind::NodeName, s, MAX_NODE_NAME_LEN, NODE_RULE)
}

/// Parse a module hash: exactly 64 lowercase hex digits.
pub fn parse_module_hash(s: &str) -> Result<[u8; 32], InvalidIdent> {
    let bad = |why| Err(invalid(IdentKind::ModuleHash, s, why, HASH_RULE));
    if s.len() != 64 {
        return bad("it is not 64 characters long");
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(s.as_bytes().chunks_exact(2)) {
        let digit = |b: u8| match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            _ => None,
        };
        match (digit(pair[0]), digit(pair[1])) {
            (Some(h), Some(l)) => *o = h << 4 | l,
            _ => return bad("it contains a character other than 0-9 a-f"),
        }
    }
    Ok(out)
}

/// Check the guest path of a sandbox directory.
pub fn check_guest_dir(s: &str) -> Result<(), InvalidIdent> {
    let bad = |why| Err(invalid(IdentKind::GuestDir, s, why, DIR_RULE));
    if s.len() > MAX_GUEST_DIR_LEN {
        return bad("it is longer than 1024 bytes");
    }
    let Some(rest) = s.strip_prefix('/') else {
        return bad("it is not absolute");
    };
    if s.contains('\0') {
        return bad("it contains a NUL byte");
    }
    if rest.is_empty() {
        return Ok(()); // "/" itself
    }
    for c in rest.split('/') {
        match c {
            "" => return bad("it has an empty component"),
            "." | ".." => return bad("it has a \".\" or \"..\" component"),
            _ => {}
        }
    }
    Ok(())
}

/// Check a list of guest directories: each one, and how many there are.
pub fn check_guest_dirs(dirs: &[String]) -> Result<(), InvalidIdent> {
    if dirs.len() > MAX_GUEST_DIRS {
        return Err(invalid(
            IdentKind::GuestDir,
            &dirs[MAX_GUEST_DIRS],
            "the cell has more than 64 sandbox directories",
            "give at most 64",
        ));
    }
    dirs.iter().try_for_each(|d| check_guest_dir(d))
}

impl CellSpec {
    /// Check every identifier in the spec: the id, the guest directories
    /// and the service name (the module hash is typed, 32 bytes).
    pub fn check_idents(&self) -> Result<(), InvalidIdent> {
        check_cell_id(&self.id)?;
        check_guest_dirs(&self.dirs)?;
        self.service.as_deref().map_or(Ok(()), check_service_name)
    }
}

impl Offer {
    /// Check every identifier in an incoming offer; call it before the offer
    /// touches anything.
    pub fn check_idents(&self) -> Result<(), InvalidIdent> {
        check_migration_id(&self.migration_id)?;
        self.cell.check_idents()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_names_pass() {
        for s in [
            "c-0123456789ab",
            "m-x",
            "node1",
            "a.b_c-d",
            "A",
            "9",
            &"x".repeat(64),
        ] {
            check_cell_id(s).unwrap();
            check_migration_id(s).unwrap();
            check_service_name(s).unwrap();
            check_node_name(s).unwrap();
        }
        check_node_name(&"n".repeat(253)).unwrap();
    }

    #[test]
    fn bad_names_say_why() {
        let cases = [
            ("", "it is empty"),
            ("../../x", "it must start with a letter or digit"),
            ("a/../../x", "it contains a character outside"),
            ("a..b", "it contains \"..\""),
            ("a/b", "it contains a character outside"),
            (".hidden", "it must start with a letter or digit"),
            ("-rf", "it must start with a letter or digit"),
            ("a\0b", "it contains a character outside"),
            ("é", "it must start with a letter or digit"),
            ("a b", "it contains a character outside"),
        ];
        for (s, why) in cases {
            let e = check_cell_id(s).unwrap_err();
            assert!(e.why.starts_with(why), "{s:?}: {e}");
        }
        let e = check_cell_id(&"x".repeat(65)).unwrap_err();
        assert_eq!(e.why, "it is too long");
        assert_eq!(e.value.len(), 65);
        let e = check_cell_id("../../x").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cell id \"../../x\" is invalid: it must start"),
            "{e}"
        );
        let long = format!("{}/", "y".repeat(10_000));
        assert_eq!(check_node_name(&long).unwrap_err().value.len(), 80);
    }

    #[test]
    fn module_hashes() {
        let h = "00ff".repeat(16);
        let b = parse_module_hash(&h).unwrap();
        assert_eq!(b[0], 0x00);
        assert_eq!(b[1], 0xff);
        for bad in [
            "",
            "abc",
            &"00FF".repeat(16),
            &"g0".repeat(32),
            &"0".repeat(65),
        ] {
            let e = parse_module_hash(bad).unwrap_err();
            assert_eq!(e.kind, IdentKind::ModuleHash, "{bad}");
        }
    }

    #[test]
    fn guest_dirs() {
        for good in ["/", "/data", "/a/b.c/..d", "/x y"] {
            check_guest_dir(good).unwrap();
        }
        for bad in [
            "", "data", ".", "/a/../b", "/..", "/a//b", "/a/", "/./a", "/a\0",
        ] {
            assert!(check_guest_dir(bad).is_err(), "{bad:?}");
        }
        assert!(check_guest_dir(&format!("/{}", "a".repeat(1024))).is_err());
        let many: Vec<String> = (0..65).map(|i| format!("/d{i}")).collect();
        assert!(check_guest_dirs(&many).is_err());
        check_guest_dirs(&many[..64]).unwrap();
    }

    #[test]
    fn cpu_limits_out_of_range_are_refused() {
        use crate::CpuLimits;
        CpuLimits::default().check().unwrap();
        for (weight, max) in [(Some(1), Some(10)), (Some(10_000), Some(1_024_000))] {
            CpuLimits {
                weight,
                max_millicores: max,
            }
            .check()
            .unwrap();
        }
        for (weight, max) in [
            (Some(0), None),
            (Some(10_001), None),
            (Some(u32::MAX), None),
            (None, Some(0)),
            (None, Some(9)),
            (None, Some(1_024_001)),
        ] {
            let c = CpuLimits {
                weight,
                max_millicores: max,
            };
            let e = c.check().unwrap_err();
            assert!(e.contains("out of range"), "{c:?}: {e}");
        }
    }

    #[test]
    fn offer_checks_every_field() {
        let spec = CellSpec {
            id: "c-1".into(),
            module_hash: [0; 32],
            args: vec!["p".into()],
            env: vec![],
            dirs: vec!["/data".into()],
            launched_unix_ms: 0,
            hops: 0,
            max_memory: 64 << 20,
            service: Some("kv".into()),
            generation: None,
            cpu: crate::CpuLimits::default(),
            far: None,
        };
        let offer = Offer {
            migration_id: "m-1".into(),
            cell: spec,
            mode: crate::Mode::StopAndCopy,
            module_len: 0,
            memory_bytes: 0,
        };
        offer.check_idents().unwrap();
        let mut o = offer.clone();
        o.migration_id = "../m".into();
        assert_eq!(o.check_idents().unwrap_err().kind, IdentKind::MigrationId);
        let mut o = offer.clone();
        o.cell.id = "../../x".into();
        assert_eq!(o.check_idents().unwrap_err().kind, IdentKind::CellId);
        let mut o = offer.clone();
        o.cell.dirs.push("../etc".into());
        assert_eq!(o.check_idents().unwrap_err().kind, IdentKind::GuestDir);
        let mut o = offer;
        o.cell.service = Some("kv/../x".into());
        assert_eq!(o.check_idents().unwrap_err().kind, IdentKind::ServiceName);
    }
}
