//! A minimal userfaultfd binding: the handful of ioctls dirty tracking and
//! lazy memory need.
//!
//! Why raw ioctls and not the `userfaultfd` crate: that crate generates its
//! constants from the C headers at build time (bindgen or a C compiler with
//! the target's kernel headers), which the aarch64 and riscv64 cross builds
//! do not have, and it exposes neither `UFFD_FEATURE_WP_UNPOPULATED` nor
//! raw feature bits. The kernel ABI used here is small and stable: six
//! structs and the generic `_IOWR`/`_IOR` encoding shared by x86_64,
//! aarch64 and riscv64.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

const UFFD_API: u64 = 0xAA;
/// Write-protect faults are reported.
pub(crate) const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
/// Write protection also applies to pages never touched (Linux 6.4).
pub(crate) const FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
pub(crate) const MODE_MISSING: u64 = 1 << 0;
pub(crate) const MODE_WP: u64 = 1 << 1;
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;
pub(crate) const EVENT_PAGEFAULT: u8 = 0x12;
pub(crate) const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

const fn iowr(nr: u64, size: u64) -> u64 {
    (3 << 30) | (size << 16) | (0xAA << 8) | nr
}
const fn ior(nr: u64, size: u64) -> u64 {
    (2 << 30) | (size << 16) | (0xAA << 8) | nr
}
const UFFDIO_API: u64 = iowr(0x3F, 24);
const UFFDIO_REGISTER: u64 = iowr(0x00, 32);
const UFFDIO_UNREGISTER: u64 = ior(0x01, 16);
const UFFDIO_WAKE: u64 = ior(0x02, 16);
const UFFDIO_COPY: u64 = iowr(0x03, 40);
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, 32);
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, 24);

#[repr(C)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct Range {
    start: u64,
    len: u64,
}
#[repr(C)]
struct Register {
    range: Range,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
struct Copy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
#[repr(C)]
struct Zeropage {
    range: Range,
    mode: u64,
    zeropage: i64,
}
#[repr(C)]
struct WriteProtect {
    range: Range,
    mode: u64,
}

/// A fault read from the descriptor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fault {
    pub event: u8,
    pub flags: u64,
    pub address: u64,
}

/// An open, initialised userfaultfd.
pub(crate) struct Uffd {
    fd: OwnedFd,
    /// Features the kernel supports (as reported by the handshake).
    pub features: u64,
}

fn ioctl<T>(fd: &OwnedFd, req: u64, arg: &mut T) -> io::Result<()> {
    loop {
        // SAFETY: `req` is one of the userfaultfd ioctls above, and `arg`
        // is the `#[repr(C)]` struct the kernel ABI defines for it.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl Uffd {
    /// Open a non-blocking userfaultfd with `features` enabled.
    pub(crate) fn open(features: u64) -> io::Result<Uffd> {
        // SAFETY: a plain system call with flag arguments; it returns a new
        // descriptor or -1.
        let fd =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor this function owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let mut api = Api {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        ioctl(&fd, UFFDIO_API, &mut api)?;
        Ok(Uffd {
            fd,
            features: api.features,
        })
    }

    pub(crate) fn register(&self, start: usize, len: usize, mode: u64) -> io::Result<()> {
        let mut r = Register {
            range: range(start, len),
            mode,
            ioctls: 0,
        };
        ioctl(&self.fd, UFFDIO_REGISTER, &mut r)
    }

    pub(crate) fn unregister(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = range(start, len);
        ioctl(&self.fd, UFFDIO_UNREGISTER, &mut r)
    }

    pub(crate) fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = range(start, len);
        ioctl(&self.fd, UFFDIO_WAKE, &mut r)
    }

    /// Set (`protect`) or clear write protection; clearing wakes waiters.
    pub(crate) fn write_protect(&self, start: usize, len: usize, protect: bool) -> io::Result<()> {
        let mut w = WriteProtect {
            range: range(start, len),
            mode: if protect { WRITEPROTECT_MODE_WP } else { 0 },
        };
        retry_again(|| ioctl(&self.fd, UFFDIO_WRITEPROTECT, &mut w))
    }

    /// Install `len` bytes from `src` at `dst` (missing pages) and wake the
    /// waiters. `Ok(false)` if a page was already present.
    ///
    /// # Safety
    ///
    /// `src` must be readable for `len` bytes.
    pub(crate) unsafe fn copy(&self, dst: usize, src: *const u8, len: usize) -> io::Result<bool> {
        // SAFETY: as the caller promises.
        unsafe { self.copy_mode(dst, src, len, 0) }
    }

    /// [`Uffd::copy`] with a mode (`UFFDIO_COPY_MODE_WP` installs the
    /// page write-protected).
    ///
    /// # Safety
    ///
    /// `src` must be readable for `len` bytes.
    pub(crate) unsafe fn copy_mode(
        &self,
        dst: usize,
        src: *const u8,
        len: usize,
        mode: u64,
    ) -> io::Result<bool> {
        let mut c = Copy {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode,
            copy: 0,
        };
        match retry_again(|| ioctl(&self.fd, UFFDIO_COPY, &mut c)) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Install the pages of `[dst, dst + len)` from `src`, skipping those
    /// already present, and wake the waiters; returns the bytes installed.
    /// One ioctl for a run of missing pages, where [`Uffd::copy`] stops at
    /// the first present page.
    ///
    /// # Safety
    ///
    /// `src` must be readable for `len` bytes; `len` a multiple of 4 KiB.
    pub(crate) unsafe fn copy_missing(
        &self,
        dst: usize,
        src: *const u8,
        len: usize,
    ) -> io::Result<usize> {
        const PAGE: usize = 4096;
        let (mut done, mut installed) = (0usize, 0usize);
        while done < len {
            let mut c = Copy {
                dst: (dst + done) as u64,
                src: src as u64 + done as u64,
                len: (len - done) as u64,
                mode: 0,
                copy: 0,
            };
            match ioctl(&self.fd, UFFDIO_COPY, &mut c) {
                Ok(()) => return Ok(installed + len - done),
                // Part copied (then EAGAIN), or a present page first (EEXIST).
                Err(e) => {
                    let copied = if c.copy > 0 { c.copy as usize } else { 0 };
                    done += copied;
                    installed += copied;
                    match e.raw_os_error() {
                        Some(libc::EEXIST) if copied == 0 => done += PAGE,
                        Some(libc::EEXIST) | Some(libc::EAGAIN) => {}
                        _ => return Err(e),
                    }
                }
            }
        }
        Ok(installed)
    }

    /// Map zero pages at `[start, start + len)` and wake the waiters.
    /// `Ok(false)` if a page was already present.
    pub(crate) fn zeropage(&self, start: usize, len: usize) -> io::Result<bool> {
        let mut z = Zeropage {
            range: range(start, len),
            mode: 0,
            zeropage: 0,
        };
        match retry_again(|| ioctl(&self.fd, UFFDIO_ZEROPAGE, &mut z)) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Wait up to `timeout_ms` for a fault to read.
    pub(crate) fn poll(&self, timeout_ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let rc = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        rc > 0 && p.revents & libc::POLLIN != 0
    }

    /// Read one pending event, if any.
    pub(crate) fn read(&self) -> io::Result<Option<Fault>> {
        let mut msg = [0u8; 32];
        // SAFETY: reads at most 32 bytes into a 32-byte buffer.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), msg.as_mut_ptr().cast(), msg.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        if n != 32 {
            return Ok(None);
        }
        let u64_at = |o: usize| u64::from_ne_bytes(msg[o..o + 8].try_into().expect("8 bytes"));
        Ok(Some(Fault {
            event: msg[0],
            flags: u64_at(8),
            address: u64_at(16),
        }))
    }
}

fn range(start: usize, len: usize) -> Range {
    Range {
        start: start as u64,
        len: len as u64,
    }
}

/// The kernel answers EAGAIN while the address space changes under an
/// operation; trying again is what it asks for.
fn retry_again(mut f: impl FnMut() -> io::Result<()>) -> io::Result<()> {
    loop {
        match f() {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => std::thread::yield_now(),
            other => return other,
        }
    }
}

/// Probe userfaultfd once: the features the kernel offers, or why it cannot
/// be used (e.g. `ENOSYS` under qemu-user, `EPERM` without privilege).
pub(crate) fn probe() -> &'static Result<u64, String> {
    static PROBE: OnceLock<Result<u64, String>> = OnceLock::new();
    PROBE.get_or_init(|| match Uffd::open(0) {
        Ok(u) => Ok(u.features),
        Err(e) => Err(format!("userfaultfd is not usable here: {e}")),
    })
}

/// Why this process cannot use userfaultfd for roam's pages, or `None`
/// when it can ([`userfaultfd_available`]).
pub(crate) fn unavailable() -> Option<String> {
    match probe() {
        Err(e) => Some(e.clone()),
        Ok(_) if crate::memory::host_page_size() != roam_snapshot::PAGE_SIZE => {
            Some("the host page size is not 4 KiB".into())
        }
        Ok(_) => None,
    }
}

/// Whether this process can use userfaultfd (probed once, then cached). It
/// is missing under qemu-user, where the system call returns `ENOSYS`, and
/// without privilege when `vm.unprivileged_userfaultfd` is 0.
pub fn userfaultfd_available() -> bool {
    probe().is_ok() && crate::memory::host_page_size() == roam_snapshot::PAGE_SIZE
}
