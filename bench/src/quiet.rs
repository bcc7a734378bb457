//! Silencing the process's stdout while in-process guests run.
//!
//! Why it exists: T2 and T3 run programs inside this process through
//! `roam-runtime`, whose WASI layer writes guest stdout to the host's fd 1.
//! The benchmark's own table goes to stdout too, so guest output is sent to
//! `/dev/null` while a guest runs and fd 1 is put back afterwards.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};

/// While alive, fd 1 points at `/dev/null`.
pub struct Quiet {
    saved: OwnedFd,
}

impl Quiet {
    /// Redirect fd 1 to `/dev/null`.
    pub fn new() -> std::io::Result<Quiet> {
        std::io::stdout().flush()?;
        let saved = rustix::io::dup(std::io::stdout().as_fd())?;
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
        rustix::stdio::dup2_stdout(&null)?;
        Ok(Quiet { saved })
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        let _ = std::io::stdout().flush();
        let _ = rustix::stdio::dup2_stdout(&self.saved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn redirects_and_restores_fd1() {
        let ino = |fd: i32| {
            std::fs::metadata(format!("/proc/self/fd/{fd}")).map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino())
            })
        };
        let before = ino(1).unwrap();
        let null = ino(std::fs::File::open("/dev/null").unwrap().as_raw_fd()).unwrap();
        {
            let _q = Quiet::new().unwrap();
            assert_eq!(ino(1).unwrap(), null);
        }
        assert_eq!(ino(1).unwrap(), before);
    }
}
