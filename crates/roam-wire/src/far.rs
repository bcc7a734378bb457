//! The memory-server messages: a node keeps another node's far pages.
//!
//! Why on the migration channel: a memory server holds a cell's memory, so
//! it must trust its peer exactly as a migration destination does (the
//! cluster's node certificates, the same `Hello`), and the frames, checks
//! and fuzz target are already there. One connection serves one cell; its
//! pages live as long as the connection, so a client that dies leaves
//! nothing behind.
//!
//! ```text
//!   client                         memory server
//!   Hello  ───────────────────────►  Hello
//!   FarOpen { cell, max_pages } ──►  FarOpened { free_pages } | Abort
//!   FarPut(pages)  ───────────────►  FarAck | Abort
//!   FarGet { pages } ─────────────►  FarData(pages) | Abort
//! ```

use serde::{Deserialize, Serialize};

/// Pages in one [`FarPages`] at most (2 MiB of bytes): Netswap's batch of
/// 512, with room.
pub const FAR_BATCH_MAX: usize = 1024;

/// Bytes of one page.
pub const FAR_PAGE: usize = 4096;

/// Open a far-memory space for one cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FarOpen {
    /// The cell's id (checked as an identifier).
    pub cell: String,
    /// Page indices are below this (the cell's memory reservation).
    pub max_pages: u32,
}

/// Smallest local memory of a far-memory cell (64 pages): below it, one
/// fetch batch and one eviction batch would not fit side by side.
pub const FAR_LOCAL_MIN: u64 = 64 * FAR_PAGE as u64;

/// Longest memory-server address a [`FarSpec`] may carry.
pub const FAR_SERVER_MAX: usize = 255;

/// How a cell's memory is split between its node and a memory server,
/// carried in its [`crate::CellSpec`] so that every node it moves to keeps
/// the same split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FarSpec {
    /// Bytes resident on the node at most.
    pub local_memory: u64,
    /// The memory server's control address (`host:port` or URL).
    pub server: String,
    /// Victim choice: `clock` or `random`.
    pub eviction: String,
}

impl FarSpec {
    /// Check what a peer sent: the budget, the eviction policy's name, and
    /// an address of bounded length made of printable ASCII.
    pub fn check(&self) -> Result<(), String> {
        if self.local_memory < FAR_LOCAL_MIN {
            return Err(format!(
                "a local memory of {} bytes is below the minimum of {FAR_LOCAL_MIN}",
                self.local_memory
            ));
        }
        if !matches!(self.eviction.as_str(), "clock" | "random") {
            return Err(format!(
                "unknown eviction policy {:?} (clock, random)",
                self.eviction
            ));
        }
        let printable = self.server.bytes().all(|b| b.is_ascii_graphic());
        if self.server.is_empty() || self.server.len() > FAR_SERVER_MAX || !printable {
            return Err(format!(
                "a memory-server address must be 1 to {FAR_SERVER_MAX} printable ASCII characters"
            ));
        }
        Ok(())
    }
}

/// Pages with their bytes, in the order of `pages`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FarPages {
    /// Page indices.
    pub pages: Vec<u32>,
    /// `pages.len()` pages of [`FAR_PAGE`] bytes.
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

impl FarPages {
    /// Check the sizes agree and the batch is within [`FAR_BATCH_MAX`] and
    /// below `max_pages`.
    pub fn check(&self, max_pages: u32) -> Result<(), String> {
        if self.pages.len() > FAR_BATCH_MAX {
            return Err(format!(
                "{} pages in one message, more than {FAR_BATCH_MAX}",
                self.pages.len()
            ));
        }
        if self.bytes.len() != self.pages.len() * FAR_PAGE {
            return Err(format!(
                "{} bytes for {} pages",
                self.bytes.len(),
                self.pages.len()
            ));
        }
        if let Some(p) = self.pages.iter().find(|&&p| p >= max_pages) {
            return Err(format!("page {p} is beyond the {max_pages} pages opened"));
        }
        Ok(())
    }

    /// The bytes of the `i`-th page.
    pub fn page(&self, i: usize) -> &[u8] {
        &self.bytes[i * FAR_PAGE..(i + 1) * FAR_PAGE]
    }
}

/// Check a page list asked for: within [`FAR_BATCH_MAX`] and below `max_pages`.
pub fn check_far_request(pages: &[u32], max_pages: u32) -> Result<(), String> {
    if pages.len() > FAR_BATCH_MAX {
        return Err(format!(
            "{} pages asked at once, more than {FAR_BATCH_MAX}",
            pages.len()
        ));
    }
    if let Some(p) = pages.iter().find(|&&p| p >= max_pages) {
        return Err(format!("page {p} is beyond the {max_pages} pages opened"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Msg;

    #[test]
    fn far_messages_roundtrip_and_are_checked() {
        let ok = FarPages {
            pages: vec![3, 9],
            bytes: vec![7; 2 * FAR_PAGE],
        };
        assert!(ok.check(10).is_ok());
        assert!(ok.check(9).unwrap_err().contains("page 9 is beyond"));
        let short = FarPages {
            pages: vec![1],
            bytes: vec![0; 100],
        };
        assert!(short
            .check(10)
            .unwrap_err()
            .contains("100 bytes for 1 pages"));
        assert!(check_far_request(&[0; FAR_BATCH_MAX + 1], 10).is_err());
        let spec = FarSpec {
            local_memory: 8 << 20,
            server: "10.0.0.2:7400".into(),
            eviction: "clock".into(),
        };
        assert!(spec.check().is_ok());
        let bad = [
            FarSpec {
                local_memory: FAR_LOCAL_MIN - 1,
                ..spec.clone()
            },
            FarSpec {
                eviction: "lru".into(),
                ..spec.clone()
            },
            FarSpec {
                server: String::new(),
                ..spec.clone()
            },
            FarSpec {
                server: "a b".into(),
                ..spec.clone()
            },
            FarSpec {
                server: "x".repeat(FAR_SERVER_MAX + 1),
                ..spec.clone()
            },
        ];
        for b in bad {
            assert!(b.check().is_err(), "{b:?} passed");
        }
        for m in [
            Msg::FarOpen(FarOpen {
                cell: "c1".into(),
                max_pages: 1 << 20,
            }),
            Msg::FarOpened { free_pages: 5 },
            Msg::FarPut(ok.clone()),
            Msg::FarGet { pages: vec![3] },
            Msg::FarData(ok),
            Msg::FarAck,
        ] {
            assert_eq!(Msg::decode(&m.encode().unwrap()).unwrap(), m);
        }
    }
}
