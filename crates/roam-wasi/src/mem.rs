//! Bounds-checked access to guest linear memory.
//!
//! Exists because every pointer a guest passes to an import is untrusted: any
//! out-of-range or overflowing address must become `EFAULT`, never a panic.

use crate::errno::Errno;
use std::ops::Range;

/// A borrowed view of guest linear memory with checked accessors.
pub(crate) struct Mem<'a>(pub(crate) &'a mut [u8]);

impl Mem<'_> {
    fn range(&self, ptr: u32, len: u32) -> Result<Range<usize>, Errno> {
        let start = ptr as usize;
        let end = start.checked_add(len as usize).ok_or(Errno::FAULT)?;
        if end > self.0.len() {
            return Err(Errno::FAULT);
        }
        Ok(start..end)
    }

    pub(crate) fn slice(&self, ptr: u32, len: u32) -> Result<&[u8], Errno> {
        let r = self.range(ptr, len)?;
        Ok(&self.0[r])
    }

    pub(crate) fn slice_mut(&mut self, ptr: u32, len: u32) -> Result<&mut [u8], Errno> {
        let r = self.range(ptr, len)?;
        Ok(&mut self.0[r])
    }

    pub(crate) fn read<const N: usize>(&self, ptr: u32) -> Result<[u8; N], Errno> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.slice(ptr, N as u32)?);
        Ok(out)
    }

    pub(crate) fn u8(&self, ptr: u32) -> Result<u8, Errno> {
        Ok(self.read::<1>(ptr)?[0])
    }
    pub(crate) fn u16(&self, ptr: u32) -> Result<u16, Errno> {
        Ok(u16::from_le_bytes(self.read(ptr)?))
    }
    pub(crate) fn u32(&self, ptr: u32) -> Result<u32, Errno> {
        Ok(u32::from_le_bytes(self.read(ptr)?))
    }
    pub(crate) fn u64(&self, ptr: u32) -> Result<u64, Errno> {
        Ok(u64::from_le_bytes(self.read(ptr)?))
    }

    pub(crate) fn write(&mut self, ptr: u32, bytes: &[u8]) -> Result<(), Errno> {
        let len = u32::try_from(bytes.len()).map_err(|_| Errno::FAULT)?;
        self.slice_mut(ptr, len)?.copy_from_slice(bytes);
        Ok(())
    }
    pub(crate) fn put_u32(&mut self, ptr: u32, v: u32) -> Result<(), Errno> {
        self.write(ptr, &v.to_le_bytes())
    }
    pub(crate) fn put_u64(&mut self, ptr: u32, v: u64) -> Result<(), Errno> {
        self.write(ptr, &v.to_le_bytes())
    }

    /// A guest string (path or name): must be in bounds and valid UTF-8.
    pub(crate) fn str(&self, ptr: u32, len: u32) -> Result<String, Errno> {
        let b = self.slice(ptr, len)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| Errno::ILSEQ)
    }

    /// The `(buf, len)` pairs of an iovec/ciovec array (8 bytes each).
    pub(crate) fn iovecs(&self, ptr: u32, count: u32) -> Result<Vec<(u32, u32)>, Errno> {
        let bytes = count.checked_mul(8).ok_or(Errno::FAULT)?;
        self.range(ptr, bytes)?;
        (0..count)
            .map(|i| {
                let at = ptr + i * 8;
                let buf = self.u32(at)?;
                let len = self.u32(at + 4)?;
                self.range(buf, len)?;
                Ok((buf, len))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_bounds_and_overflow_are_efault() {
        let mut buf = vec![0u8; 16];
        let mut m = Mem(&mut buf);
        assert_eq!(m.u32(13), Err(Errno::FAULT));
        assert_eq!(m.u32(u32::MAX), Err(Errno::FAULT));
        assert_eq!(m.slice(8, u32::MAX).unwrap_err(), Errno::FAULT);
        assert!(m.put_u64(8, 7).is_ok());
        assert_eq!(m.u64(8), Ok(7));
        assert_eq!(m.put_u64(9, 7), Err(Errno::FAULT));
    }

    #[test]
    fn iovecs_are_validated() {
        let mut buf = vec![0u8; 32];
        buf[0..4].copy_from_slice(&16u32.to_le_bytes());
        buf[4..8].copy_from_slice(&8u32.to_le_bytes());
        let m = Mem(&mut buf);
        assert_eq!(m.iovecs(0, 1), Ok(vec![(16, 8)]));
        // The second iovec lives in zeroed bytes 8..16: an empty buffer at 0.
        assert_eq!(m.iovecs(0, 2), Ok(vec![(16, 8), (0, 0)]));
        assert_eq!(m.iovecs(0, u32::MAX), Err(Errno::FAULT));
        let mut bad = vec![0u8; 8];
        bad[0..4].copy_from_slice(&4u32.to_le_bytes());
        bad[4..8].copy_from_slice(&100u32.to_le_bytes());
        assert_eq!(Mem(&mut bad).iovecs(0, 1), Err(Errno::FAULT));
    }

    #[test]
    fn strings_must_be_utf8() {
        let mut buf = vec![0xff, b'a'];
        let m = Mem(&mut buf);
        assert_eq!(m.str(0, 2), Err(Errno::ILSEQ));
        assert_eq!(m.str(1, 1).as_deref(), Ok("a"));
    }
}
