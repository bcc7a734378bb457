//! Where received pages go: the receiving instance's memory (stop-and-copy,
//! pre-copy) or the lazily filled memory of a running cell (post-copy).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use roam_runtime::{LazyMemory, PageSource};
use roam_snapshot::{InitialImage, PAGE_SIZE};
use roam_transfer::{ChunkStore, Decoder, PageTarget};
use roam_wire::{recv, send, Msg};
use tokio::sync::{mpsc, Notify};

use super::{ReadHalf, WriteHalf};

/// How long the destination of a post-copy waits for the next message from
/// the source before it stops the cell (its memory cannot be completed).
/// The source waits longer than this before it resumes the cell from its
/// paused state when the destination cannot be asked (see
/// `docs/failure-matrix.md`).
pub(crate) const POST_COPY_IDLE: Duration = Duration::from_secs(10);

/// A [`PageTarget`] over a freshly instantiated memory that skips work the
/// instantiation already did: an untouched page holds the module's initial
/// image (or zeros), so `Zero` and `Initial` records for it write nothing
/// and fault nothing in.
pub(crate) struct IncomingTarget<'a> {
    mem: &'a mut [u8],
    initial: &'a InitialImage,
    written: &'a mut Vec<bool>,
}

impl<'a> IncomingTarget<'a> {
    pub(crate) fn new(
        mem: &'a mut [u8],
        initial: &'a InitialImage,
        written: &'a mut Vec<bool>,
    ) -> Self {
        let pages = mem.len() / PAGE_SIZE;
        if written.len() < pages {
            written.resize(pages, false);
        }
        IncomingTarget {
            mem,
            initial,
            written,
        }
    }

    fn slot(&mut self, i: u32) -> &mut [u8] {
        let o = i as usize * PAGE_SIZE;
        &mut self.mem[o..o + PAGE_SIZE]
    }
}

impl PageTarget for IncomingTarget<'_> {
    fn page_count(&self) -> u32 {
        (self.mem.len() / PAGE_SIZE) as u32
    }

    fn page(&self, i: u32) -> &[u8] {
        let o = i as usize * PAGE_SIZE;
        &self.mem[o..o + PAGE_SIZE]
    }

    fn write(&mut self, i: u32, data: &[u8]) {
        self.slot(i).copy_from_slice(data);
        self.written[i as usize] = true;
    }

    fn zero(&mut self, i: u32) {
        if self.written[i as usize] || self.initial.page(u64::from(i)).is_some() {
            self.slot(i).fill(0);
            self.written[i as usize] = true;
        }
    }

    fn initial(&mut self, i: u32) {
        if self.written[i as usize] {
            let page = self.initial.page(u64::from(i)).map(<[u8]>::to_vec);
            match page {
                Some(p) => self.slot(i).copy_from_slice(&p),
                None => self.slot(i).fill(0),
            }
        }
    }
}

/// Pages of a post-copy stream as received. Every page is kept until the
/// migration completes: later records may refer to one (`Copy`), and the
/// fault handler may ask for a page that already went by (the source then
/// sends nothing, because this stream already carried it). That costs as
/// much memory as the state sent.
#[derive(Default)]
struct Received {
    pages: HashMap<u32, Vec<u8>>,
    fresh: Vec<u32>,
}

impl PageTarget for Received {
    fn page_count(&self) -> u32 {
        // The largest wasm32 memory; the lazy memory checks the real size.
        (1u64 << 32).div_ceil(PAGE_SIZE as u64) as u32
    }
    fn page(&self, i: u32) -> &[u8] {
        self.pages
            .get(&i)
            .map_or(&[0u8; PAGE_SIZE][..], Vec::as_slice)
    }
    fn write(&mut self, i: u32, data: &[u8]) {
        self.pages.insert(i, data.to_vec());
        self.fresh.push(i);
    }
    fn initial(&mut self, _i: u32) {
        // The lazy memory serves initial pages itself.
    }
    fn zero(&mut self, _i: u32) {}
}

/// The destination of a post-copy migration: serves the fault handler's
/// requests over the connection and installs pages as they arrive.
pub(crate) struct PostCopyPages {
    received: Mutex<Received>,
    arrived: Condvar,
    failed: Mutex<Option<String>>,
    requests: mpsc::UnboundedSender<Vec<u32>>,
    request_rx: Mutex<Option<mpsc::UnboundedReceiver<Vec<u32>>>>,
}

impl PostCopyPages {
    pub(crate) fn new() -> Arc<PostCopyPages> {
        let (tx, rx) = mpsc::unbounded_channel();
        Arc::new(PostCopyPages {
            received: Mutex::new(Received::default()),
            arrived: Condvar::new(),
            failed: Mutex::new(None),
            requests: tx,
            request_rx: Mutex::new(Some(rx)),
        })
    }

    /// The [`PageSource`] the runtime's fault handler calls.
    pub(crate) fn source(self: &Arc<Self>) -> NetSource {
        NetSource(self.clone())
    }

    /// Decode a batch that arrived before the final state: the pages the
    /// rewind touches (see `docs/migration.md`, "post-copy ordering"). They
    /// are kept here, where the fault handler finds them without asking the
    /// source, which does not serve requests before the commit. Installed
    /// into the lazy memory when [`PostCopyPages::serve`] starts, if the
    /// rewind did not fault them in already.
    pub(crate) fn receive_early(&self, decoder: &mut Decoder, batch: &[u8]) -> Result<(), String> {
        let mut got = self.received.lock().unwrap_or_else(PoisonError::into_inner);
        decoder
            .apply(batch, &mut *got)
            .map(|_| ())
            .map_err(|e| format!("pages sent ahead of the final state: {e}"))?;
        drop(got);
        self.arrived.notify_all();
        Ok(())
    }

    /// Give up: every waiting and later fetch fails with `why`.
    pub(crate) fn fail(&self, why: &str) {
        *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(why.to_string());
        self.arrived.notify_all();
    }

    /// Receive pages until every page of the cell is present; send the
    /// fault handler's requests meanwhile. On a broken stream the cell
    /// cannot go on: its memory is incomplete and the source is gone.
    pub(crate) async fn serve(
        self: Arc<Self>,
        lazy: LazyMemory,
        rd: &mut ReadHalf,
        wr: &mut WriteHalf,
        store: Arc<ChunkStore>,
    ) -> Result<(), String> {
        let done = Notify::new();
        let mut requests = self
            .request_rx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or("post-copy served twice")?;
        let reader = async {
            let r = self.receive(&lazy, rd, store).await;
            done.notify_one();
            r
        };
        let writer = async {
            loop {
                tokio::select! {
                    Some(pages) = requests.recv() => {
                        if let Err(e) = send(wr, &Msg::PageRequest { pages }).await {
                            return Err(e.to_string());
                        }
                    }
                    () = done.notified() => return Ok(()),
                }
            }
        };
        let (r, w) = tokio::join!(reader, writer);
        let result = r.and(w);
        match &result {
            Ok(()) => {
                let _ = send(wr, &Msg::Complete).await;
                linger(rd).await;
            }
            Err(e) => {
                self.fail(e);
                lazy.fail(e);
            }
        }
        result
    }

    async fn receive(
        &self,
        lazy: &LazyMemory,
        rd: &mut ReadHalf,
        store: Arc<ChunkStore>,
    ) -> Result<(), String> {
        let mut decoder = Decoder::with_store(store, true);
        // Pages sent ahead of the final state that no fault asked for.
        let early = {
            let mut got = self.received.lock().unwrap_or_else(PoisonError::into_inner);
            let fresh = std::mem::take(&mut got.fresh);
            fresh
                .into_iter()
                .map(|i| (i, got.pages[&i].clone()))
                .collect::<Vec<_>>()
        };
        for (i, data) in early {
            lazy.install(i, &data).map_err(|e| e.to_string())?;
        }
        // Until every page is here, or the cell ended without them: a
        // program may finish on this node before post-copy has pushed its
        // last pages, and then the pages still coming are not needed.
        while lazy.needs_pages() {
            // A healthy source pushes pages without pause until `PagesDone`;
            // a silent one is gone (or cut off), and the copy here must stop
            // by itself: the source may resume the cell from its paused
            // state once this limit has passed. Giving up on a frame half
            // read is fine: the stream is abandoned.
            let m = tokio::time::timeout(POST_COPY_IDLE, recv(rd))
                .await
                .map_err(|_| {
                    format!(
                        "the source sent nothing for {} s during post-copy",
                        POST_COPY_IDLE.as_secs()
                    )
                })?
                .map_err(|e| format!("post-copy stream from the source broke: {e}"))?;
            match m {
                Msg::Pages { batch } => {
                    let fresh = {
                        let mut got = self.received.lock().unwrap_or_else(PoisonError::into_inner);
                        decoder
                            .apply(&batch, &mut *got)
                            .map_err(|e| e.to_string())?;
                        let fresh: Vec<(u32, Vec<u8>)> = std::mem::take(&mut got.fresh)
                            .into_iter()
                            .map(|i| (i, got.pages[&i].clone()))
                            .collect();
                        fresh
                    };
                    self.arrived.notify_all();
                    for (i, data) in fresh {
                        lazy.install(i, &data).map_err(|e| e.to_string())?;
                    }
                }
                Msg::PagesDone => {
                    // Requested pages may still be on their way into memory
                    // through the fault handler.
                    for _ in 0..500 {
                        if !lazy.needs_pages() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    if lazy.needs_pages() {
                        return Err(
                            "the source finished sending, but pages are still missing".into()
                        );
                    }
                }
                Msg::Abort { reason } => {
                    return Err(format!("the source aborted post-copy: {reason}"))
                }
                m => {
                    return Err(format!(
                        "protocol error: unexpected `{}` during post-copy",
                        m.name()
                    ))
                }
            }
        }
        Ok(())
    }
}

/// After `Complete`, read and drop what the source still had in flight
/// (pushed pages it sent before it saw `Complete`) until it ends the stream
/// or sends `PagesDone`. Closing a socket with unread bytes makes the kernel
/// answer with a reset, and a source that reads the reset before our
/// `Complete` would take a finished post-copy for a broken one.
async fn linger(rd: &mut ReadHalf) {
    let drain = async {
        loop {
            match recv(rd).await {
                Ok(Msg::PagesDone) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    let _ = tokio::time::timeout(POST_COPY_IDLE, drain).await;
}

/// Fetches pages for the fault handler through the connection.
pub(crate) struct NetSource(Arc<PostCopyPages>);

impl PageSource for NetSource {
    fn fetch(&mut self, pages: &[u32]) -> Result<Vec<(u32, Vec<u8>)>, String> {
        let p = &self.0;
        let Some(&first) = pages.first() else {
            return Ok(Vec::new());
        };
        let have = |got: &Received| got.pages.contains_key(&first);
        let mut got = p.received.lock().unwrap_or_else(PoisonError::into_inner);
        if !have(&got) {
            let missing: Vec<u32> = pages
                .iter()
                .copied()
                .filter(|i| !got.pages.contains_key(i))
                .collect();
            p.requests
                .send(missing)
                .map_err(|_| "the post-copy connection is closed".to_string())?;
        }
        loop {
            if let Some(e) = p
                .failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
            {
                return Err(e);
            }
            if have(&got) {
                return Ok(pages
                    .iter()
                    .filter_map(|i| got.pages.get(i).map(|d| (*i, d.clone())))
                    .collect());
            }
            got = p
                .arrived
                .wait_timeout(got, Duration::from_millis(100))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
