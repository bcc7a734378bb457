//! The node-to-node migration protocol.
//!
//! Why a crate of its own: these bytes arrive from another machine, so they
//! are untrusted input with a fuzz target of their own, and both ends of a
//! migration (and any future tool that speaks to a node) must agree on them
//! exactly. Nothing here knows about wasmtime or cells.
//!
//! A connection is a sequence of *frames*:
//!
//! ```text
//!   u32 LE  payload length (≤ MAX_FRAME, checked before allocating)
//!   u32 LE  CRC-32 of the payload
//!   payload: one `Msg`, postcard-encoded
//! ```
//!
//! The first frame each way is a [`Hello`] carrying the protocol version and
//! the node's ISA; everything after it is a [`Msg`]. The order of messages in
//! each migration mode is described in `docs/migration.md`.

#![deny(missing_docs)]

mod far;
mod frame;
pub mod ident;
mod msg;

pub use far::{
    check_far_request, FarOpen, FarPages, FarSpec, FAR_BATCH_MAX, FAR_LOCAL_MIN, FAR_PAGE,
    FAR_SERVER_MAX,
};
pub use frame::{read_frame, write_frame, FrameError, FRAME_HEADER, MAX_FRAME};
pub use ident::{IdentKind, InvalidIdent};
pub use msg::{
    Accept, CellSpec, CpuLimits, Features, FileHeader, FileKind, Final, Hello, Mode, Msg, Offer,
    PageKind, CHUNK_MAX, DEFAULT_CPU_WEIGHT, HELLO_MAGIC, MAX_CPU_MAX_MILLICORES, MAX_CPU_WEIGHT,
    MIN_CPU_MAX_MILLICORES, MIN_CPU_WEIGHT, PROTOCOL_VERSION,
};

/// Read one frame and decode the message in it.
pub async fn recv<R: tokio::io::AsyncRead + Unpin>(r: &mut R) -> Result<Msg, FrameError> {
    let payload = read_frame(r).await?;
    Msg::decode(&payload)
}

/// Encode a message and write it as one frame. Returns bytes written.
pub async fn send<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    msg: &Msg,
) -> Result<usize, FrameError> {
    let payload = msg.encode()?;
    write_frame(w, &payload).await
}

/// An error and its causes on one line (`outer: cause: root cause`), for
/// logs and for answers sent to a peer. Both ends of every link report I/O,
/// TLS and decoding errors whose useful part is a cause.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}
