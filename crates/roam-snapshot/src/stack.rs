//! Reading and writing the Asyncify unwind buffer in linear memory.
//!
//! Asyncify keeps its state in a two-word header `{ current: u32, end: u32 }`
//! at `buffer_offset`, followed by the buffer the unwind writes into. Both the
//! checkpoint side and the restore side need to translate between that
//! in-memory form and [`UnwoundStack`]; doing it here keeps the bounds checks
//! in one place.

use crate::model::{UnwoundStack, ASYNCIFY_HEADER_LEN};

/// Why the unwind buffer could not be read from or written to memory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StackError {
    /// The header or buffer does not lie inside linear memory.
    #[error(
        "Asyncify buffer [{offset}, {end}) lies outside the {memory_len}-byte memory; \
         pass the offset the module's unwind used"
    )]
    OutOfBounds {
        /// Start of the buffer (its header).
        offset: u64,
        /// One past its last byte.
        end: u64,
        /// Size of linear memory.
        memory_len: u64,
    },
    /// The header's pointers are inconsistent.
    #[error(
        "Asyncify header at {offset} is inconsistent (current {current}, end {end}); \
         the module did not complete an unwind into this buffer"
    )]
    BadHeader {
        /// Location of the header.
        offset: u32,
        /// The `current` pointer found.
        current: u32,
        /// The `end` pointer found.
        end: u32,
    },
}

fn u32_at(mem: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(mem[at..at + 4].try_into().expect("4 bytes"))
}

impl UnwoundStack {
    /// Read the unwind buffer whose header is at `buffer_offset`, after an
    /// unwind has completed: data is `[buffer_offset + 8, current)` and the
    /// capacity is `end - buffer_offset`.
    pub fn read_from(memory: &[u8], buffer_offset: u32) -> Result<UnwoundStack, StackError> {
        let off = u64::from(buffer_offset);
        let hdr_end = off + u64::from(ASYNCIFY_HEADER_LEN);
        let oob = |end| StackError::OutOfBounds {
            offset: off,
            end,
            memory_len: memory.len() as u64,
        };
        if hdr_end > memory.len() as u64 {
            return Err(oob(hdr_end));
        }
        let at = buffer_offset as usize;
        let (current, end) = (u32_at(memory, at), u32_at(memory, at + 4));
        if u64::from(current) < hdr_end || current > end {
            return Err(StackError::BadHeader {
                offset: buffer_offset,
                current,
                end,
            });
        }
        if u64::from(end) > memory.len() as u64 {
            return Err(oob(u64::from(end)));
        }
        Ok(UnwoundStack {
            buffer_offset,
            capacity: end - buffer_offset,
            data: memory[hdr_end as usize..current as usize].to_vec(),
        })
    }

    /// Write the buffer back so a rewind can start: data at
    /// `buffer_offset + 8`, `current` just past it, `end` at
    /// `buffer_offset + capacity`. Nothing is written if it does not fit.
    pub fn write_to(&self, memory: &mut [u8]) -> Result<(), StackError> {
        let off = u64::from(self.buffer_offset);
        let end = off + u64::from(self.capacity);
        let used = u64::from(ASYNCIFY_HEADER_LEN) + self.data.len() as u64;
        if end > memory.len() as u64 || end > u64::from(u32::MAX) {
            return Err(StackError::OutOfBounds {
                offset: off,
                end,
                memory_len: memory.len() as u64,
            });
        }
        if used > u64::from(self.capacity) {
            return Err(StackError::BadHeader {
                offset: self.buffer_offset,
                current: (off + used).min(u64::from(u32::MAX)) as u32,
                end: end as u32,
            });
        }
        let at = off as usize;
        let current = (off + used) as u32;
        memory[at..at + 4].copy_from_slice(&current.to_le_bytes());
        memory[at + 4..at + 8].copy_from_slice(&(end as u32).to_le_bytes());
        memory[at + 8..at + 8 + self.data.len()].copy_from_slice(&self.data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_after_unwind_and_write_back() {
        let mut mem = vec![0u8; 65536];
        // Header at 1000: current = 1000 + 8 + 5, end = 1000 + 64.
        mem[1000..1004].copy_from_slice(&1013u32.to_le_bytes());
        mem[1004..1008].copy_from_slice(&1064u32.to_le_bytes());
        mem[1008..1013].copy_from_slice(b"stack");
        let s = UnwoundStack::read_from(&mem, 1000).unwrap();
        assert_eq!(
            s,
            UnwoundStack {
                buffer_offset: 1000,
                capacity: 64,
                data: b"stack".to_vec()
            }
        );

        let mut other = vec![0xFFu8; 65536];
        s.write_to(&mut other).unwrap();
        assert_eq!(&other[1000..1013], &mem[1000..1013]);
        assert_eq!(other[1013], 0xFF, "bytes past the data are not touched");
        assert_eq!(UnwoundStack::read_from(&other, 1000).unwrap(), s);
    }

    #[test]
    fn refuses_bad_headers_and_bounds() {
        let mut mem = vec![0u8; 4096];
        assert!(matches!(
            UnwoundStack::read_from(&mem, 4090),
            Err(StackError::OutOfBounds { .. })
        ));
        // current before the data start.
        mem[0..4].copy_from_slice(&4u32.to_le_bytes());
        mem[4..8].copy_from_slice(&100u32.to_le_bytes());
        assert!(matches!(
            UnwoundStack::read_from(&mem, 0),
            Err(StackError::BadHeader { .. })
        ));
        // current past end.
        mem[0..4].copy_from_slice(&200u32.to_le_bytes());
        assert!(matches!(
            UnwoundStack::read_from(&mem, 0),
            Err(StackError::BadHeader { .. })
        ));
        // end past memory.
        mem[0..4].copy_from_slice(&8u32.to_le_bytes());
        mem[4..8].copy_from_slice(&5000u32.to_le_bytes());
        assert!(matches!(
            UnwoundStack::read_from(&mem, 0),
            Err(StackError::OutOfBounds { .. })
        ));

        let s = UnwoundStack {
            buffer_offset: 4000,
            capacity: 200,
            data: vec![],
        };
        assert!(matches!(
            s.write_to(&mut mem),
            Err(StackError::OutOfBounds { .. })
        ));
        let s = UnwoundStack {
            buffer_offset: 0,
            capacity: 10,
            data: vec![1; 3],
        };
        let before = mem.clone();
        assert!(matches!(
            s.write_to(&mut mem),
            Err(StackError::BadHeader { .. })
        ));
        assert_eq!(mem, before);
    }
}
