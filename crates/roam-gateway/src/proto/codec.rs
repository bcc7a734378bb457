//! Message bodies: fixed little-endian fields, strings as a u16 length and
//! UTF-8, data as the rest of the payload.
//!
//! | type | message | body |
//! |-----:|---------|------|
//! | 0x01 | `Hello` | version u16, window u64, node str |
//! | 0x02 | `Serve` | service str, cell str, generation u64, n u32, n × (conn u64, rx_next u64, tx_from u64) |
//! | 0x03 | `Hold` | service str, cell str, generation u64 |
//! | 0x04 | `Unserve` | service str, cell str, generation u64 |
//! | 0x05 | `Data` (node) | conn u64, offset u64, bytes (rest, ≤ 64 KiB) |
//! | 0x06 | `Consumed` | conn u64, offset u64 |
//! | 0x07 | `Shutdown` | conn u64, offset u64 |
//! | 0x08 | `Closed` | conn u64 |
//! | 0x09 | `Ping` (protocol 3) | nonce u64 |
//! | 0x81 | `Welcome` | version u16, window u64 |
//! | 0x82 | `Refused` | reason str |
//! | 0x83 | `Open` | service str, conn u64, peer str |
//! | 0x84 | `Data` (gateway) | conn u64, offset u64, bytes (rest, ≤ 64 KiB) |
//! | 0x85 | `Eof` | conn u64, offset u64 |
//! | 0x86 | `Gone` | conn u64 |
//! | 0x87 | `Delivered` | conn u64, offset u64 |
//! | 0x88 | `Stale` (protocol 2) | service str, cell str, generation u64, current u64 |
//! | 0x89 | `Pong` (protocol 3) | nonce u64, gateway str (a node name's rules, ≤ 64 bytes) |
//!
//! Every service, cell and node name is checked with `roam_wire::ident`
//! on receipt; windows must lie in [`MIN_WINDOW`]..=[`MAX_WINDOW`]; a
//! message with bytes left over is refused.

use roam_wire::ident::{self, InvalidIdent};

use super::frame::{put_frame, put_frame_parts};
use super::*;

/// Why a frame's payload is not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The type byte names no message of this direction.
    #[error("unknown message type {0:#04x} for this direction; the peer speaks another protocol version")]
    UnknownType(u8),
    /// The payload ends inside a field.
    #[error("{msg} message ends inside its {field} field")]
    Truncated {
        /// The message.
        msg: &'static str,
        /// The field.
        field: &'static str,
    },
    /// Bytes follow the last field.
    #[error("{msg} message has {extra} bytes after its last field")]
    Trailing {
        /// The message.
        msg: &'static str,
        /// How many.
        extra: usize,
    },
    /// A string is not UTF-8.
    #[error("{msg} message: the {field} field is not UTF-8")]
    NotUtf8 {
        /// The message.
        msg: &'static str,
        /// The field.
        field: &'static str,
    },
    /// A length is over its limit.
    #[error("{msg} message: the {field} field is {len} long, over the limit of {max}")]
    TooLong {
        /// The message.
        msg: &'static str,
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An identifier fails its check.
    #[error("{msg} message")]
    Ident {
        /// The message.
        msg: &'static str,
        /// What is wrong.
        #[source]
        source: InvalidIdent,
    },
    /// A window outside the accepted range.
    #[error("{msg} message: window {window} is outside {MIN_WINDOW}..={MAX_WINDOW} bytes")]
    Window {
        /// The message.
        msg: &'static str,
        /// The window.
        window: u64,
    },
    /// Offset plus length passes 2^64.
    #[error("{msg} message: offset {offset} plus {len} bytes overflows the stream")]
    Overflow {
        /// The message.
        msg: &'static str,
        /// The offset.
        offset: u64,
        /// The length.
        len: usize,
    },
    /// Text with control characters.
    #[error("{msg} message: the {field} field contains control characters")]
    Control {
        /// The message.
        msg: &'static str,
        /// The field.
        field: &'static str,
    },
}

/// Why a message cannot be encoded (a value over a protocol limit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot encode {msg}: {field} is {len} long, over the protocol limit of {max}")]
pub struct EncodeError {
    /// The message.
    pub msg: &'static str,
    /// The field.
    pub field: &'static str,
    /// Its length.
    pub len: usize,
    /// The limit.
    pub max: usize,
}

struct Reader<'a> {
    msg: &'static str,
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError::Truncated {
                msg: self.msg,
                field,
            });
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u16(&mut self, f: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, f)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, f: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, f)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, f: &'static str) -> Result<u64, DecodeError> {
        let b = self.take(8, f)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn str(&mut self, f: &'static str, max: usize) -> Result<String, DecodeError> {
        let len = usize::from(self.u16(f)?);
        if len > max {
            return Err(DecodeError::TooLong {
                msg: self.msg,
                field: f,
                len,
                max,
            });
        }
        let b = self.take(len, f)?;
        let s = std::str::from_utf8(b).map_err(|_| DecodeError::NotUtf8 {
            msg: self.msg,
            field: f,
        })?;
        if s.chars().any(char::is_control) {
            return Err(DecodeError::Control {
                msg: self.msg,
                field: f,
            });
        }
        Ok(s.to_string())
    }
    fn ident(
        &mut self,
        f: &'static str,
        max: usize,
        check: fn(&str) -> Result<(), InvalidIdent>,
    ) -> Result<String, DecodeError> {
        let s = self.str(f, max)?;
        check(&s).map_err(|source| DecodeError::Ident {
            msg: self.msg,
            source,
        })?;
        Ok(s)
    }
    fn service(&mut self) -> Result<String, DecodeError> {
        self.ident("service", ident::MAX_IDENT_LEN, ident::check_service_name)
    }
    fn cell(&mut self) -> Result<String, DecodeError> {
        self.ident("cell", ident::MAX_IDENT_LEN, ident::check_cell_id)
    }
    fn window(&mut self) -> Result<u64, DecodeError> {
        let window = self.u64("window")?;
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&window) {
            return Err(DecodeError::Window {
                msg: self.msg,
                window,
            });
        }
        Ok(window)
    }
    fn data(&mut self) -> Result<(u64, u64, Vec<u8>), DecodeError> {
        let conn = self.u64("conn")?;
        let offset = self.u64("offset")?;
        let len = self.b.len();
        if len > MAX_DATA {
            return Err(DecodeError::TooLong {
                msg: self.msg,
                field: "bytes",
                len,
                max: MAX_DATA,
            });
        }
        if offset.checked_add(len as u64).is_none() {
            return Err(DecodeError::Overflow {
                msg: self.msg,
                offset,
                len,
            });
        }
        let bytes = std::mem::take(&mut self.b).to_vec();
        Ok((conn, offset, bytes))
    }
    fn end<T>(self, v: T) -> Result<T, DecodeError> {
        if self.b.is_empty() {
            Ok(v)
        } else {
            Err(DecodeError::Trailing {
                msg: self.msg,
                extra: self.b.len(),
            })
        }
    }
}

struct Writer {
    msg: &'static str,
    b: Vec<u8>,
}

impl Writer {
    fn new(msg: &'static str) -> Writer {
        Writer { msg, b: Vec::new() }
    }
    fn u16(&mut self, v: u16) {
        self.b.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.b.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.b.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, field: &'static str, s: &str, max: usize) -> Result<(), EncodeError> {
        if s.len() > max {
            return Err(EncodeError {
                msg: self.msg,
                field,
                len: s.len(),
                max,
            });
        }
        self.u16(s.len() as u16);
        self.b.extend_from_slice(s.as_bytes());
        Ok(())
    }
    fn bytes(&mut self, v: &[u8]) -> Result<(), EncodeError> {
        if v.len() > MAX_DATA {
            return Err(EncodeError {
                msg: self.msg,
                field: "bytes",
                len: v.len(),
                max: MAX_DATA,
            });
        }
        self.b.extend_from_slice(v);
        Ok(())
    }
}

fn name_fields(
    w: &mut Writer,
    service: &str,
    cell: &str,
    generation: u64,
) -> Result<(), EncodeError> {
    w.str("service", service, ident::MAX_IDENT_LEN)?;
    w.str("cell", cell, ident::MAX_IDENT_LEN)?;
    w.u64(generation);
    Ok(())
}

impl ToGateway {
    /// The message's name, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            ToGateway::Hello(_) => "Hello",
            ToGateway::Serve { .. } => "Serve",
            ToGateway::Hold { .. } => "Hold",
            ToGateway::Unserve { .. } => "Unserve",
            ToGateway::Data { .. } => "Data",
            ToGateway::Consumed { .. } => "Consumed",
            ToGateway::Shutdown { .. } => "Shutdown",
            ToGateway::Closed { .. } => "Closed",
            ToGateway::Ping { .. } => "Ping",
        }
    }

    /// Append this message as one frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let mut w = Writer::new(self.name());
        let kind = match self {
            ToGateway::Hello(h) => {
                w.u16(h.version);
                w.u64(h.window);
                w.str("node", &h.node, ident::MAX_NODE_NAME_LEN)?;
                0x01
            }
            ToGateway::Serve {
                service,
                cell,
                generation,
                conns,
            } => {
                name_fields(&mut w, service, cell, *generation)?;
                if conns.len() > MAX_RESUME {
                    return Err(EncodeError {
                        msg: "Serve",
                        field: "conns",
                        len: conns.len(),
                        max: MAX_RESUME,
                    });
                }
                w.u32(conns.len() as u32);
                for c in conns {
                    w.u64(c.conn);
                    w.u64(c.rx_next);
                    w.u64(c.tx_from);
                }
                0x02
            }
            ToGateway::Hold {
                service,
                cell,
                generation,
            } => {
                name_fields(&mut w, service, cell, *generation)?;
                0x03
            }
            ToGateway::Unserve {
                service,
                cell,
                generation,
            } => {
                name_fields(&mut w, service, cell, *generation)?;
                0x04
            }
            ToGateway::Data {
                conn,
                offset,
                bytes,
            } => {
                w.u64(*conn);
                w.u64(*offset);
                w.bytes(bytes)?;
                0x05
            }
            ToGateway::Consumed { conn, offset } => {
                w.u64(*conn);
                w.u64(*offset);
                0x06
            }
            ToGateway::Shutdown { conn, offset } => {
                w.u64(*conn);
                w.u64(*offset);
                0x07
            }
            ToGateway::Closed { conn } => {
                w.u64(*conn);
                0x08
            }
            ToGateway::Ping { nonce } => {
                w.u64(*nonce);
                0x09
            }
        };
        put_frame(out, kind, &w.b);
        Ok(())
    }

    /// Decode a frame's payload of type `kind`.
    pub fn decode(kind: u8, payload: &[u8]) -> Result<ToGateway, DecodeError> {
        let name = match kind {
            0x01 => "Hello",
            0x02 => "Serve",
            0x03 => "Hold",
            0x04 => "Unserve",
            0x05 => "Data",
            0x06 => "Consumed",
            0x07 => "Shutdown",
            0x08 => "Closed",
            0x09 => "Ping",
            k => return Err(DecodeError::UnknownType(k)),
        };
        let mut r = Reader {
            msg: name,
            b: payload,
        };
        let m = match kind {
            0x01 => {
                let version = r.u16("version")?;
                let window = r.window()?;
                let node = r.ident("node", ident::MAX_NODE_NAME_LEN, ident::check_node_name)?;
                ToGateway::Hello(Hello {
                    version,
                    node,
                    window,
                })
            }
            0x02 => {
                let service = r.service()?;
                let cell = r.cell()?;
                let generation = r.u64("generation")?;
                let n = r.u32("conns")? as usize;
                if n > MAX_RESUME {
                    return Err(DecodeError::TooLong {
                        msg: name,
                        field: "conns",
                        len: n,
                        max: MAX_RESUME,
                    });
                }
                // Every entry is 24 bytes: a count the payload cannot hold
                // fails here, before the vector is allocated.
                if r.b.len() < n * 24 {
                    return Err(DecodeError::Truncated {
                        msg: name,
                        field: "conns",
                    });
                }
                let mut conns = Vec::with_capacity(n);
                for _ in 0..n {
                    conns.push(ConnResume {
                        conn: r.u64("conn")?,
                        rx_next: r.u64("rx_next")?,
                        tx_from: r.u64("tx_from")?,
                    });
                }
                ToGateway::Serve {
                    service,
                    cell,
                    generation,
                    conns,
                }
            }
            0x03 | 0x04 => {
                let service = r.service()?;
                let cell = r.cell()?;
                let generation = r.u64("generation")?;
                if kind == 0x03 {
                    ToGateway::Hold {
                        service,
                        cell,
                        generation,
                    }
                } else {
                    ToGateway::Unserve {
                        service,
                        cell,
                        generation,
                    }
                }
            }
            0x05 => {
                let (conn, offset, bytes) = r.data()?;
                ToGateway::Data {
                    conn,
                    offset,
                    bytes,
                }
            }
            0x06 => ToGateway::Consumed {
                conn: r.u64("conn")?,
                offset: r.u64("offset")?,
            },
            0x07 => ToGateway::Shutdown {
                conn: r.u64("conn")?,
                offset: r.u64("offset")?,
            },
            0x08 => ToGateway::Closed {
                conn: r.u64("conn")?,
            },
            _ => ToGateway::Ping {
                nonce: r.u64("nonce")?,
            },
        };
        r.end(m)
    }
}

impl ToNode {
    /// The message's name, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            ToNode::Welcome { .. } => "Welcome",
            ToNode::Refused { .. } => "Refused",
            ToNode::Open { .. } => "Open",
            ToNode::Data { .. } => "Data",
            ToNode::Eof { .. } => "Eof",
            ToNode::Gone { .. } => "Gone",
            ToNode::Delivered { .. } => "Delivered",
            ToNode::Stale { .. } => "Stale",
            ToNode::Pong { .. } => "Pong",
        }
    }

    /// Append this message as one frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let mut w = Writer::new(self.name());
        let kind = match self {
            ToNode::Welcome { version, window } => {
                w.u16(*version);
                w.u64(*window);
                0x81
            }
            ToNode::Refused { reason } => {
                w.str("reason", reason, MAX_REASON_LEN)?;
                0x82
            }
            ToNode::Open {
                service,
                conn,
                peer,
            } => {
                w.str("service", service, ident::MAX_IDENT_LEN)?;
                w.u64(*conn);
                w.str("peer", peer, MAX_PEER_LEN)?;
                0x83
            }
            ToNode::Data {
                conn,
                offset,
                bytes,
            } => {
                w.u64(*conn);
                w.u64(*offset);
                w.bytes(bytes)?;
                0x84
            }
            ToNode::Eof { conn, offset } => {
                w.u64(*conn);
                w.u64(*offset);
                0x85
            }
            ToNode::Gone { conn } => {
                w.u64(*conn);
                0x86
            }
            ToNode::Delivered { conn, offset } => {
                w.u64(*conn);
                w.u64(*offset);
                0x87
            }
            ToNode::Stale {
                service,
                cell,
                generation,
                current,
            } => {
                w.str("service", service, ident::MAX_IDENT_LEN)?;
                w.str("cell", cell, ident::MAX_IDENT_LEN)?;
                w.u64(*generation);
                w.u64(*current);
                0x88
            }
            ToNode::Pong { nonce, gateway } => {
                w.u64(*nonce);
                w.str("gateway", gateway, MAX_GATEWAY_ID_LEN)?;
                0x89
            }
        };
        put_frame(out, kind, &w.b);
        Ok(())
    }

    /// Append a `Data` frame whose bytes are `a` then `b`, as
    /// [`ToNode::encode`] would for `Data { conn, offset, a ++ b }`,
    /// without gathering them first (a ring buffer's two halves).
    pub fn encode_data(
        out: &mut Vec<u8>,
        conn: ConnId,
        offset: u64,
        a: &[u8],
        b: &[u8],
    ) -> Result<(), EncodeError> {
        let len = a.len() + b.len();
        if len > MAX_DATA {
            return Err(EncodeError {
                msg: "Data",
                field: "bytes",
                len,
                max: MAX_DATA,
            });
        }
        let mut head = [0u8; 16];
        head[..8].copy_from_slice(&conn.to_le_bytes());
        head[8..].copy_from_slice(&offset.to_le_bytes());
        put_frame_parts(out, 0x84, &[&head, a, b]);
        Ok(())
    }

    /// Decode a frame's payload of type `kind`.
    pub fn decode(kind: u8, payload: &[u8]) -> Result<ToNode, DecodeError> {
        let name = match kind {
            0x81 => "Welcome",
            0x82 => "Refused",
            0x83 => "Open",
            0x84 => "Data",
            0x85 => "Eof",
            0x86 => "Gone",
            0x87 => "Delivered",
            0x88 => "Stale",
            0x89 => "Pong",
            k => return Err(DecodeError::UnknownType(k)),
        };
        let mut r = Reader {
            msg: name,
            b: payload,
        };
        let m = match kind {
            0x81 => ToNode::Welcome {
                version: r.u16("version")?,
                window: r.window()?,
            },
            0x82 => ToNode::Refused {
                reason: r.str("reason", MAX_REASON_LEN)?,
            },
            0x83 => ToNode::Open {
                service: r.service()?,
                conn: r.u64("conn")?,
                peer: r.str("peer", MAX_PEER_LEN)?,
            },
            0x84 => {
                let (conn, offset, bytes) = r.data()?;
                ToNode::Data {
                    conn,
                    offset,
                    bytes,
                }
            }
            0x85 => ToNode::Eof {
                conn: r.u64("conn")?,
                offset: r.u64("offset")?,
            },
            0x86 => ToNode::Gone {
                conn: r.u64("conn")?,
            },
            0x87 => ToNode::Delivered {
                conn: r.u64("conn")?,
                offset: r.u64("offset")?,
            },
            0x88 => ToNode::Stale {
                service: r.service()?,
                cell: r.cell()?,
                generation: r.u64("generation")?,
                current: r.u64("current")?,
            },
            _ => ToNode::Pong {
                nonce: r.u64("nonce")?,
                gateway: r.ident("gateway", MAX_GATEWAY_ID_LEN, ident::check_node_name)?,
            },
        };
        r.end(m)
    }
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
