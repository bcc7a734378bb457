//! Serde helper that encodes `Vec<u8>` as one byte string.
//!
//! Serde's default treats `Vec<u8>` as a sequence of `u8`, which postcard then
//! decodes one element at a time. File contents and stack buffers can be
//! megabytes, so they go through `serialize_bytes`/`deserialize_byte_buf`,
//! which postcard handles as a length plus one copy.

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserializer, Serializer};

/// Serialize `v` as a byte string.
pub(crate) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(v)
}

/// Deserialize a byte string (or, for self-describing formats, a `u8` sequence).
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    d.deserialize_byte_buf(BytesVisitor)
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        // Never trust a declared length for allocation beyond a small bound.
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(b) = seq.next_element::<u8>()? {
            out.push(b);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct W(#[serde(with = "super")] Vec<u8>);

    #[test]
    fn postcard_layout_is_varint_length_then_raw_bytes() {
        let enc = postcard::to_allocvec(&W(vec![7; 200])).unwrap();
        // 200 as a LEB128 varint is [0xc8, 0x01].
        assert_eq!(&enc[..2], &[0xc8, 0x01]);
        assert_eq!(enc.len(), 202);
        assert_eq!(postcard::from_bytes::<W>(&enc).unwrap(), W(vec![7; 200]));
    }

    #[test]
    fn declared_length_past_the_end_is_an_error() {
        // Claims 200 bytes, provides 3.
        assert!(postcard::from_bytes::<W>(&[0xc8, 0x01, 1, 2, 3]).is_err());
    }
}
