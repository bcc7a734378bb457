//! The initial linear-memory image of a module.
//!
//! A snapshot need not carry pages that still hold exactly what
//! instantiation put there; the runtime compares live pages against this
//! image and elides equal ones. Segments whose offset is not a plain
//! `i32.const` are left out: the runtime then treats those bytes as
//! initially zero and stores any page that differs, which is always safe.

use wasmparser::{DataKind, Operator, Parser, Payload};

use crate::ValidateError;

/// Bytes per WebAssembly page.
const PAGE: u64 = 65_536;

/// `(offset, bytes)` of one active data segment.
pub type DataSegment = (u64, Vec<u8>);
/// `(initial memory size in bytes, segments)`; see [`initial_memory`].
pub type MemoryImage = (u64, Vec<DataSegment>);

/// `(initial memory size in bytes, [(offset, bytes)])` of the active data
/// segments of memory 0 with constant `i32` offsets, in module order (later
/// segments overwrite earlier ones where they overlap).
pub fn initial_memory(module: &[u8]) -> Result<MemoryImage, ValidateError> {
    let mut size = 0;
    let mut segments = Vec::new();
    for payload in Parser::new(0).parse_all(module) {
        match payload.map_err(ValidateError::Invalid)? {
            Payload::MemorySection(reader) => {
                if let Some(first) = reader.into_iter().next() {
                    size = first.map_err(ValidateError::Invalid)?.initial * PAGE;
                }
            }
            Payload::DataSection(reader) => {
                for data in reader {
                    let data = data.map_err(ValidateError::Invalid)?;
                    let DataKind::Active {
                        memory_index: 0,
                        offset_expr,
                    } = data.kind
                    else {
                        continue;
                    };
                    let mut ops = offset_expr.get_operators_reader();
                    let first = ops.read().map_err(ValidateError::Invalid)?;
                    let second = ops.read().map_err(ValidateError::Invalid)?;
                    if let (Operator::I32Const { value }, Operator::End) = (first, second) {
                        segments.push((u64::from(value as u32), data.data.to_vec()));
                    }
                }
            }
            _ => {}
        }
    }
    Ok((size, segments))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_size_and_constant_segments_in_order() {
        let wasm = wat::parse_str(
            r#"(module
                (import "env" "base" (global $base i32))
                (memory 3)
                (data (i32.const 16) "abc")
                (data "passive")
                (data (global.get $base) "skipped")
                (data (i32.const -1) "z")
                (data (i32.const 17) "XY"))"#,
        )
        .unwrap();
        let (size, segs) = initial_memory(&wasm).unwrap();
        assert_eq!(size, 3 * 65_536);
        assert_eq!(
            segs,
            vec![
                (16, b"abc".to_vec()),
                (0xffff_ffff, b"z".to_vec()),
                (17, b"XY".to_vec())
            ]
        );
    }

    #[test]
    fn module_without_memory_has_empty_image() {
        let wasm = wat::parse_str("(module)").unwrap();
        assert_eq!(initial_memory(&wasm).unwrap(), (0, vec![]));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(matches!(
            initial_memory(b"\0asm\x02"),
            Err(ValidateError::Invalid(_))
        ));
    }
}
