//! Post-copy after the start: the destination runs the cell and faults in
//! its pages; the source answers its requests first and pushes every
//! other data page meanwhile.

use std::time::{Duration, Instant};

use roam_wire::{Msg, PageKind};

use roam_wire::CellSpec;

use super::error::{After, Cause, MigrateError, Phase};
use super::modes::Ctx;
use super::ms;
use crate::client::Client;
use crate::cluster::planner::{take_from, Back};
use crate::migrate::postfail::{after_broken_post_copy, Verdict};
use crate::state::{Migration, NodeInner};
use crate::types::PostCopyStats;

impl Ctx<'_> {
    /// After the destination runs the cell: answer its page requests first,
    /// push every other data page meanwhile, until it has them all.
    pub(super) async fn serve_post_copy(
        &mut self,
        began: Instant,
    ) -> Result<PostCopyStats, String> {
        const PUSH: usize = 32;
        let data: Vec<u32> = (0..self.kinds.len() as u32)
            .filter(|&i| self.kinds[i as usize] == PageKind::Data && !self.post_sent[i as usize])
            .collect();
        let mut stats = PostCopyStats::default();
        let mut cursor = 0;
        let mut done_sent = false;
        loop {
            // Requests first, without waiting.
            while let Ok(m) = self.inbox.try_recv() {
                if self.on_post_copy_msg(m, &mut stats).await? {
                    stats.complete_ms = ms(began.elapsed());
                    return Ok(stats);
                }
            }
            if cursor < data.len() {
                let end = (cursor + PUSH).min(data.len());
                // Pages a request already fetched need not go again.
                let batch: Vec<u32> = data[cursor..end]
                    .iter()
                    .copied()
                    .filter(|&i| !self.post_sent[i as usize])
                    .collect();
                cursor = end;
                if !batch.is_empty() {
                    self.send_pages(&batch).await?;
                    self.mark_sent(&batch);
                    stats.pushed_pages += batch.len() as u64;
                }
                continue;
            }
            if !done_sent {
                self.stream.drain().await?;
                self.stream.msg(Msg::PagesDone).await?;
                done_sent = true;
                continue;
            }
            let m = match tokio::time::timeout(Duration::from_secs(300), self.inbox.recv()).await {
                Ok(Some(m)) => m,
                Ok(None) => return Err("the destination closed the connection".into()),
                Err(_) => {
                    return Err(
                        "the destination neither asked for pages nor finished in 300 s".into(),
                    )
                }
            };
            if self.on_post_copy_msg(m, &mut stats).await? {
                stats.complete_ms = ms(began.elapsed());
                return Ok(stats);
            }
        }
    }

    fn mark_sent(&mut self, pages: &[u32]) {
        for &i in pages {
            if let Some(s) = self.post_sent.get_mut(i as usize) {
                *s = true;
            }
        }
    }

    /// Whether every data page went into the stream: only then can the
    /// destination have all of its memory.
    pub(super) fn all_data_sent(&self) -> bool {
        self.kinds
            .iter()
            .zip(&self.post_sent)
            .all(|(&k, &s)| k != PageKind::Data || s)
    }

    /// Handle one message during post-copy; true when the destination has
    /// every page.
    async fn on_post_copy_msg(
        &mut self,
        m: Result<Msg, String>,
        stats: &mut PostCopyStats,
    ) -> Result<bool, String> {
        match m? {
            Msg::PageRequest { pages } => {
                stats.requests += 1;
                stats.demand_pages += pages.len() as u64;
                self.send_pages(&pages).await?;
                self.mark_sent(&pages);
                Ok(false)
            }
            Msg::Complete => Ok(true),
            Msg::Abort { reason } => Err(reason),
            other => Err(format!(
                "protocol error: `{}` during post-copy",
                other.name()
            )),
        }
    }
}

/// What the source does after post-copy broke.
pub(super) enum Broken {
    /// The cell resumes here (dropping the held cell resumes it).
    Resume(MigrateError),
    /// The cell stays on the destination.
    Stay(MigrateError),
}

/// Post-copy broke with `e` after the cell started on the destination:
/// decide (see `postfail`), and with a planner, resume only if this node
/// owns the cell again.
pub(super) async fn after_break(
    n: &NodeInner,
    m: &Migration,
    spec: &CellSpec,
    api: &Client,
    dest: &str,
    all_sent: bool,
    e: &str,
) -> Broken {
    m.phase("post-copy broken");
    let mut verdict = after_broken_post_copy(api, &m.cell, all_sent).await;
    // With a planner the destination owns the cell (at the generation
    // after the source's): the source resumes only if it takes it back.
    if let (Verdict::Resume(_), Some(_), Some(g)) = (&verdict, &n.planner, spec.generation) {
        match take_from(n, &m.cell, dest, g + 1).await {
            Back::Won(g) => {
                if let Some(c) = n.cells().get_mut(&m.cell) {
                    c.spec.generation = Some(g);
                }
            }
            // The planner does not handle the cell: the rules above.
            Back::Unknown(why) => {
                tracing::warn!(cell = %m.cell, %why, "the planner cannot settle the broken post-copy");
            }
            Back::Lost(why) => {
                verdict = Verdict::Stay(format!(
                    "the planner did not give the cell back ({why}), so it stays on the destination"
                ));
            }
        }
    }
    tracing::warn!(migration = %m.id, cell = %m.cell, error = %e, ?verdict,
        "post-copy broke after the cell started on the destination");
    let broke = format!("post-copy broke after the cell started on the destination ({e})");
    match verdict {
        Verdict::Resume(why) => {
            if spec.service.is_some() {
                // The destination's copy served the clients at hops + 1
                // and ran: the cell went there and came back, and its
                // `Serve` from here must supersede that copy's.
                if let Some(e) = n.cells().get_mut(&m.cell) {
                    e.spec.hops += 2;
                }
            }
            Broken::Resume(MigrateError::here(
                Phase::PostCopy,
                format!("{broke}; {why}, so the cell resumed from its paused state"),
            ))
        }
        Verdict::Stay(why) => Broken::Stay(MigrateError {
            phase: Phase::PostCopy,
            cause: Cause::Failed(format!("{broke}; {why}")),
            after: After::There,
        }),
    }
}
