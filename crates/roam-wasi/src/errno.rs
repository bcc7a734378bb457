//! WASI preview 1 error numbers and the mapping from host I/O errors.
//!
//! Exists because every import reports failure to the guest as a 16-bit
//! `errno` whose values are fixed by the `wasi_snapshot_preview1` witx spec
//! (they are *not* the host's errno values), and because sandbox refusals from
//! `cap-std` carry no OS error code and must still become `ENOTCAPABLE`.

use std::io;

/// A WASI preview 1 `errno` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub u16);

#[allow(missing_docs)]
impl Errno {
    pub const SUCCESS: Errno = Errno(0);
    pub const TOOBIG: Errno = Errno(1);
    pub const ACCES: Errno = Errno(2);
    pub const AGAIN: Errno = Errno(6);
    pub const BADF: Errno = Errno(8);
    pub const BUSY: Errno = Errno(10);
    pub const CONNRESET: Errno = Errno(15);
    pub const EXIST: Errno = Errno(20);
    pub const FAULT: Errno = Errno(21);
    pub const DQUOT: Errno = Errno(19);
    pub const FBIG: Errno = Errno(22);
    pub const ILSEQ: Errno = Errno(25);
    pub const INTR: Errno = Errno(27);
    pub const INVAL: Errno = Errno(28);
    pub const IO: Errno = Errno(29);
    pub const ISDIR: Errno = Errno(31);
    pub const LOOP: Errno = Errno(32);
    pub const MFILE: Errno = Errno(33);
    pub const MLINK: Errno = Errno(34);
    pub const NAMETOOLONG: Errno = Errno(37);
    pub const NFILE: Errno = Errno(41);
    pub const NOENT: Errno = Errno(44);
    pub const NOMEM: Errno = Errno(48);
    pub const NOSPC: Errno = Errno(51);
    pub const NOSYS: Errno = Errno(52);
    pub const NOTCONN: Errno = Errno(53);
    pub const NOTDIR: Errno = Errno(54);
    pub const NOTEMPTY: Errno = Errno(55);
    pub const NOTSOCK: Errno = Errno(57);
    pub const NOTSUP: Errno = Errno(58);
    pub const NOTTY: Errno = Errno(59);
    pub const NXIO: Errno = Errno(60);
    pub const OVERFLOW: Errno = Errno(61);
    pub const PERM: Errno = Errno(63);
    pub const PIPE: Errno = Errno(64);
    pub const RANGE: Errno = Errno(68);
    pub const ROFS: Errno = Errno(69);
    pub const SPIPE: Errno = Errno(70);
    pub const TXTBSY: Errno = Errno(74);
    pub const XDEV: Errno = Errno(75);
    pub const NOTCAPABLE: Errno = Errno(76);
}

impl Errno {
    /// The value handed back to the guest as the import's return value.
    pub fn code(self) -> i32 {
        i32::from(self.0)
    }
}

/// Host OS errno → WASI errno, for the errors file operations can produce.
fn from_host(e: rustix::io::Errno) -> Errno {
    use rustix::io::Errno as H;
    let table: &[(H, Errno)] = &[
        (H::TOOBIG, Errno::TOOBIG),
        (H::ACCESS, Errno::ACCES),
        (H::AGAIN, Errno::AGAIN),
        (H::BADF, Errno::BADF),
        (H::BUSY, Errno::BUSY),
        (H::EXIST, Errno::EXIST),
        (H::FAULT, Errno::FAULT),
        (H::DQUOT, Errno::DQUOT),
        (H::FBIG, Errno::FBIG),
        (H::ILSEQ, Errno::ILSEQ),
        (H::INTR, Errno::INTR),
        (H::INVAL, Errno::INVAL),
        (H::IO, Errno::IO),
        (H::ISDIR, Errno::ISDIR),
        (H::LOOP, Errno::LOOP),
        (H::MFILE, Errno::MFILE),
        (H::MLINK, Errno::MLINK),
        (H::NAMETOOLONG, Errno::NAMETOOLONG),
        (H::NFILE, Errno::NFILE),
        (H::NOENT, Errno::NOENT),
        (H::NOMEM, Errno::NOMEM),
        (H::NOSPC, Errno::NOSPC),
        (H::NOSYS, Errno::NOSYS),
        (H::NOTDIR, Errno::NOTDIR),
        (H::NOTEMPTY, Errno::NOTEMPTY),
        (H::NOTSOCK, Errno::NOTSOCK),
        (H::NOTSUP, Errno::NOTSUP),
        (H::NOTTY, Errno::NOTTY),
        (H::NXIO, Errno::NXIO),
        (H::OVERFLOW, Errno::OVERFLOW),
        (H::PERM, Errno::PERM),
        (H::PIPE, Errno::PIPE),
        (H::RANGE, Errno::RANGE),
        (H::ROFS, Errno::ROFS),
        (H::SPIPE, Errno::SPIPE),
        (H::TXTBSY, Errno::TXTBSY),
        // openat2(RESOLVE_BENEATH) reports an escape attempt as EXDEV.
        (H::XDEV, Errno::NOTCAPABLE),
    ];
    table
        .iter()
        .find(|(h, _)| *h == e)
        .map(|(_, w)| *w)
        .unwrap_or(Errno::IO)
}

impl From<io::Error> for Errno {
    fn from(e: io::Error) -> Errno {
        if let Some(raw) = e.raw_os_error() {
            return from_host(rustix::io::Errno::from_raw_os_error(raw));
        }
        match e.kind() {
            // cap-std's "a path led outside of the filesystem" has no OS code.
            io::ErrorKind::PermissionDenied => Errno::NOTCAPABLE,
            io::ErrorKind::NotFound => Errno::NOENT,
            io::ErrorKind::AlreadyExists => Errno::EXIST,
            io::ErrorKind::InvalidInput => Errno::INVAL,
            io::ErrorKind::WouldBlock => Errno::AGAIN,
            io::ErrorKind::Unsupported => Errno::NOTSUP,
            _ => Errno::IO,
        }
    }
}

impl From<rustix::io::Errno> for Errno {
    fn from(e: rustix::io::Errno) -> Errno {
        from_host(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_errors_map_to_witx_values() {
        let e = io::Error::from_raw_os_error(rustix::io::Errno::NOENT.raw_os_error());
        assert_eq!(Errno::from(e), Errno(44));
        let e = io::Error::from_raw_os_error(rustix::io::Errno::NOTEMPTY.raw_os_error());
        assert_eq!(Errno::from(e), Errno(55));
        let e = io::Error::from_raw_os_error(rustix::io::Errno::XDEV.raw_os_error());
        assert_eq!(Errno::from(e), Errno::NOTCAPABLE);
    }

    #[test]
    fn sandbox_refusal_without_os_code_is_notcapable() {
        let e = io::Error::new(io::ErrorKind::PermissionDenied, "escape");
        assert_eq!(Errno::from(e), Errno(76));
        let e = io::Error::other("weird");
        assert_eq!(Errno::from(e), Errno::IO);
    }
}
