//! Worker threads: hashing and compression, the parallel stages.
//!
//! Workers take jobs from one shared queue and never decide anything that
//! depends on other pages; every result carries its sequence number so the
//! coordinator can put results back in submission order.

use crate::codec::{Codec, PageCompressor};
use crate::mode::Mode;
use crate::record::Record;
use crate::store::{ChunkHash, Page};
use crate::PAGE_SIZE;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

pub(crate) enum Job {
    Hash {
        seq: u64,
        index: u32,
        page: Box<Page>,
    },
    Compress {
        seq: u64,
        index: u32,
        page: Arc<Page>,
        base: Option<Arc<Page>>,
        eligible: bool,
        mode: Mode,
    },
}

pub(crate) struct Hashed {
    pub index: u32,
    pub page: Box<Page>,
    pub hash: ChunkHash,
    pub zero: bool,
}

pub(crate) struct Compressed {
    /// The encoded record.
    pub record: Vec<u8>,
    pub mode: Mode,
    pub had_base: bool,
    pub delta: bool,
    pub delta_unchanged: u64,
    pub payload: u64,
    pub incompressible: bool,
}

pub(crate) enum Msg {
    Hashed {
        seq: u64,
        nanos: u64,
        h: Hashed,
    },
    Compressed {
        seq: u64,
        nanos: u64,
        c: Compressed,
    },
    /// Emit the partial batch once every page before `upto` is emitted.
    Flush {
        upto: u64,
    },
    /// No more input; `total` pages were submitted.
    Finish {
        total: u64,
    },
}

pub(crate) fn run(jobs: Arc<Mutex<Receiver<Job>>>, out: Sender<Msg>) {
    let mut comp = PageCompressor::default();
    let mut x: Box<Page> = Box::new([0; PAGE_SIZE]);
    loop {
        let job = {
            let rx = jobs.lock().unwrap_or_else(PoisonError::into_inner);
            rx.recv()
        };
        let Ok(job) = job else { return };
        let t = Instant::now();
        let msg = match job {
            Job::Hash { seq, index, page } => {
                let zero = page.iter().all(|&b| b == 0);
                let hash = *blake3::hash(&page[..]).as_bytes();
                let h = Hashed {
                    index,
                    page,
                    hash,
                    zero,
                };
                Msg::Hashed {
                    seq,
                    nanos: t.elapsed().as_nanos() as u64,
                    h,
                }
            }
            Job::Compress {
                seq,
                index,
                page,
                base,
                eligible,
                mode,
            } => {
                let mut c = compress(&mut comp, &mut x, index, &page, base.as_deref(), mode);
                c.had_base = eligible;
                Msg::Compressed {
                    seq,
                    nanos: t.elapsed().as_nanos() as u64,
                    c,
                }
            }
        };
        if out.send(msg).is_err() {
            return;
        }
    }
}

fn compress(
    comp: &mut PageCompressor,
    x: &mut Page,
    index: u32,
    page: &Page,
    base: Option<&Page>,
    mode: Mode,
) -> Compressed {
    let mut record = Vec::with_capacity(64);
    let had_base = base.is_some();
    if let (true, Some(base)) = (mode.delta, base) {
        crate::xor_into(x, base, page);
        let unchanged = x.iter().filter(|&&b| b == 0).count() as u64;
        let (codec, data) = comp.compress(mode.codec, &x[..]);
        // An XOR that does not compress is no better than the page itself,
        // and a raw page does not depend on the destination's old copy.
        if codec != Codec::None {
            Record::Delta {
                index,
                codec: codec.wire_id(),
                data,
            }
            .encode_into(&mut record);
            return Compressed {
                payload: data.len() as u64,
                record,
                mode,
                had_base,
                delta: true,
                delta_unchanged: unchanged,
                incompressible: false,
            };
        }
    }
    let (codec, data) = comp.compress(mode.codec, &page[..]);
    Record::Raw {
        index,
        codec: codec.wire_id(),
        data,
    }
    .encode_into(&mut record);
    Compressed {
        payload: data.len() as u64,
        record,
        mode,
        had_base,
        delta: false,
        delta_unchanged: 0,
        incompressible: codec == Codec::None && mode.codec != Codec::None,
    }
}
