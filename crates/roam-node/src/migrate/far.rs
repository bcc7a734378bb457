//! The memory server (`roam node --memory-server SIZE`) and its client: a
//! node keeps another node's far pages in its RAM (`roam_wire`'s `far.rs`
//! for the messages, `roam_runtime::FarMemory` for the paging).
//!
//! Why here: the server answers on the migration listener, after the same
//! TLS handshake and `Hello` as a migration, so only a node of the cluster
//! can store or read pages; and the client reaches it the way a migration
//! source reaches its destination.
//!
//! The server keeps one page space per connection, counted against SIZE
//! for the whole node, and frees it when the connection ends: a client
//! that dies leaves nothing behind, and a cell whose memory server dies
//! loses its far pages (it then stops, and a kept checkpoint brings it
//! back elsewhere; `docs/far-memory.md`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use roam_runtime::{Eviction, PageStore};
use roam_wire::{check_far_request, recv, send, FarOpen, FarPages, Hello, Msg, FAR_PAGE};

use super::{ReadHalf, WriteHalf};
use crate::error::NodeError;
use crate::limits::FarServer;
use crate::state::NodeInner;

/// How long a client waits for one answer of the memory server.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// One connection's pages; given back to the server when dropped.
struct Space<'a> {
    server: &'a FarServer,
    max_pages: u32,
    pages: HashMap<u32, Box<[u8]>>,
}

impl Drop for Space<'_> {
    fn drop(&mut self) {
        self.server.give_back(self.pages.len() as u64);
    }
}

/// Serve a client that opened with `open` (after the handshake) until it
/// hangs up. Every page it stored is freed on return.
pub(crate) async fn serve(
    n: &NodeInner,
    peer: &Hello,
    open: FarOpen,
    rd: &mut ReadHalf,
    wr: &mut WriteHalf,
) -> Result<(), String> {
    let refuse = |reason: String| Msg::Abort { reason };
    let Some(server) = &n.far_server else {
        let why = format!("node {} is not a memory server", n.cfg.name);
        let _ = send(wr, &refuse(why.clone())).await;
        return Err(why);
    };
    if let Err(e) = roam_wire::ident::check_cell_id(&open.cell) {
        let why = format!("far memory refused: {e}");
        let _ = send(wr, &refuse(why.clone())).await;
        return Err(why);
    }
    tracing::info!(cell = %open.cell, from = %peer.node, "memory server: a cell's far pages arrive");
    let mut space = Space {
        server,
        max_pages: open.max_pages,
        pages: HashMap::new(),
    };
    let opened = Msg::FarOpened {
        free_pages: server.free_pages(),
    };
    send(wr, &opened).await.map_err(|e| e.to_string())?;
    loop {
        let msg = match recv(rd).await {
            Ok(m) => m,
            // The client hung up: its pages go.
            Err(roam_wire::FrameError::Closed) => break,
            Err(e) => return Err(format!("memory server: {e}")),
        };
        let answer = match msg {
            Msg::FarPut(p) => put(&mut space, p),
            Msg::FarGet { pages } => get(&space, &pages),
            m => Err(format!(
                "unexpected `{}` message from a far-memory client",
                m.name()
            )),
        };
        match answer {
            Ok(a) => {
                send(wr, &a).await.map_err(|e| e.to_string())?;
            }
            Err(why) => {
                let _ = send(wr, &refuse(why.clone())).await;
                return Err(why);
            }
        }
    }
    tracing::info!(
        cell = %open.cell, from = %peer.node, pages = space.pages.len(),
        "memory server: the client left; its pages are freed"
    );
    Ok(())
}

fn put(space: &mut Space<'_>, p: FarPages) -> Result<Msg, String> {
    p.check(space.max_pages)?;
    // Pages not held yet, each counted once even if the batch repeats it.
    let fresh: std::collections::HashSet<u32> = p
        .pages
        .iter()
        .copied()
        .filter(|i| !space.pages.contains_key(i))
        .collect();
    let new = fresh.len() as u64;
    if !space.server.take(new) {
        return Err(format!(
            "the memory server is full: {} more pages asked, {} free",
            new,
            space.server.free_pages()
        ));
    }
    for (i, &page) in p.pages.iter().enumerate() {
        space.pages.insert(page, p.page(i).into());
    }
    Ok(Msg::FarAck)
}

fn get(space: &Space<'_>, pages: &[u32]) -> Result<Msg, String> {
    check_far_request(pages, space.max_pages)?;
    let mut bytes = Vec::with_capacity(pages.len() * FAR_PAGE);
    for p in pages {
        let page = space
            .pages
            .get(p)
            .ok_or_else(|| format!("page {p} is not held here"))?;
        bytes.extend_from_slice(page);
    }
    Ok(Msg::FarData(FarPages {
        pages: pages.to_vec(),
        bytes,
    }))
}

/// A cell's far pages on a memory server: a [`PageStore`] for
/// [`roam_runtime::Cell::attach_far`]. Its calls block the fault-handler
/// thread.
///
/// Its connection lives on a runtime of its own, driven by the thread that
/// calls (the fault handler): a page fault can block any thread that reads
/// the cell's memory, a worker of the node's runtime included (a migration
/// source reads it there), and a store whose socket needed that runtime's
/// workers would then wait on itself.
pub(crate) struct RemoteStore {
    rt: Option<tokio::runtime::Runtime>,
    rd: ReadHalf,
    wr: WriteHalf,
    max_pages: u32,
    what: String,
}

impl Drop for RemoteStore {
    fn drop(&mut self) {
        // Allowed anywhere, async code included (a plan dropped unused).
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl RemoteStore {
    /// Connect to the memory server whose control API is at `server`, and
    /// open a page space for `cell` of at most `max_pages` pages.
    pub(crate) async fn connect(
        n: &Arc<NodeInner>,
        server: &str,
        cell: &str,
        max_pages: u32,
    ) -> Result<(RemoteStore, u64), String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (n, server, cell) = (n.clone(), server.to_string(), cell.to_string());
        std::thread::Builder::new()
            .name(format!("far-open-{cell}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(format!("cannot start far memory's runtime: {e}")));
                        return;
                    }
                };
                let opened = rt.block_on(open_space(&n, &server, &cell, max_pages));
                let _ = tx.send(opened.map(|(rd, wr, free, what)| {
                    let store = RemoteStore {
                        rt: Some(rt),
                        rd,
                        wr,
                        max_pages,
                        what,
                    };
                    (store, free)
                }));
            })
            .map_err(|e| format!("cannot start a thread: {e}"))?;
        rx.await
            .map_err(|_| "the far-memory connection thread ended".to_string())?
    }

    fn call(&mut self, msg: Msg) -> Result<Msg, String> {
        let (rd, wr) = (&mut self.rd, &mut self.wr);
        let Some(rt) = &self.rt else {
            return Err("far memory's runtime is gone".into());
        };
        rt.block_on(async {
            send(wr, &msg).await.map_err(|e| e.to_string())?;
            answer(rd).await
        })
    }
}

/// Reach the memory server at `server` as a migration source reaches its
/// destination, and open a page space for `cell`: the connection's halves,
/// the server's free pages, and its description.
async fn open_space(
    n: &Arc<NodeInner>,
    server: &str,
    cell: &str,
    max_pages: u32,
) -> Result<(ReadHalf, WriteHalf, u64, String), String> {
    let super::transport::Reached {
        mut rd,
        mut wr,
        info,
        ..
    } = super::transport::reach(n, server, "memory server").await?;
    let open = Msg::FarOpen(FarOpen {
        cell: cell.to_string(),
        max_pages,
    });
    send(&mut wr, &open).await.map_err(|e| e.to_string())?;
    let free = match answer(&mut rd).await? {
        Msg::FarOpened { free_pages } => free_pages,
        m => {
            return Err(format!(
                "memory server {}: unexpected `{}`",
                info.name,
                m.name()
            ))
        }
    };
    let what = format!("memory server {} ({})", info.name, info.migrate_addr);
    Ok((rd, wr, free, what))
}

/// The next message, or the server's refusal as an error.
async fn answer(rd: &mut ReadHalf) -> Result<Msg, String> {
    match tokio::time::timeout(ANSWER_TIMEOUT, recv(rd)).await {
        Err(_) => Err(format!("no answer in {} s", ANSWER_TIMEOUT.as_secs())),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(Msg::Abort { reason })) => Err(reason),
        Ok(Ok(m)) => Ok(m),
    }
}

impl PageStore for RemoteStore {
    fn put(&mut self, pages: &[(u32, &[u8])]) -> Result<(), String> {
        for chunk in pages.chunks(roam_wire::FAR_BATCH_MAX) {
            let mut bytes = Vec::with_capacity(chunk.len() * FAR_PAGE);
            chunk.iter().for_each(|(_, b)| bytes.extend_from_slice(b));
            let msg = Msg::FarPut(FarPages {
                pages: chunk.iter().map(|(p, _)| *p).collect(),
                bytes,
            });
            match self.call(msg)? {
                Msg::FarAck => {}
                m => return Err(format!("unexpected `{}` after a put", m.name())),
            }
        }
        Ok(())
    }

    fn get(&mut self, pages: &[u32]) -> Result<Vec<(u32, Vec<u8>)>, String> {
        let mut out = Vec::with_capacity(pages.len());
        for chunk in pages.chunks(roam_wire::FAR_BATCH_MAX) {
            let msg = Msg::FarGet {
                pages: chunk.to_vec(),
            };
            let data = match self.call(msg)? {
                Msg::FarData(d) => d,
                m => return Err(format!("unexpected `{}` after a get", m.name())),
            };
            data.check(self.max_pages)?;
            if data.pages != chunk {
                return Err("the memory server sent other pages than asked".into());
            }
            for (i, p) in data.pages.iter().enumerate() {
                out.push((*p, data.page(i).to_vec()));
            }
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}

/// Open the far memory a launch asks for: check the request, connect to
/// the memory server, and give back the plan [`crate::cells::start`] runs.
pub(crate) async fn plan(
    n: &Arc<NodeInner>,
    req: &roam_api::types::FarRequest,
    cell: &str,
    max_memory: u64,
) -> Result<crate::cells::FarPlan, NodeError> {
    let spec = roam_wire::FarSpec {
        local_memory: req.local_memory,
        server: req.server.clone(),
        eviction: req
            .eviction
            .clone()
            .unwrap_or_else(|| Eviction::default().to_string()),
    };
    if spec.local_memory < roam_wire::FAR_LOCAL_MIN {
        return Err(NodeError::bad(format!(
            "--local-memory {} is below the minimum of 256 KiB",
            crate::size::human(req.local_memory)
        )));
    }
    // `open` checks the rest.
    open(n, &spec, cell, max_memory).await
}

/// Open the far memory `spec` describes for `cell`, whose memory limit is
/// `max_memory`: at a launch, at a restore, and where a far cell arrives
/// by migration (the same memory server, a new page space).
pub(crate) async fn open(
    n: &Arc<NodeInner>,
    spec: &roam_wire::FarSpec,
    cell: &str,
    max_memory: u64,
) -> Result<crate::cells::FarPlan, NodeError> {
    spec.check().map_err(NodeError::BadRequest)?;
    let eviction: Eviction = spec.eviction.parse().map_err(NodeError::BadRequest)?;
    let local_pages = usize::try_from(spec.local_memory / FAR_PAGE as u64).unwrap_or(usize::MAX);
    if !roam_runtime::userfaultfd_available() {
        return Err(NodeError::bad(format!(
            "node {} cannot run far memory: userfaultfd is not usable here (under qemu-user, \
             or without privilege)",
            n.cfg.name
        )));
    }
    let max_pages = u32::try_from(max_memory.div_ceil(FAR_PAGE as u64)).map_err(|_| {
        NodeError::bad(format!(
            "a memory limit of {max_memory} bytes is too large for far memory"
        ))
    })?;
    let (store, free) = RemoteStore::connect(n, &spec.server, cell, max_pages)
        .await
        .map_err(NodeError::Upstream)?;
    let server = store.what.clone();
    tracing::info!(cell, %server, free_pages = free, "far memory opened");
    Ok(crate::cells::FarPlan {
        opts: roam_runtime::FarOptions {
            eviction,
            ..roam_runtime::FarOptions::new(local_pages)
        },
        store: Box::new(store),
        server,
        spec: spec.clone(),
    })
}
