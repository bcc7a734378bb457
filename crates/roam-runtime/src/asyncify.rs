//! Driving Binaryen Asyncify from the host.
//!
//! Asyncify keeps its state in two globals and a buffer in linear memory
//! whose 8-byte header is `{ current: u32, end: u32 }`. Unwinding pushes
//! each frame's locals and resume point at `current`; rewinding pops them in
//! reverse, so the bytes between the header and `current` *are* the call
//! stack, in a form no ISA can tell apart.
//!
//! Where the buffer lives: at the start of linear memory, with all of memory
//! as capacity. No address range is free for the host in a wasm memory
//! (wasi-libc's malloc claims everything up to `memory.size` at start-up, so
//! a region reserved by growing memory ends up as heap). Instead the buffer
//! borrows program memory for the instant of an unwind or a rewind, while no
//! program code runs: the bytes it overwrites are put back from the memory
//! image captured just before the unwind, or from a copy taken just before
//! the rewind. The program never sees them change, and its memory size is
//! exactly what it would be without roam.

use wasmtime::{AsContextMut, Instance, TypedFunc};

use crate::error::LoadError;

/// `asyncify_get_state` when running normally (`roam.state` uses the same
/// numbers).
pub(crate) const NORMAL: i32 = roam_prepare::NORMAL;
/// `asyncify_get_state` while the stack unwinds.
pub(crate) const UNWINDING: i32 = roam_prepare::UNWINDING;
/// `asyncify_get_state` while the stack rewinds.
pub(crate) const REWINDING: i32 = roam_prepare::REWINDING;

/// Size of the buffer header.
pub(crate) const HEADER: u32 = 8;

/// Where the unwind buffer lives in linear memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Buffer {
    pub offset: u32,
    pub capacity: u32,
}

impl Buffer {
    /// The buffer for a memory of `len` bytes: all of it, from address 0.
    pub(crate) fn over(len: usize) -> Buffer {
        Buffer {
            offset: 0,
            capacity: u32::try_from(len).unwrap_or(u32::MAX) & !7,
        }
    }

    /// Write a header that starts an unwind: empty, full capacity.
    pub(crate) fn reset_header(&self, mem: &mut [u8]) {
        self.write_header(mem, self.offset + HEADER);
    }

    /// Write a header whose `current` is `current`.
    fn write_header(&self, mem: &mut [u8], current: u32) {
        let o = self.offset as usize;
        mem[o..o + 4].copy_from_slice(&current.to_le_bytes());
        mem[o + 4..o + 8].copy_from_slice(&(self.offset + self.capacity).to_le_bytes());
    }

    /// Where the captured stack ends, as the header says.
    pub(crate) fn current(&self, mem: &[u8]) -> u32 {
        let o = self.offset as usize;
        u32::from_le_bytes(mem[o..o + 4].try_into().expect("4 bytes"))
    }

    /// Set where the captured stack ends (an unwind the host tracked).
    pub(crate) fn set_current(&self, mem: &mut [u8], current: u32) {
        self.write_header(mem, current);
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

    /// Put unwound bytes back for a rewind. Returns the bytes of program
    /// memory this overwrote, to be put back when the rewind completes.
    pub(crate) fn load(&self, mem: &mut [u8], data: &[u8]) -> Result<Vec<u8>, String> {
        let len = u32::try_from(data.len()).map_err(|_| "stack larger than 4 GiB".to_string())?;
        if len > self.capacity.saturating_sub(HEADER) {
            return Err(format!(
                "{len} bytes of stack do not fit a {}-byte memory",
                self.capacity
            ));
        }
        let o = self.offset as usize;
        let used = (HEADER + len) as usize;
        let saved = mem[o..o + used].to_vec();
        mem[o + HEADER as usize..o + used].copy_from_slice(data);
        self.write_header(mem, self.offset + HEADER + len);
        Ok(saved)
    }

    /// Put back program bytes saved by [`Buffer::load`].
    pub(crate) fn unload(&self, mem: &mut [u8], saved: &[u8]) {
        let o = self.offset as usize;
        mem[o..o + saved.len()].copy_from_slice(saved);
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
    pub(crate) fn new(
        instance: &Instance,
        mut store: impl AsContextMut,
    ) -> Result<Self, LoadError> {
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
    fn load_saves_what_it_overwrites_and_data_reads_it_back() {
        let b = Buffer::over(256);
        let mut mem: Vec<u8> = (0..=255).collect();
        let before = mem.clone();
        let saved = b.load(&mut mem, &[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(saved, &before[..13]);
        assert_eq!(b.data(&mem).unwrap(), &[1, 2, 3, 4, 5]);
        b.unload(&mut mem, &saved);
        assert_eq!(mem, before);
    }

    #[test]
    fn oversized_stack_and_bad_pointer_are_refused() {
        let b = Buffer::over(16);
        let mut mem = vec![0u8; 16];
        assert!(b.load(&mut mem, &[0; 9]).is_err());
        b.write_header(&mut mem, 40);
        assert!(b.data(&mem).is_err());
        b.write_header(&mut mem, 4);
        assert!(b.data(&mem).is_err());
    }

    #[test]
    fn capacity_is_word_aligned_and_fits_u32() {
        assert_eq!(Buffer::over(1 << 16).capacity, 1 << 16);
        assert_eq!(Buffer::over(usize::MAX).capacity, 0xFFFF_FFF8);
    }
}
