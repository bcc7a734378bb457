//! args, environ, clocks and randomness.
//!
//! Exists to serve the process-level calls whose answers come from the
//! context (args/env) or from the host (realtime clock, entropy), with the
//! monotonic clock taken from the context so it survives migration.

use crate::ctx::WasiCtx;
use crate::errno::Errno;
use crate::mem::Mem;
use crate::types::clockid;
use std::time::{SystemTime, UNIX_EPOCH};

/// Write NUL-terminated strings into `buf` and their addresses into `ptrs`.
fn put_strings(mem: &mut Mem, items: &[String], ptrs: u32, buf: u32) -> Result<(), Errno> {
    let mut at = buf;
    for (i, s) in items.iter().enumerate() {
        let slot = ptrs.checked_add(4 * i as u32).ok_or(Errno::FAULT)?;
        mem.put_u32(slot, at)?;
        mem.write(at, s.as_bytes())?;
        let end = at.checked_add(s.len() as u32).ok_or(Errno::FAULT)?;
        mem.write(end, &[0])?;
        at = end.checked_add(1).ok_or(Errno::FAULT)?;
    }
    Ok(())
}

fn sizes(mem: &mut Mem, items: &[String], count_ptr: u32, size_ptr: u32) -> Result<(), Errno> {
    let total: usize = items.iter().map(|s| s.len() + 1).sum();
    mem.put_u32(
        count_ptr,
        u32::try_from(items.len()).map_err(|_| Errno::OVERFLOW)?,
    )?;
    mem.put_u32(size_ptr, u32::try_from(total).map_err(|_| Errno::OVERFLOW)?)
}

impl WasiCtx {
    fn env_strings(&self) -> Vec<String> {
        self.env.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    pub(crate) fn args_get(&self, mem: &mut Mem, argv: u32, buf: u32) -> Result<(), Errno> {
        put_strings(mem, &self.args, argv, buf)
    }

    pub(crate) fn args_sizes_get(&self, mem: &mut Mem, argc: u32, size: u32) -> Result<(), Errno> {
        sizes(mem, &self.args, argc, size)
    }

    pub(crate) fn environ_get(&self, mem: &mut Mem, env: u32, buf: u32) -> Result<(), Errno> {
        put_strings(mem, &self.env_strings(), env, buf)
    }

    pub(crate) fn environ_sizes_get(&self, mem: &mut Mem, n: u32, size: u32) -> Result<(), Errno> {
        sizes(mem, &self.env_strings(), n, size)
    }

    /// Current value of a clock in ns. Process/thread cputime are
    /// approximated by guest monotonic time elapsed since program start.
    pub(crate) fn clock_now(&self, id: u32) -> Result<u64, Errno> {
        match id {
            clockid::REALTIME => {
                let d = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_err(|_| Errno::OVERFLOW)?;
                u64::try_from(d.as_nanos()).map_err(|_| Errno::OVERFLOW)
            }
            clockid::MONOTONIC => Ok(self.clock.now_ns()),
            clockid::PROCESS_CPUTIME | clockid::THREAD_CPUTIME => {
                Ok(self.clock.now_ns().saturating_sub(self.start_monotonic_ns))
            }
            _ => Err(Errno::INVAL),
        }
    }

    pub(crate) fn clock_res_get(&self, mem: &mut Mem, id: u32, out: u32) -> Result<(), Errno> {
        self.clock_now(id)?;
        mem.put_u64(out, 1_000)
    }

    pub(crate) fn clock_time_get(&self, mem: &mut Mem, id: u32, out: u32) -> Result<(), Errno> {
        let t = self.clock_now(id)?;
        mem.put_u64(out, t)
    }
}

pub(crate) fn random_get(mem: &mut Mem, buf: u32, len: u32) -> Result<(), Errno> {
    let dst = mem.slice_mut(buf, len)?;
    getrandom::fill(dst).map_err(|_| Errno::IO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::WasiConfig;
    use crate::interrupt::Interrupt;

    fn ctx() -> WasiCtx {
        let cfg = WasiConfig {
            args: vec!["p".into(), "ab".into()],
            env: vec![("K".into(), "v".into())],
            preopens: vec![],
            listeners: vec![],
        };
        WasiCtx::new(cfg, Interrupt::new()).unwrap()
    }

    #[test]
    fn args_layout_matches_libc_expectations() {
        let c = ctx();
        let mut buf = vec![0u8; 64];
        let mut m = Mem(&mut buf);
        c.args_sizes_get(&mut m, 0, 4).unwrap();
        assert_eq!((m.u32(0).unwrap(), m.u32(4).unwrap()), (2, 5));
        c.args_get(&mut m, 8, 32).unwrap();
        assert_eq!(m.u32(8).unwrap(), 32);
        assert_eq!(m.u32(12).unwrap(), 34);
        assert_eq!(m.slice(32, 5).unwrap(), b"p\0ab\0");
        c.environ_get(&mut m, 16, 48).unwrap();
        assert_eq!(m.slice(48, 4).unwrap(), b"K=v\0");
        assert_eq!(c.args_get(&mut m, 8, 62), Err(Errno::FAULT));
    }

    #[test]
    fn clocks() {
        let c = ctx();
        let a = c.clock_now(clockid::MONOTONIC).unwrap();
        let b = c.clock_now(clockid::MONOTONIC).unwrap();
        assert!(b >= a);
        assert!(c.clock_now(clockid::REALTIME).unwrap() > 1_600_000_000 * 1_000_000_000);
        assert!(c.clock_now(clockid::PROCESS_CPUTIME).unwrap() < 60 * 1_000_000_000);
        assert_eq!(c.clock_now(9), Err(Errno::INVAL));
    }
}
