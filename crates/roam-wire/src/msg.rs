//! The messages of the migration protocol.
//!
//! Control messages are small postcard structs. Bulk data (module bytes, page
//! batches of the transfer pipeline) rides in `Vec<u8>` fields, bounded by
//! the frame limit; their inner formats are defined by the crates that
//! produce them (`roam-transfer` batches, `roam-snapshot` encodings).
//!
//! Those fields are (de)serialized as bytes (`serde_bytes`), not as a
//! sequence of `u8`: postcard writes both the same way (a varint length,
//! then the bytes), so the wire format is unchanged, but a sequence goes
//! through serde one byte at a time, which made encoding and decoding the
//! most expensive part of moving pages.

use serde::{Deserialize, Serialize};

use crate::frame::FrameError;

/// Protocol version. A node refuses a peer with a different one.
///
/// Version 2: sandbox files and the log travel in bounded chunks
/// ([`Msg::FileEntry`], [`Msg::FileData`], [`Msg::FileRemoved`],
/// [`Msg::LogChunk`]) instead of inside [`Final`], and [`CellSpec`] carries
/// the cell's memory limit.
///
/// Version 3: [`CellSpec`] names the network service the cell serves
/// behind a gateway ([`CellSpec::service`]); its connections travel in the
/// OS-layer state of [`Final`].
///
/// Version 4: the snapshot inside [`Final`] is written in snapshot format
/// 2.0 (chunked pages), which a version-3 node cannot read; the version
/// makes that a clear refusal at `Hello` instead of a failed commit.
///
/// Version 6: [`CellSpec`] carries the cell's CPU settings
/// ([`CellSpec::cpu`]), so a cell keeps its weight and its cap where it
/// moves.
///
/// Version 7: the memory-server messages ([`Msg::FarOpen`] and the rest,
/// `far.rs`), at the end of [`Msg`].
///
/// Version 8: [`CellSpec`] carries a far-memory cell's split
/// ([`CellSpec::far`]), so the cell keeps it on the node it moves to.
pub const PROTOCOL_VERSION: u16 = 8;

/// Most bytes of file data or log in one [`Msg::FileData`] or
/// [`Msg::LogChunk`].
pub const CHUNK_MAX: usize = 1 << 20;

/// First bytes of every [`Hello`]: identifies the protocol.
pub const HELLO_MAGIC: [u8; 8] = *b"ROAMMIG\x01";

/// First message each way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Must equal [`HELLO_MAGIC`].
    pub magic: [u8; 8],
    /// The sender's [`PROTOCOL_VERSION`].
    pub protocol: u16,
    /// The sender's roam version (informational).
    pub roam_version: String,
    /// The sender node's name.
    pub node: String,
    /// The sender's ISA (`x86_64`, `aarch64`, `riscv64`).
    pub isa: String,
    /// What the sender can do.
    pub features: Features,
}

/// Capabilities a node advertises in its [`Hello`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    /// userfaultfd works here: the node can receive post-copy migrations and
    /// track dirty pages by write protection.
    pub userfaultfd: bool,
}

/// How a cell moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Pause, send everything, resume on the destination.
    StopAndCopy,
    /// Send rounds of dirty pages while the cell runs, then pause briefly.
    PreCopy,
    /// Pause, send the execution state, resume on the destination at once and
    /// fetch memory on demand and in the background.
    PostCopy,
}

impl Mode {
    /// The name used on the command line and in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::StopAndCopy => "stop-and-copy",
            Mode::PreCopy => "pre-copy",
            Mode::PostCopy => "post-copy",
        }
    }

    /// Parse a command-line name.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "stop-and-copy" | "stop" => Some(Mode::StopAndCopy),
            "pre-copy" | "precopy" => Some(Mode::PreCopy),
            "post-copy" | "postcopy" => Some(Mode::PostCopy),
            _ => None,
        }
    }
}

/// What a cell is, independent of where it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellSpec {
    /// Cluster-wide id; kept across migrations.
    pub id: String,
    /// BLAKE3 of the prepared module.
    pub module_hash: [u8; 32],
    /// Program name and arguments.
    pub args: Vec<String>,
    /// Environment.
    pub env: Vec<(String, String)>,
    /// Guest paths of the cell's sandbox directories (host paths are chosen
    /// by each node).
    pub dirs: Vec<String>,
    /// Unix milliseconds when the cell was first launched.
    pub launched_unix_ms: u64,
    /// How many migrations the cell has been through.
    pub hops: u32,
    /// The cell's memory limit in bytes (chosen at launch; a destination
    /// refuses a cell whose limit is over its own per-cell maximum).
    pub max_memory: u64,
    /// The network service the cell serves behind a gateway (`roam launch
    /// --service NAME`): the cell has one listener of that label, and every
    /// node it runs on tells its gateway where the service runs. `None`: no
    /// listener.
    pub service: Option<String>,
    /// The cell's ownership generation in the cluster, for a cell placed by
    /// a planner: the destination's ownership transaction names it (see
    /// `docs/control-plane.md`). `None`: no planner knows the cell.
    pub generation: Option<u64>,
    /// The cell's CPU weight and cap, as asked for at launch (`roam launch
    /// --cpu-weight`, `--cpu-max`); what it does not set is the default of
    /// the node it runs on.
    pub cpu: CpuLimits,
    /// Far memory (`roam launch --local-memory`): how much of the cell's
    /// memory stays on its node, and which memory server holds the rest.
    /// `None`: all of it is local.
    pub far: Option<Box<crate::FarSpec>>,
}

/// Smallest [`CpuLimits::weight`] (cgroup v2's `cpu.weight` range).
pub const MIN_CPU_WEIGHT: u32 = 1;
/// Largest [`CpuLimits::weight`].
pub const MAX_CPU_WEIGHT: u32 = 10_000;
/// The weight of a cell that asks for none, on a node with no other
/// default (cgroup v2's default `cpu.weight`).
pub const DEFAULT_CPU_WEIGHT: u32 = 100;
/// Smallest [`CpuLimits::max_millicores`]: 1% of a core (the kernel's
/// smallest CFS quota is 1 ms of a 100 ms period).
pub const MIN_CPU_MAX_MILLICORES: u32 = 10;
/// Largest [`CpuLimits::max_millicores`]: 1024 cores.
pub const MAX_CPU_MAX_MILLICORES: u32 = 1024 * 1000;

/// A cell's CPU settings. Each is the cell's own when set, else the
/// default of the node it runs on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuLimits {
    /// Its share of the CPU relative to the node's other cells, 1 to
    /// 10000 (cgroup v2's `cpu.weight`; 100 is the usual default).
    pub weight: Option<u32>,
    /// Most CPU it may use, in thousandths of a core (500: half a core).
    pub max_millicores: Option<u32>,
}

impl CpuLimits {
    /// Check the values are in range: a peer or an API client may send
    /// anything.
    pub fn check(&self) -> Result<(), String> {
        if let Some(w) = self.weight {
            if !(MIN_CPU_WEIGHT..=MAX_CPU_WEIGHT).contains(&w) {
                return Err(format!(
                    "CPU weight {w} is out of range: give {MIN_CPU_WEIGHT} to {MAX_CPU_WEIGHT}"
                ));
            }
        }
        if let Some(m) = self.max_millicores {
            if !(MIN_CPU_MAX_MILLICORES..=MAX_CPU_MAX_MILLICORES).contains(&m) {
                return Err(format!(
                    "CPU cap of {m} millicores is out of range: give {MIN_CPU_MAX_MILLICORES} \
                     (0.01 core) to {MAX_CPU_MAX_MILLICORES} (1024 cores)"
                ));
            }
        }
        Ok(())
    }
}

/// The source proposes a migration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    /// Id of this migration (for resolving an interrupted commit).
    pub migration_id: String,
    /// The cell.
    pub cell: CellSpec,
    /// Mode.
    pub mode: Mode,
    /// Size of the prepared module in bytes.
    pub module_len: u64,
    /// Current size of linear memory in bytes.
    pub memory_bytes: u64,
}

/// The destination takes the cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accept {
    /// The destination lacks the module; the source sends it.
    pub need_module: bool,
    /// Summary of the destination's chunk store (transfer-pipeline format).
    #[serde(with = "serde_bytes")]
    pub store_summary: Vec<u8>,
}

/// The execution state, sent while the cell is paused, after its files
/// and log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Final {
    /// A `roam-snapshot` encoding with an empty memory image and no files:
    /// globals, unwound stack, OS-layer state.
    #[serde(with = "serde_bytes")]
    pub snapshot: Vec<u8>,
    /// Final size of linear memory in bytes.
    pub memory_bytes: u64,
}

/// One entry of a cell's sandbox directories. A [`FileKind::File`] is
/// followed by [`Msg::FileData`] chunks holding exactly `len` bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileHeader {
    /// Guest path of the sandbox directory the entry is in.
    pub preopen: String,
    /// Path relative to that directory (`/`-separated, no `..`).
    pub path: String,
    /// What it is.
    pub kind: FileKind,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: u64,
}

/// The kind of a [`FileHeader`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    /// A directory.
    Dir,
    /// A regular file of this many bytes.
    File {
        /// Its size.
        len: u64,
    },
    /// A symbolic link.
    Symlink {
        /// Its target, as stored.
        target: String,
    },
}

/// One protocol message (after the [`Hello`] exchange).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Msg {
    /// Handshake.
    Hello(Hello),
    /// Source → destination: proposal.
    Offer(Offer),
    /// Destination → source: yes.
    Accept(Accept),
    /// Either way: no, or stop; the cell stays where it is.
    Abort {
        /// Why, for the user.
        reason: String,
    },
    /// Source → destination: a piece of the prepared module.
    ModuleChunk {
        /// Offset of `bytes` in the module.
        offset: u64,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
    /// Destination → source: the module is compiled and the receiving
    /// instance exists; state may flow.
    Prepared,
    /// Source → destination: linear memory is now this many bytes.
    Grow {
        /// New size.
        bytes: u64,
    },
    /// Source → destination: a transfer-pipeline batch of pages.
    Pages {
        /// The batch.
        #[serde(with = "serde_bytes")]
        batch: Vec<u8>,
    },
    /// Source → destination: the end of a pre-copy round.
    RoundDone {
        /// Round number, from 1.
        round: u32,
        /// Pages sent in the round.
        pages: u64,
    },
    /// Source → destination: a sandbox file-tree entry (new or changed).
    FileEntry(FileHeader),
    /// Source → destination: the next bytes of the file of the last
    /// [`Msg::FileEntry`] (at most [`CHUNK_MAX`]).
    FileData {
        /// The bytes.
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
    /// Source → destination: an entry sent earlier no longer exists.
    FileRemoved {
        /// Guest path of its sandbox directory.
        preopen: String,
        /// Its path relative to that directory.
        path: String,
    },
    /// Source → destination: the next bytes of the cell's output so far
    /// (at most [`CHUNK_MAX`]), in order, sent during the pause.
    LogChunk {
        /// Bytes of earlier output the log dropped (the same in every chunk).
        dropped: u64,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
    /// Source → destination: the paused cell's execution state.
    Final(Box<Final>),
    /// Source → destination (post-copy): kind of every page of the final
    /// memory, one byte each on the wire.
    PageKinds {
        /// The kinds.
        kinds: Vec<PageKind>,
    },
    /// Destination → source: the cell runs here now.
    Running,
    /// Destination → source (post-copy): send these pages first.
    PageRequest {
        /// Page indices.
        pages: Vec<u32>,
    },
    /// Source → destination (post-copy): every data page has been sent.
    PagesDone,
    /// Destination → source (post-copy): every page is present; the source
    /// may drop its copy.
    Complete,
    /// Client → memory server: keep far pages for a cell (`far.rs`).
    FarOpen(crate::FarOpen),
    /// Memory server → client: open; it can take this many more pages.
    FarOpened {
        /// Pages free on the server now.
        free_pages: u64,
    },
    /// Client → memory server: keep these pages, replacing older copies.
    FarPut(crate::FarPages),
    /// Client → memory server: send these pages back.
    FarGet {
        /// Page indices.
        pages: Vec<u32>,
    },
    /// Memory server → client: the pages asked for.
    FarData(crate::FarPages),
    /// Memory server → client: the pages put are kept.
    FarAck,
}

/// What a page of a paused cell's memory holds, as post-copy announces it
/// before the pages themselves travel. Encoded as one byte (0, 1, 2); any
/// other byte fails to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PageKind {
    /// All zero: the destination fills it with zeros.
    Zero,
    /// Equal to the module's initial image: the destination has it.
    Initial,
    /// Written by the program: it travels.
    Data,
}

impl Msg {
    /// Encode with postcard.
    pub fn encode(&self) -> Result<Vec<u8>, FrameError> {
        postcard::to_stdvec(self).map_err(|e| FrameError::Malformed(e.to_string()))
    }

    /// Decode with postcard. Lengths inside are bounded by the frame;
    /// bytes after the message are an error, not ignored.
    pub fn decode(bytes: &[u8]) -> Result<Msg, FrameError> {
        let (msg, rest) =
            postcard::take_from_bytes(bytes).map_err(|e| FrameError::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(FrameError::Malformed(format!(
                "{} bytes after a `{}` message",
                rest.len(),
                Msg::name(&msg)
            )));
        }
        Ok(msg)
    }

    /// A short name for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Hello(_) => "hello",
            Msg::Offer(_) => "offer",
            Msg::Accept(_) => "accept",
            Msg::Abort { .. } => "abort",
            Msg::ModuleChunk { .. } => "module-chunk",
            Msg::Prepared => "prepared",
            Msg::Grow { .. } => "grow",
            Msg::Pages { .. } => "pages",
            Msg::RoundDone { .. } => "round-done",
            Msg::FileEntry(_) => "file-entry",
            Msg::FileData { .. } => "file-data",
            Msg::FileRemoved { .. } => "file-removed",
            Msg::LogChunk { .. } => "log-chunk",
            Msg::Final(_) => "final",
            Msg::PageKinds { .. } => "page-kinds",
            Msg::Running => "running",
            Msg::PageRequest { .. } => "page-request",
            Msg::PagesDone => "pages-done",
            Msg::Complete => "complete",
            Msg::FarOpen(_) => "far-open",
            Msg::FarOpened { .. } => "far-opened",
            Msg::FarPut(_) => "far-put",
            Msg::FarGet { .. } => "far-get",
            Msg::FarData(_) => "far-data",
            Msg::FarAck => "far-ack",
        }
    }
}

impl Hello {
    /// This node's hello.
    pub fn new(node: &str, isa: &str, features: Features) -> Hello {
        Hello {
            magic: HELLO_MAGIC,
            protocol: PROTOCOL_VERSION,
            roam_version: env!("CARGO_PKG_VERSION").to_string(),
            node: node.to_string(),
            isa: isa.to_string(),
            features,
        }
    }

    /// Check a peer's hello: magic and version must match.
    pub fn check(&self) -> Result<(), String> {
        if self.magic != HELLO_MAGIC {
            return Err("the peer does not speak the roam migration protocol".into());
        }
        if self.protocol != PROTOCOL_VERSION {
            return Err(format!(
                "protocol version mismatch: peer {} (roam {}) speaks version {}, this node speaks {}; \
                 run the same roam release on both nodes",
                self.node, self.roam_version, self.protocol, PROTOCOL_VERSION
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_roundtrip() {
        let msgs = vec![
            Msg::Hello(Hello::new("a", "x86_64", Features { userfaultfd: true })),
            Msg::Pages {
                batch: vec![1, 2, 3],
            },
            Msg::Final(Box::new(Final {
                snapshot: vec![9; 10],
                memory_bytes: 65536,
            })),
            Msg::FileEntry(FileHeader {
                preopen: "/data".into(),
                path: "a/b".into(),
                kind: FileKind::File { len: 3 },
                mode: 0o644,
                mtime_ns: 1,
            }),
            Msg::FileData {
                bytes: b"abc".to_vec(),
            },
            Msg::FileRemoved {
                preopen: "/data".into(),
                path: "gone".into(),
            },
            Msg::LogChunk {
                dropped: 7,
                bytes: b"out".to_vec(),
            },
            Msg::PageRequest { pages: vec![1, 7] },
            Msg::Running,
        ];
        for m in msgs {
            assert_eq!(Msg::decode(&m.encode().unwrap()).unwrap(), m);
        }
    }

    /// Bytes fields are written as before `serde_bytes` (a sequence of
    /// `u8`), so nodes of either build understand each other.
    #[test]
    fn bytes_fields_keep_the_wire_format_of_a_sequence() {
        #[derive(Serialize)]
        enum Seq {
            #[allow(dead_code)]
            Pages { batch: Vec<u8> },
        }
        let batch: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let as_seq = postcard::to_stdvec(&Seq::Pages {
            batch: batch.clone(),
        })
        .unwrap();
        let as_bytes = Msg::Pages { batch }.encode().unwrap();
        assert_eq!(as_bytes[1..], as_seq[1..], "the fields differ on the wire");
        assert_eq!(
            Msg::decode(&as_bytes).unwrap(),
            Msg::decode(&{
                let mut b = as_seq.clone();
                b[0] = as_bytes[0];
                b
            })
            .unwrap()
        );
    }

    #[test]
    fn page_kinds_are_one_byte_each_and_nothing_else_decodes() {
        use PageKind::*;
        let m = Msg::PageKinds {
            kinds: vec![Zero, Initial, Data, Data],
        };
        let bytes = m.encode().unwrap();
        // Variant, length, then the kinds as 0, 1, 2: what older nodes
        // sent as raw bytes.
        assert_eq!(bytes[bytes.len() - 4..], [0, 1, 2, 2]);
        assert_eq!(Msg::decode(&bytes).unwrap(), m);
        let mut bad = bytes.clone();
        *bad.last_mut().unwrap() = 3;
        assert!(Msg::decode(&bad).is_err(), "page kind 3 decoded");
    }

    #[test]
    fn version_mismatch_is_explained() {
        let mut h = Hello::new("b", "aarch64", Features::default());
        assert!(h.check().is_ok());
        h.protocol = 99;
        let e = h.check().unwrap_err();
        assert!(e.contains("version 99"), "{e}");
        h.magic = *b"HTTP/1.1";
        assert!(h.check().unwrap_err().contains("does not speak"));
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        // Empty; a variant index past the last; a Hello cut short; a
        // length prefix far beyond the bytes present; trailing bytes.
        let prepared_and_more: &[u8] = &[5, 0xff, 0xff, 0xff, 0x0f];
        for bytes in [
            &[][..],
            &[200],
            &[0, 1, 2],
            &[4, 1, 0xff, 0xff, 0x0f],
            prepared_and_more,
        ] {
            assert!(Msg::decode(bytes).is_err(), "{bytes:?} decoded");
        }
    }
}
