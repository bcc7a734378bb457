//! `poll_oneoff`: clock and fd-readiness subscriptions.
//!
//! Exists because this is where programs sleep and wait for input, i.e. where
//! a checkpoint request most often finds them. Waiting happens in short
//! slices so a request is noticed quickly; when it is, the call returns
//! without writing any event so the guest can re-issue it after a restore.
//! Socket subscriptions are answered from the cell's virtual connections;
//! the backend kicks the interrupt when it brings something, so a waiting
//! poll looks again at once.

use super::fd::{stdin_ready, SLICE};
use super::{Outcome, Round, Wait};
use crate::ctx::{Handle, WasiCtx};
use crate::errno::Errno;
use crate::mem::Mem;
use crate::net::NetHub;
use crate::types::rights;
use std::time::{Duration, Instant};

const SUB_SIZE: u32 = 48;
const EVENT_SIZE: u32 = 32;
/// `eventrwflags::fd_readwrite_hangup`.
const HANGUP: u16 = 1;
/// How often stdin is polled while sockets are waited on too.
const STDIN_SLICE: Duration = Duration::from_millis(10);

/// One event to report: (userdata, errno, type, nbytes, flags).
type Event = (u64, Errno, u8, u64, u16);

#[derive(Debug)]
enum Pending {
    Clock {
        userdata: u64,
        deadline: Instant,
    },
    Stdin,
    /// A socket or listener not ready yet: asked again next round.
    Net,
}

#[derive(Debug, Clone, Copy)]
enum Net {
    Listener(u32),
    Socket(u64),
}

/// The event a socket subscription reports now, if it is ready.
fn net_event(hub: &NetHub, userdata: u64, tag: u8, h: Net) -> Option<Event> {
    match (h, tag) {
        (Net::Listener(li), 1) if hub.listener_ready(li) => {
            Some((userdata, Errno::SUCCESS, tag, 1, 0))
        }
        (Net::Socket(id), _) => {
            let r = hub.readiness(id);
            let flags = if r.hangup { HANGUP } else { 0 };
            match tag {
                1 if r.readable => Some((userdata, Errno::SUCCESS, tag, r.nbytes, flags)),
                2 if r.writable => Some((userdata, Errno::SUCCESS, tag, r.room, flags)),
                _ => None,
            }
        }
        // A listener is never writable.
        _ => None,
    }
}

impl WasiCtx {
    #[cfg(test)]
    /// `poll_oneoff`, waiting in place.
    pub(crate) fn poll_oneoff(
        &mut self,
        mem: &mut Mem,
        inp: u32,
        out: u32,
        n: u32,
        nevents: u32,
    ) -> Outcome {
        self.in_place(|x, r| x.poll_round(mem, inp, out, n, nevents, r))
    }

    /// One round of `poll_oneoff`: every subscription is asked once.
    pub(crate) fn poll_round(
        &mut self,
        mem: &mut Mem,
        inp: u32,
        out: u32,
        n: u32,
        nevents: u32,
        round: Round,
    ) -> Outcome {
        match self.poll_inner(mem, inp, out, n, nevents, round) {
            Ok(o) => o,
            Err(e) => Outcome::Done(e),
        }
    }

    /// Classify one subscription: an immediate event, or something to wait
    /// on. A relative timeout counts from `started`, the call's start.
    fn subscribe(
        &self,
        mem: &Mem,
        at: u32,
        started: Instant,
    ) -> Result<Result<Event, Pending>, Errno> {
        let userdata = mem.u64(at)?;
        let tag = mem.u8(at + 8)?;
        match tag {
            0 => {
                let id = mem.u32(at + 16)?;
                let timeout = mem.u64(at + 24)?;
                let abs = mem.u16(at + 40)? & 1 != 0;
                let Ok(clock_now) = self.clock_now(id) else {
                    return Ok(Ok((userdata, Errno::INVAL, 0, 0, 0)));
                };
                // An absolute time counts from now; one already past
                // counts as due at the call's start, so it never asked to
                // block (what checkpoint-on-block looks at).
                let (from, remaining) = match (abs, timeout.saturating_sub(clock_now)) {
                    (true, 0) => (started, 0),
                    (true, left) => (Instant::now(), left),
                    (false, _) => (started, timeout),
                };
                // Far-future deadlines are capped at a century.
                let dur = Duration::from_nanos(remaining.min(100 * 365 * 86_400 * 1_000_000_000));
                let deadline = from.checked_add(dur).unwrap_or(from);
                Ok(Err(Pending::Clock { userdata, deadline }))
            }
            1 | 2 => {
                let fd = mem.u32(at + 16)?;
                let ev = |e: Errno, nbytes: u64| Ok(Ok((userdata, e, tag, nbytes, 0)));
                let Ok(e) = self.entry(fd) else {
                    return ev(Errno::BADF, 0);
                };
                if e.rights_base & rights::POLL_FD_READWRITE == 0 {
                    return ev(Errno::NOTCAPABLE, 0);
                }
                match (&e.handle, tag) {
                    (Handle::File(f), 1) => {
                        let size = f.metadata().map(|m| m.len()).unwrap_or(0);
                        let pos =
                            rustix::fs::seek(f, rustix::fs::SeekFrom::Current(0)).unwrap_or(0);
                        ev(Errno::SUCCESS, size.saturating_sub(pos))
                    }
                    (Handle::Stdin, 1) if stdin_ready(Duration::ZERO) => ev(Errno::SUCCESS, 1),
                    (Handle::Stdin, 1) => Ok(Err(Pending::Stdin)),
                    (Handle::File(_) | Handle::Stdout | Handle::Stderr, 2) => ev(Errno::SUCCESS, 0),
                    (Handle::Listener(li), _) => self.net_sub(userdata, tag, Net::Listener(*li)),
                    (Handle::Socket(id), _) => self.net_sub(userdata, tag, Net::Socket(*id)),
                    _ => ev(Errno::BADF, 0),
                }
            }
            _ => Err(Errno::INVAL),
        }
    }

    fn net_sub(&self, userdata: u64, tag: u8, h: Net) -> Result<Result<Event, Pending>, Errno> {
        let Some(hub) = &self.net else {
            return Ok(Ok((userdata, Errno::BADF, tag, 0, 0)));
        };
        Ok(match net_event(hub, userdata, tag, h) {
            Some(ev) => Ok(ev),
            None => Err(Pending::Net),
        })
    }

    fn poll_inner(
        &mut self,
        mem: &mut Mem,
        inp: u32,
        out: u32,
        n: u32,
        nevents: u32,
        round: Round,
    ) -> Result<Outcome, Errno> {
        if n == 0 {
            return Err(Errno::INVAL);
        }
        mem.slice(inp, n.checked_mul(SUB_SIZE).ok_or(Errno::FAULT)?)?;
        mem.slice(out, n.checked_mul(EVENT_SIZE).ok_or(Errno::FAULT)?)?;
        mem.slice(nevents, 4)?;
        // Read before the sockets are asked, so no kick is missed.
        let seen = self.interrupt.kicks();
        let mut events = Vec::new();
        let mut pending = Vec::new();
        for i in 0..n {
            match self.subscribe(mem, inp + i * SUB_SIZE, round.started)? {
                Ok(ev) => events.push(ev),
                Err(p) => pending.push(p),
            }
        }
        let now = Instant::now();
        if round.first {
            // Whether the call blocks is decided by what it asked for,
            // before any waiting: a sleep that has already run out by the
            // time it is looked at (a loaded machine, an emulated one)
            // still asked to block.
            let asked_to_wait = pending.iter().any(
                |p| !matches!(p, Pending::Clock { deadline, .. } if *deadline <= round.started),
            );
            if events.is_empty() && asked_to_wait && self.interrupt.on_block() {
                return Ok(Outcome::Suspend);
            }
        }
        for p in &pending {
            if let Pending::Clock { userdata, deadline } = p {
                if *deadline <= now {
                    events.push((*userdata, Errno::SUCCESS, 0, 0, 0));
                }
            }
        }
        if events.is_empty() {
            if self.interrupt.is_requested() {
                return Ok(Outcome::Suspend);
            }
            let earliest = pending
                .iter()
                .filter_map(|p| match p {
                    Pending::Clock { deadline, .. } => {
                        Some(deadline.saturating_duration_since(now))
                    }
                    Pending::Stdin | Pending::Net => None,
                })
                .min();
            let slice = earliest.map_or(SLICE, |d| d.min(SLICE));
            let stdin = pending.iter().any(|p| matches!(p, Pending::Stdin));
            let net = pending.iter().any(|p| matches!(p, Pending::Net));
            return Ok(Outcome::Wait(match (stdin, net) {
                (false, _) => Wait::Kick { seen, slice },
                (true, false) => Wait::Stdin(slice),
                // Sockets are asked again at the next round.
                (true, true) => Wait::Stdin(slice.min(STDIN_SLICE)),
            }));
        }
        for (i, (userdata, err, ty, nbytes, flags)) in events.iter().enumerate() {
            let mut b = [0u8; EVENT_SIZE as usize];
            b[0..8].copy_from_slice(&userdata.to_le_bytes());
            b[8..10].copy_from_slice(&err.0.to_le_bytes());
            b[10] = *ty;
            b[16..24].copy_from_slice(&nbytes.to_le_bytes());
            b[24..26].copy_from_slice(&flags.to_le_bytes());
            mem.write(out + i as u32 * EVENT_SIZE, &b)?;
        }
        mem.put_u32(nevents, events.len() as u32)?;
        Ok(Outcome::Done(Errno::SUCCESS))
    }
}
