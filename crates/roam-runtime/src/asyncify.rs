//! Driving Binaryen Asyncify from the host.
//!
//! Asyncify keeps its state in two globals and a buffer in linear memory
//! whose 8-byte header is `{ current: u32, end: u32 }`. Unwinding pushes
//! each frame's locals and resume point at `current`; rewinding pops them in
//! reverse, so the bytes between the header and `current` *are* the call
//! stack, in a form no ISA can tell apart.
//!
//! The buffer lives in a region roam reserves by growing memory before the
//! program starts (see [`crate::DEFAULT_UNWIND_BUFFER`]). The program never
//! touches it; roam zeroes it after every use, so it costs nothing in a
//! snapshot.

use wasmtime::{AsContextMut, Instance, TypedFunc};

use crate::error::LoadError;

/// `asyncify_get_state` when running normally.
pub(crate) const NORMAL: i32 = 0;
/// `asyncify_get_state` while the stack unwinds.
pub(crate) const UNWINDING: i32 = 1;
/// `asyncify_get_state` while the stack rewinds.
pub(crate) const REWINDING: i32 = 2;

/// Size of the buffer header.
pub(crate) const HEADER: u32 = 8;

/// Where the unwind buffer lives in linear memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Buffer {
    pub offset: u32,
    pub capacity: u32,
}

impl Buffer {
    /// Write a header that starts an unwind: empty, full capacity.
    pub(crate) fn reset_header(&self, mem: &mut [u8]) {
        self.write_header(mem, self.offset + HEADER);
    }

    /// Write a header whose `current` is `current`.
    pub(crate) fn write_header(&self, mem: &mut [u8], current: u32) {
        let o = self.offset as usize;
        mem[o..o + 4].copy_from_slice(&current.to_le_bytes());
        mem[o + 4..o + 8].copy_from_slice(&(self.offset + self.capacity).to_le_bytes());
    }

    /// The unwound bytes, after a completed unwind.
    pub(crate) fn data<'m>(&self, mem: &'m [u8]) -> Result<&'m [u8], String> {
        let o = self.offset as usize;
        let current = u32::from_le_bytes(mem[o..o + 4].try_into().expect("4 bytes"));
        let start = self.offset + HEADER;
        if current < start || current > self.offset + self.capacity {
            return Err(format!(
                "buffer pointer {current:#x} outside [{start:#x}, {:#x}]",
                self.offset + self.capacity
            ));
        }
        Ok(&mem[start as usize..current as usize])
    }

    /// Put unwound bytes back for a rewind.
    pub(crate) fn load(&self, mem: &mut [u8], data: &[u8]) -> Result<u32, String> {
        let len = u32::try_from(data.len()).map_err(|_| "stack larger than 4 GiB".to_string())?;
        if len > self.capacity.saturating_sub(HEADER) {
            return Err(format!(
                "{len} bytes of stack do not fit a {}-byte buffer",
                self.capacity
            ));
        }
        let start = (self.offset + HEADER) as usize;
        mem[start..start + data.len()].copy_from_slice(data);
        self.write_header(mem, self.offset + HEADER + len);
        Ok(HEADER + len)
    }

    /// Zero the first `used` bytes so the region is blank again.
    pub(crate) fn clear(&self, mem: &mut [u8], used: u32) {
        let o = self.offset as usize;
        let end = o + (used.min(self.capacity) as usize);
        mem[o..end].fill(0);
    }
}

/// Handles to the Asyncify exports of one instance.
#[derive(Clone)]
pub(crate) struct Asyncify {
    start_unwind: TypedFunc<i32, ()>,
    stop_unwind: TypedFunc<(), ()>,
    start_rewind: TypedFunc<i32, ()>,
    stop_rewind: TypedFunc<(), ()>,
    get_state: TypedFunc<(), i32>,
}

impl Asyncify {
    pub(crate) fn new(instance: &Instance, mut store: impl AsContextMut) -> Result<Self, LoadError> {
        let mut store = store.as_context_mut();
        macro_rules! get {
            ($name:literal) => {
                instance
                    .get_typed_func(&mut store, $name)
                    .map_err(|_| LoadError::MissingExport($name.to_string()))?
            };
        }
        Ok(Asyncify {
            start_unwind: get!("asyncify_start_unwind"),
            stop_unwind: get!("asyncify_stop_unwind"),
            start_rewind: get!("asyncify_start_rewind"),
            stop_rewind: get!("asyncify_stop_rewind"),
            get_state: get!("asyncify_get_state"),
        })
    }

    pub(crate) fn state(&self, store: impl AsContextMut) -> wasmtime::Result<i32> {
        self.get_state.call(store, ())
    }

    pub(crate) fn start_unwind(&self, store: impl AsContextMut, b: Buffer) -> wasmtime::Result<()> {
        self.start_unwind.call(store, b.offset as i32)
    }

    pub(crate) fn stop_unwind(&self, store: impl AsContextMut) -> wasmtime::Result<()> {
        self.stop_unwind.call(store, ())
    }

    pub(crate) fn start_rewind(&self, store: impl AsContextMut, b: Buffer) -> wasmtime::Result<()> {
        self.start_rewind.call(store, b.offset as i32)
    }

    pub(crate) fn stop_rewind(&self, store: impl AsContextMut) -> wasmtime::Result<()> {
        self.stop_rewind.call(store, ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_then_data_round_trips() {
        let b = Buffer {
            offset: 64,
            capacity: 64,
        };
        let mut mem = vec![0u8; 256];
        let used = b.load(&mut mem, &[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(used, 13);
        assert_eq!(b.data(&mem).unwrap(), &[1, 2, 3, 4, 5]);
        b.clear(&mut mem, used);
        assert!(mem.iter().all(|&x| x == 0));
    }

    #[test]
    fn oversized_stack_and_bad_pointer_are_refused() {
        let b = Buffer {
            offset: 0,
            capacity: 16,
        };
        let mut mem = vec![0u8; 64];
        assert!(b.load(&mut mem, &[0; 9]).is_err());
        b.write_header(&mut mem, 40);
        assert!(b.data(&mem).is_err());
        b.write_header(&mut mem, 4);
        assert!(b.data(&mem).is_err());
    }
}
