//! The `roam` custom section: proof that a module was prepared, and how.
//!
//! The runtime refuses unprepared modules and the snapshot records which
//! prepared module it belongs to, so the stamp must be cheap to find and
//! stable across releases. Encoding (version 1), inside a custom section
//! named `roam` appended after all other sections:
//!
//! ```text
//! u32 little-endian   section version (currently 1)
//! postcard            SectionBodyV1 { source_hash, points, options, stats,
//!                                     wasm_opt_version, mutable_globals, tables }
//! ```
//!
//! The fixed-width version prefix lets any future reader reject a version it
//! does not understand before attempting to decode the body.

use serde::{Deserialize, Serialize};
use wasmparser::{BinaryReaderError, Parser, Payload};

use crate::{PointPolicy, SECTION_NAME, SECTION_VERSION};

/// How many migration points `prepare` inserted or found (counted before
/// `wasm-opt`, which may inline or drop some).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PointStats {
    /// Points inserted at loop headers.
    pub loop_points: u32,
    /// Points inserted at function entries.
    pub function_points: u32,
    /// The program's own calls to `roam.migration_point`.
    pub manual_points: u32,
    /// Functions that contain at least one point (inserted or manual).
    pub functions: u32,
}

/// Contents of the `roam` custom section of a prepared module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoamSection {
    /// Encoding version ([`SECTION_VERSION`] when written by this build).
    pub version: u32,
    /// BLAKE3 hash of the input module.
    pub source_hash: [u8; 32],
    /// Migration-point policy used.
    pub points: PointPolicy,
    /// Canonical text of the options (see `PrepareOptions::canonical`).
    pub options: String,
    /// Migration-point counts.
    pub stats: PointStats,
    /// `wasm-opt --version` output of the Binaryen that ran Asyncify.
    pub wasm_opt_version: String,
    /// Input indices of the mutable globals exported as `roam.global.<i>`.
    pub mutable_globals: Vec<u32>,
    /// Number of tables exported as `roam.table.<i>`.
    pub tables: u32,
}

impl RoamSection {
    /// How the module captures its stack, from the canonical options.
    pub fn capture(&self) -> crate::Capture {
        let named = self
            .options
            .split(';')
            .find_map(|kv| kv.strip_prefix("capture="));
        match named.map(str::parse) {
            Some(Ok(c)) => c,
            _ => crate::Capture::Asyncify,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct SectionBodyV1 {
    source_hash: [u8; 32],
    points: PointPolicy,
    options: String,
    stats: PointStats,
    wasm_opt_version: String,
    mutable_globals: Vec<u32>,
    tables: u32,
}

/// Why the `roam` section could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SectionError {
    /// The module itself could not be parsed.
    #[error("cannot parse the module while looking for the `roam` section: {0}; check that it is a complete .wasm binary")]
    Malformed(#[source] BinaryReaderError),
    /// Shorter than the version header.
    #[error("the `roam` section is truncated; prepare the original module again")]
    Truncated,
    /// A version this build does not understand.
    #[error("`roam` section version {found} is not supported (this build reads version {SECTION_VERSION}); prepare the original module with this roam")]
    UnsupportedVersion {
        /// The version found.
        found: u32,
    },
    /// The body does not decode.
    #[error("the `roam` section is corrupt: {0}; prepare the original module again")]
    Corrupt(#[source] postcard::Error),
    /// More than one `roam` section.
    #[error("the module has more than one `roam` section; prepare the original module again")]
    Duplicate,
}

/// Read the `roam` section of `module`: `Ok(None)` if it has none.
pub fn read_section(module: &[u8]) -> Result<Option<RoamSection>, SectionError> {
    let mut found = None;
    for payload in Parser::new(0).parse_all(module) {
        if let Payload::CustomSection(custom) = payload.map_err(SectionError::Malformed)? {
            if custom.name() == SECTION_NAME {
                if found.is_some() {
                    return Err(SectionError::Duplicate);
                }
                found = Some(decode(custom.data())?);
            }
        }
    }
    Ok(found)
}

fn decode(data: &[u8]) -> Result<RoamSection, SectionError> {
    let (head, body) = data.split_at_checked(4).ok_or(SectionError::Truncated)?;
    let version = u32::from_le_bytes(head.try_into().expect("split at 4"));
    if version != SECTION_VERSION {
        return Err(SectionError::UnsupportedVersion { found: version });
    }
    let b: SectionBodyV1 = postcard::from_bytes(body).map_err(SectionError::Corrupt)?;
    Ok(RoamSection {
        version,
        source_hash: b.source_hash,
        points: b.points,
        options: b.options,
        stats: b.stats,
        wasm_opt_version: b.wasm_opt_version,
        mutable_globals: b.mutable_globals,
        tables: b.tables,
    })
}

/// Payload bytes of `section` (always written as [`SECTION_VERSION`]).
pub(crate) fn encode(section: &RoamSection) -> Vec<u8> {
    let body = SectionBodyV1 {
        source_hash: section.source_hash,
        points: section.points,
        options: section.options.clone(),
        stats: section.stats,
        wasm_opt_version: section.wasm_opt_version.clone(),
        mutable_globals: section.mutable_globals.clone(),
        tables: section.tables,
    };
    let mut out = SECTION_VERSION.to_le_bytes().to_vec();
    out.extend(postcard::to_stdvec(&body).expect("serialising to a Vec cannot fail"));
    out
}

/// Append `section` as a custom section at the end of `module`.
pub(crate) fn append_section(module: &mut Vec<u8>, section: &RoamSection) {
    append_custom(module, SECTION_NAME, &encode(section));
}

fn append_custom(module: &mut Vec<u8>, name: &str, payload: &[u8]) {
    let mut content = Vec::with_capacity(payload.len() + name.len() + 5);
    leb128_u32(&mut content, name.len() as u32);
    content.extend_from_slice(name.as_bytes());
    content.extend_from_slice(payload);
    module.push(0); // custom section id
    leb128_u32(module, content.len() as u32);
    module.extend(content);
}

fn leb128_u32(out: &mut Vec<u8>, mut value: u32) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RoamSection {
        RoamSection {
            version: SECTION_VERSION,
            source_hash: *blake3::hash(b"input").as_bytes(),
            points: PointPolicy::Functions,
            options: "points=functions;opt=O2;names=keep".into(),
            stats: PointStats {
                loop_points: 3,
                function_points: 2,
                manual_points: 1,
                functions: 4,
            },
            wasm_opt_version: "wasm-opt version 108".into(),
            mutable_globals: vec![0, 5],
            tables: 1,
        }
    }

    fn module() -> Vec<u8> {
        wat::parse_str("(module (memory 1))").unwrap()
    }

    #[test]
    fn round_trips_and_keeps_module_valid() {
        let mut wasm = module();
        assert_eq!(read_section(&wasm).unwrap(), None);
        append_section(&mut wasm, &sample());
        wasmparser::Validator::new().validate_all(&wasm).unwrap();
        assert_eq!(read_section(&wasm).unwrap(), Some(sample()));
    }

    #[test]
    fn leb128_matches_reference_encoding() {
        let mut out = Vec::new();
        leb128_u32(&mut out, 624_485);
        assert_eq!(out, [0xe5, 0x8e, 0x26]);
        // A long name forces a multi-byte section size.
        let mut wasm = module();
        append_custom(&mut wasm, "x", &[7u8; 300]);
        let custom = Parser::new(0)
            .parse_all(&wasm)
            .find_map(|p| match p.unwrap() {
                Payload::CustomSection(c) => Some(c.data().to_vec()),
                _ => None,
            })
            .unwrap();
        assert_eq!(custom, vec![7u8; 300]);
    }

    #[test]
    fn rejects_future_version_truncation_corruption_and_duplicates() {
        let mut wasm = module();
        append_custom(&mut wasm, SECTION_NAME, &2u32.to_le_bytes());
        assert!(matches!(
            read_section(&wasm),
            Err(SectionError::UnsupportedVersion { found: 2 })
        ));

        let mut wasm = module();
        append_custom(&mut wasm, SECTION_NAME, &[1, 0]);
        assert!(matches!(read_section(&wasm), Err(SectionError::Truncated)));

        let mut wasm = module();
        let mut payload = encode(&sample());
        payload.truncate(20);
        append_custom(&mut wasm, SECTION_NAME, &payload);
        assert!(matches!(read_section(&wasm), Err(SectionError::Corrupt(_))));

        let mut wasm = module();
        append_section(&mut wasm, &sample());
        append_section(&mut wasm, &sample());
        assert!(matches!(read_section(&wasm), Err(SectionError::Duplicate)));

        assert!(matches!(
            read_section(b"\0asm\x01"),
            Err(SectionError::Malformed(_))
        ));
    }
}
