//! The OS-layer part of a snapshot, as plain serialisable data.
//!
//! Exists because a snapshot taken on one machine must rebuild the guest's
//! view of the OS on another (different ISA, different host paths). Nothing
//! here names a host path or a host fd: files are recorded by preopen index +
//! path relative to that preopen, stdio as stdio, sockets as virtual
//! connections ([`NetState`]). `encode` prefixes a version byte so the format
//! can evolve; `decode` treats its input as untrusted and still reads
//! version 1 (before sockets).

use crate::net::{NetState, MAX_BUFFERED};
use serde::{Deserialize, Serialize};

/// Version byte written by [`OsState::encode`].
pub const OS_STATE_VERSION: u8 = 2;

/// Largest encoded state [`OsState::decode`] accepts: 16 MiB of fd table and
/// the connection buffers at their limit (768 MiB, under the snapshot's
/// 1 GiB for all non-memory sections).
pub const MAX_ENCODED_LEN: usize = (16 << 20) + MAX_BUFFERED as usize;

/// Everything the guest can observe of the OS layer, as plain data.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct OsState {
    /// Program arguments (argv).
    pub args: Vec<String>,
    /// Environment variables, in order.
    pub env: Vec<(String, String)>,
    /// Guest paths of the preopened directories; [`FdKind`] refers to them by index.
    pub preopens: Vec<String>,
    /// The fd table, sorted by fd number.
    pub fds: Vec<FdState>,
    /// The guest's monotonic clock reading at save time (ns).
    pub monotonic_ns: u64,
    /// The monotonic reading when the program started; cputime clocks count from it.
    pub start_monotonic_ns: u64,
    /// Listeners and connections (empty for a program without sockets).
    pub net: NetState,
}

/// Version 1 of [`OsState`], before sockets.
#[derive(Deserialize)]
struct OsStateV1 {
    args: Vec<String>,
    env: Vec<(String, String)>,
    preopens: Vec<String>,
    fds: Vec<FdState>,
    monotonic_ns: u64,
    start_monotonic_ns: u64,
}

/// One entry of the fd table.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FdState {
    /// The guest's file descriptor number.
    pub fd: u32,
    /// What the descriptor refers to.
    pub kind: FdKind,
    /// Rights the fd carries (`fs_rights_base`).
    pub rights_base: u64,
    /// Rights fds opened through it may carry (`fs_rights_inheriting`).
    pub rights_inheriting: u64,
    /// `fdflags` currently set (APPEND, NONBLOCK, ...).
    pub fdflags: u16,
}

/// What an fd refers to, in host-independent terms.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum FdKind {
    /// The host's standard input.
    Stdin,
    /// The host's standard output.
    Stdout,
    /// The host's standard error.
    Stderr,
    /// The root of preopen number `preopen`.
    PreopenDir {
        /// Index into [`OsState::preopens`].
        preopen: u32,
    },
    /// A directory opened by `path_open` below a preopen.
    Dir {
        /// Index into [`OsState::preopens`].
        preopen: u32,
        /// Path relative to the preopen root, as the guest spelled it.
        path: String,
    },
    /// A regular file (or other non-directory) opened below a preopen.
    File {
        /// Index into [`OsState::preopens`].
        preopen: u32,
        /// Path relative to the preopen root, as the guest spelled it.
        path: String,
        /// The `oflags` used at open time (CREAT/TRUNC/EXCL are not replayed).
        oflags: u16,
        /// Opened for reading.
        read: bool,
        /// Opened for writing.
        write: bool,
        /// File offset at save time.
        offset: u64,
    },
    /// A listening socket (version 2).
    Listener {
        /// Index into [`NetState::listeners`].
        listener: u32,
    },
    /// An accepted connection (version 2).
    Socket {
        /// Its id in [`NetState::conns`].
        conn: u64,
    },
}

/// Why [`OsState::decode`] refused its input.
#[derive(Debug, thiserror::Error)]
pub enum StateDecodeError {
    /// No bytes at all.
    #[error("OS state is empty: the snapshot section is missing or was truncated")]
    Empty,
    /// Input larger than [`MAX_ENCODED_LEN`].
    #[error(
        "OS state is {0} bytes, over the {MAX_ENCODED_LEN}-byte limit: the snapshot is corrupt"
    )]
    TooLarge(usize),
    /// Written by a different format version.
    #[error("OS state version {found} is not supported (this build reads versions 1 to {OS_STATE_VERSION}); restore with a matching roam")]
    UnsupportedVersion {
        /// The version byte found.
        found: u8,
    },
    /// The body is not valid postcard for [`OsState`].
    #[error("OS state body is malformed: {0}; the snapshot is corrupt or truncated")]
    Malformed(#[from] postcard::Error),
    /// Bytes left over after the state.
    #[error("OS state has {0} trailing bytes; the snapshot is corrupt")]
    TrailingBytes(usize),
    /// Decoded, but internally inconsistent.
    #[error("OS state is inconsistent: {0}; the snapshot is corrupt")]
    Invalid(String),
}

impl OsState {
    /// Leading version byte + postcard body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![OS_STATE_VERSION];
        // Serialising plain owned data into a Vec cannot fail.
        let body = postcard::to_allocvec(self).unwrap_or_default();
        out.extend_from_slice(&body);
        out
    }

    /// Parse untrusted bytes; every failure is a precise error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<OsState, StateDecodeError> {
        let (&version, body) = bytes.split_first().ok_or(StateDecodeError::Empty)?;
        if bytes.len() > MAX_ENCODED_LEN {
            return Err(StateDecodeError::TooLarge(bytes.len()));
        }
        let (state, rest) = match version {
            1 => {
                let (v1, rest): (OsStateV1, _) = postcard::take_from_bytes(body)?;
                let state = OsState {
                    args: v1.args,
                    env: v1.env,
                    preopens: v1.preopens,
                    fds: v1.fds,
                    monotonic_ns: v1.monotonic_ns,
                    start_monotonic_ns: v1.start_monotonic_ns,
                    net: NetState::default(),
                };
                (state, rest)
            }
            OS_STATE_VERSION => postcard::take_from_bytes::<OsState>(body)?,
            found => return Err(StateDecodeError::UnsupportedVersion { found }),
        };
        if !rest.is_empty() {
            return Err(StateDecodeError::TrailingBytes(rest.len()));
        }
        state.validate()?;
        Ok(state)
    }

    /// Invariants `restore` relies on.
    fn validate(&self) -> Result<(), StateDecodeError> {
        let bad = |m: String| Err(StateDecodeError::Invalid(m));
        for w in self.fds.windows(2) {
            if w[0].fd >= w[1].fd {
                return bad(format!("fd {} listed out of order or twice", w[1].fd));
            }
        }
        for f in &self.fds {
            let p = match &f.kind {
                FdKind::PreopenDir { preopen }
                | FdKind::Dir { preopen, .. }
                | FdKind::File { preopen, .. } => *preopen,
                _ => continue,
            };
            if p as usize >= self.preopens.len() {
                return bad(format!(
                    "fd {} refers to preopen {p}, which does not exist",
                    f.fd
                ));
            }
        }
        if self.start_monotonic_ns > self.monotonic_ns {
            return bad("program start lies after the save time".into());
        }
        self.net.validate().map_err(StateDecodeError::Invalid)?;
        self.validate_socket_fds()
    }

    /// Every socket fd names a live connection or open listener, and every
    /// accepted, unclosed connection and open listener has exactly one fd.
    fn validate_socket_fds(&self) -> Result<(), StateDecodeError> {
        let bad = |m: String| Err(StateDecodeError::Invalid(m));
        let mut listener_fds = vec![0u32; self.net.listeners.len()];
        let mut conn_fds = vec![0u32; self.net.conns.len()];
        for f in &self.fds {
            match f.kind {
                FdKind::Listener { listener } => {
                    let ok = self
                        .net
                        .listeners
                        .get(listener as usize)
                        .is_some_and(|l| l.open);
                    if !ok {
                        return bad(format!(
                            "fd {} refers to listener {listener}, which is not open",
                            f.fd
                        ));
                    }
                    listener_fds[listener as usize] += 1;
                }
                FdKind::Socket { conn } => {
                    let at = self.net.find(conn).filter(|&at| {
                        let c = &self.net.conns[at];
                        c.accepted && !c.closed
                    });
                    let Some(at) = at else {
                        return bad(format!(
                            "fd {} refers to connection {conn}, which is not an open accepted connection",
                            f.fd
                        ));
                    };
                    conn_fds[at] += 1;
                }
                _ => {}
            }
        }
        for (i, l) in self.net.listeners.iter().enumerate() {
            if l.open && listener_fds[i] != 1 {
                return bad(format!(
                    "open listener {i} has {} fds, not exactly one",
                    listener_fds[i]
                ));
            }
        }
        for (at, c) in self.net.conns.iter().enumerate() {
            let want = u32::from(c.accepted && !c.closed);
            if conn_fds[at] != want {
                return bad(format!(
                    "connection {} has {} fds, expected {want}",
                    c.conn, conn_fds[at]
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> OsState {
        OsState {
            args: vec!["prog".into(), "x".into()],
            env: vec![("A".into(), "1".into())],
            preopens: vec!["/data".into()],
            fds: vec![
                FdState {
                    fd: 0,
                    kind: FdKind::Stdin,
                    rights_base: 2,
                    rights_inheriting: 0,
                    fdflags: 0,
                },
                FdState {
                    fd: 3,
                    kind: FdKind::PreopenDir { preopen: 0 },
                    rights_base: 9,
                    rights_inheriting: 9,
                    fdflags: 0,
                },
                FdState {
                    fd: 4,
                    kind: FdKind::File {
                        preopen: 0,
                        path: "a/b.txt".into(),
                        oflags: 1,
                        read: true,
                        write: true,
                        offset: 17,
                    },
                    rights_base: 66,
                    rights_inheriting: 0,
                    fdflags: 1,
                },
            ],
            monotonic_ns: 1_000,
            start_monotonic_ns: 10,
            net: NetState::default(),
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let s = sample();
        let b = s.encode();
        assert_eq!(b[0], OS_STATE_VERSION);
        assert_eq!(OsState::decode(&b).unwrap(), s);
    }

    #[test]
    fn precise_errors() {
        let b = sample().encode();
        assert!(matches!(OsState::decode(&[]), Err(StateDecodeError::Empty)));
        let mut v = b.clone();
        v[0] = 9;
        assert!(matches!(
            OsState::decode(&v),
            Err(StateDecodeError::UnsupportedVersion { found: 9 })
        ));
        let mut v = b.clone();
        v.push(0);
        assert!(matches!(
            OsState::decode(&v),
            Err(StateDecodeError::TrailingBytes(1))
        ));
        assert!(matches!(
            OsState::decode(&b[..b.len() - 1]),
            Err(StateDecodeError::Malformed(_))
        ));
        let mut s = sample();
        s.fds[2].kind = FdKind::Dir {
            preopen: 5,
            path: "x".into(),
        };
        assert!(matches!(
            OsState::decode(&s.encode()),
            Err(StateDecodeError::Invalid(_))
        ));
        let mut s = sample();
        s.fds.swap(0, 1);
        assert!(matches!(
            OsState::decode(&s.encode()),
            Err(StateDecodeError::Invalid(_))
        ));
    }

    /// A state with a listener fd, an accepted connection's fd, and a
    /// connection waiting in the backlog.
    fn with_net() -> OsState {
        let mut s = sample();
        s.net = crate::net::tests::sample_state();
        let fd = |fd, kind| FdState {
            fd,
            kind,
            rights_base: 0,
            rights_inheriting: 0,
            fdflags: 0,
        };
        s.fds.push(fd(5, FdKind::Listener { listener: 0 }));
        s.fds.push(fd(6, FdKind::Listener { listener: 1 }));
        s.fds.push(fd(7, FdKind::Socket { conn: 7 }));
        s
    }

    #[test]
    fn net_state_round_trips_and_is_cross_checked() {
        let s = with_net();
        assert_eq!(OsState::decode(&s.encode()).unwrap(), s);
        let invalid = |f: &dyn Fn(&mut OsState), want: &str| {
            let mut t = with_net();
            f(&mut t);
            let e = OsState::decode(&t.encode()).unwrap_err();
            assert!(
                matches!(&e, StateDecodeError::Invalid(m) if m.contains(want)),
                "expected {want:?}: {e}"
            );
        };
        invalid(
            &|t| t.fds[5].kind = FdKind::Socket { conn: 8 },
            "not an open accepted",
        );
        invalid(
            &|t| t.fds[5].kind = FdKind::Socket { conn: 99 },
            "not an open accepted",
        );
        invalid(
            &|t| t.fds[3].kind = FdKind::Listener { listener: 9 },
            "not open",
        );
        invalid(
            &|t| t.fds[4].kind = FdKind::Listener { listener: 0 },
            "fds, not exactly one",
        );
        invalid(&|t| drop(t.fds.pop()), "expected 1");
        invalid(&|t| t.net.conns[0].closed = true, "not an open accepted");
        invalid(&|t| t.net.window = 0, "window");
    }

    #[test]
    fn version_1_states_still_decode() {
        #[derive(Serialize)]
        struct V1<'a> {
            args: &'a [String],
            env: &'a [(String, String)],
            preopens: &'a [String],
            fds: &'a [FdState],
            monotonic_ns: u64,
            start_monotonic_ns: u64,
        }
        let s = sample();
        let mut b = vec![1u8];
        b.extend(
            postcard::to_allocvec(&V1 {
                args: &s.args,
                env: &s.env,
                preopens: &s.preopens,
                fds: &s.fds,
                monotonic_ns: s.monotonic_ns,
                start_monotonic_ns: s.start_monotonic_ns,
            })
            .unwrap(),
        );
        assert_eq!(OsState::decode(&b).unwrap(), s);
    }

    #[test]
    fn garbage_and_truncation_never_panic() {
        let good = sample().encode();
        for n in 0..good.len() {
            assert!(OsState::decode(&good[..n]).is_err(), "prefix {n} accepted");
        }
        // Deterministic xorshift so failures reproduce.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..4000 {
            let len = (next() % 96) as usize;
            let mut v: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if i % 2 == 0 && !v.is_empty() {
                v[0] = OS_STATE_VERSION;
            }
            if i % 4 == 1 {
                // Mutate a valid encoding instead of pure noise.
                v = good.clone();
                let at = (next() as usize) % v.len();
                v[at] = next() as u8;
            }
            let _ = OsState::decode(&v);
        }
    }
}
