//! A client of the planner's API (`docs/control-plane.md`), used by nodes
//! (registration, heartbeats, ownership transactions) and by the `roam`
//! command.
//!
//! It rides on [`Client`]'s connection setup, TLS and token handling; what
//! it adds is the planner's paths, the statuses that mean something here
//! (`410`: register again; `409`: an ownership transaction lost), and
//! failover between several planners on one etcd: given a comma-separated
//! list, it sends to the planner that last answered, and moves on to the
//! next only when a connection cannot even be made, so no request is ever
//! sent twice.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::client::{Client, ClientAuth, ClientError};
use crate::planner::*;
use crate::types::{ApiError, ModuleInfo};

/// Talks to a planner, or to the first of several that answers.
#[derive(Debug, Clone)]
pub struct PlannerClient {
    /// One per planner; never empty.
    clients: Vec<Client>,
    /// The one that answered last.
    current: Arc<AtomicUsize>,
}

/// Most planners one client fails over between.
pub const MAX_PLANNERS: usize = 16;

/// Why a request to the planner failed.
#[derive(Debug, thiserror::Error)]
pub enum PlannerError {
    /// No answer, or no client could be built.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The list of planner addresses is malformed.
    #[error("{0}")]
    Addresses(String),
    /// `410`: the node's lease expired; it must register again.
    #[error("the planner says this node's lease expired ({0}): registering again")]
    LeaseExpired(String),
    /// `409`: the ownership transaction (or another compare-and-swap) lost.
    #[error("the planner refused: {0}")]
    Conflict(String),
    /// Any other error status.
    #[error("the planner answered {status}: {error}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// Its message.
        error: String,
    },
    /// A success status with a body that is not what the API promises.
    #[error("unexpected answer from the planner at {addr}: {error}")]
    Decode {
        /// The planner's address.
        addr: String,
        /// What did not parse.
        error: String,
    },
}

impl PlannerError {
    /// Whether the planner may not have seen the request at all (retry
    /// later), as opposed to an answer.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, PlannerError::Client(ClientError::Unreachable { .. }))
    }
}

impl PlannerClient {
    /// A client of the planner at `addrs` (`host:port` or an `http(s)://`
    /// URL; several, comma-separated, for planners that share one etcd)
    /// presenting `auth`. Under TLS the server must hold a `planner`
    /// certificate.
    pub fn with_auth(addrs: &str, auth: &ClientAuth) -> Result<PlannerClient, PlannerError> {
        let list: Vec<&str> = addrs.split(',').map(str::trim).collect();
        if list.len() > MAX_PLANNERS || list.iter().any(|a| a.is_empty()) {
            return Err(PlannerError::Addresses(format!(
                "{addrs:?}: expected 1 to {MAX_PLANNERS} planner addresses, comma-separated"
            )));
        }
        let clients = list
            .iter()
            .map(|a| Client::for_role(a, auth, roam_auth::Role::Planner))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PlannerClient {
            clients,
            current: Arc::default(),
        })
    }

    /// The base URL of the planner that answered last.
    pub fn base(&self) -> &str {
        self.client().base()
    }

    fn client(&self) -> &Client {
        &self.clients[self.current.load(Ordering::Relaxed) % self.clients.len()]
    }

    async fn call<T: DeserializeOwned>(
        &self,
        r: impl Fn(&Client) -> reqwest::RequestBuilder,
    ) -> Result<T, PlannerError> {
        let body = self.call_bytes(r).await?;
        serde_json::from_slice(&body).map_err(|e| PlannerError::Decode {
            addr: self.base().to_string(),
            error: e.to_string(),
        })
    }

    /// Send the request `r` builds to the planner that answered last, or,
    /// when no connection to it can be made, to the next.
    async fn send(
        &self,
        r: impl Fn(&Client) -> reqwest::RequestBuilder,
    ) -> Result<(reqwest::StatusCode, Vec<u8>), PlannerError> {
        let first = self.current.load(Ordering::Relaxed);
        let mut error = None;
        for k in 0..self.clients.len() {
            let i = (first + k) % self.clients.len();
            let c = &self.clients[i];
            match c.send_raw(r(c)).await {
                Ok(answer) => {
                    if i != first % self.clients.len() {
                        tracing::info!(planner = c.base(), "now talking to this planner");
                    }
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(answer);
                }
                // Not connected: this planner never saw the request.
                Err(ClientError::Unreachable { addr, source }) if source.is_connect() => {
                    error = Some(ClientError::Unreachable { addr, source });
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(error.expect("at least one planner").into())
    }

    async fn call_bytes(
        &self,
        r: impl Fn(&Client) -> reqwest::RequestBuilder,
    ) -> Result<Vec<u8>, PlannerError> {
        let (status, body) = self.send(r).await?;
        if status.is_success() {
            return Ok(body);
        }
        let error = serde_json::from_slice::<ApiError>(&body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
        Err(match status.as_u16() {
            410 => PlannerError::LeaseExpired(error),
            409 => PlannerError::Conflict(error),
            status => PlannerError::Api { status, error },
        })
    }
}

fn get(path: &str) -> impl Fn(&Client) -> reqwest::RequestBuilder + '_ {
    move |c| c.http().get(c.url(path))
}

fn post(path: &str) -> impl Fn(&Client) -> reqwest::RequestBuilder + '_ {
    move |c| c.http().post(c.url(path))
}

fn post_json<'a, B: Serialize>(
    path: &'a str,
    body: &'a B,
) -> impl Fn(&Client) -> reqwest::RequestBuilder + 'a {
    move |c| c.http().post(c.url(path)).json(body)
}

impl PlannerClient {
    /// `POST /v1/nodes`: register (again).
    pub async fn register(&self, req: &RegisterRequest) -> Result<HeartbeatResponse, PlannerError> {
        self.call(post_json("/v1/nodes", req)).await
    }

    /// `POST /v1/nodes/{name}/heartbeat`; [`PlannerError::LeaseExpired`]
    /// means: register again.
    pub async fn heartbeat(
        &self,
        name: &str,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, PlannerError> {
        self.call(post_json(&format!("/v1/nodes/{name}/heartbeat"), req))
            .await
    }

    /// `GET /v1/nodes`.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, PlannerError> {
        self.call(get("/v1/nodes")).await
    }

    /// `POST /v1/nodes/{name}/drain`: the migrations started.
    pub async fn drain(&self, name: &str) -> Result<serde_json::Value, PlannerError> {
        self.call(post(&format!("/v1/nodes/{name}/drain"))).await
    }

    /// `POST /v1/nodes/{name}/undrain`: the node takes cells again.
    pub async fn undrain(&self, name: &str) -> Result<NodeRecord, PlannerError> {
        self.call(post(&format!("/v1/nodes/{name}/undrain"))).await
    }

    /// `PUT /v1/nodes/{name}/maintenance`: declare the node's maintenance
    /// window; the node's record.
    pub async fn declare_maintenance(
        &self,
        name: &str,
        req: &crate::planner::MaintenanceRequest,
    ) -> Result<NodeRecord, PlannerError> {
        let path = format!("/v1/nodes/{name}/maintenance");
        self.call(|c| c.http().put(c.url(&path)).json(req)).await
    }

    /// `DELETE /v1/nodes/{name}/maintenance`: cancel it; the node's record.
    pub async fn cancel_maintenance(&self, name: &str) -> Result<NodeRecord, PlannerError> {
        let path = format!("/v1/nodes/{name}/maintenance");
        self.call(|c| c.http().delete(c.url(&path))).await
    }

    /// `POST /v1/modules`: upload to the module repository.
    pub async fn upload_module(&self, bytes: Vec<u8>) -> Result<ModuleInfo, PlannerError> {
        // Shared, not copied, if a second planner has to be tried.
        let bytes = bytes::Bytes::from(bytes);
        self.call(|c| c.http().post(c.url("/v1/modules")).body(bytes.clone()))
            .await
    }

    /// `GET /v1/modules/{hash}`: a module's bytes.
    pub async fn module(&self, hash: &str) -> Result<Vec<u8>, PlannerError> {
        self.call_bytes(get(&format!("/v1/modules/{hash}"))).await
    }

    /// `POST /v1/cells`: launch a cell where the policy (or `req.node`)
    /// says.
    pub async fn place(&self, req: &PlaceRequest) -> Result<CellRecord, PlannerError> {
        self.call(post_json("/v1/cells", req)).await
    }

    /// `GET /v1/cells`.
    pub async fn cells(&self) -> Result<Vec<CellRecord>, PlannerError> {
        self.call(get("/v1/cells")).await
    }

    /// `GET /v1/cells/{id}`.
    pub async fn cell(&self, id: &str) -> Result<CellRecord, PlannerError> {
        self.call(get(&format!("/v1/cells/{id}"))).await
    }

    /// `GET /v1/cells/{id}/logs`: the owner's log of the cell.
    pub async fn logs(&self, id: &str) -> Result<Vec<u8>, PlannerError> {
        self.call_bytes(get(&format!("/v1/cells/{id}/logs"))).await
    }

    /// `POST /v1/cells/{id}/kill`.
    pub async fn kill(&self, id: &str) -> Result<CellRecord, PlannerError> {
        self.call(post(&format!("/v1/cells/{id}/kill"))).await
    }

    /// `POST /v1/cells/{id}/migrate`: `{migration, to}`.
    pub async fn migrate(
        &self,
        id: &str,
        req: &MoveRequest,
    ) -> Result<serde_json::Value, PlannerError> {
        self.call(post_json(&format!("/v1/cells/{id}/migrate"), req))
            .await
    }

    /// `POST /v1/cells/{id}/checkpoint`: a kept checkpoint now.
    pub async fn checkpoint(&self, id: &str) -> Result<Kept, PlannerError> {
        self.call(post(&format!("/v1/cells/{id}/checkpoint"))).await
    }

    /// `POST /v1/cells/{id}/handoff`: the owner names the node that may
    /// take the cell; [`PlannerError::Conflict`] when the caller does not
    /// own it at that generation.
    pub async fn handoff(&self, id: &str, req: &HandoffRequest) -> Result<(), PlannerError> {
        let _: serde_json::Value = self
            .call(post_json(&format!("/v1/cells/{id}/handoff"), req))
            .await?;
        Ok(())
    }

    /// `POST /v1/cells/{id}/owner`: the ownership transaction;
    /// [`PlannerError::Conflict`] when it lost.
    pub async fn owner(&self, id: &str, req: &OwnerRequest) -> Result<OwnerResponse, PlannerError> {
        self.call(post_json(&format!("/v1/cells/{id}/owner"), req))
            .await
    }

    /// `GET /v1/services/{service}`: the cells that serve `service`, their
    /// owners and generations (what a gateway checks a `Serve` against).
    pub async fn service(&self, service: &str) -> Result<ServiceOwners, PlannerError> {
        self.call(get(&format!("/v1/services/{service}"))).await
    }

    /// `GET /v1/slowdowns`: each program's CPU time per ISA, as learned.
    pub async fn slowdowns(&self) -> Result<crate::planner::Slowdowns, PlannerError> {
        self.call(get("/v1/slowdowns")).await
    }

    /// `GET /v1/policies`.
    pub async fn policies(&self) -> Result<serde_json::Value, PlannerError> {
        self.call(get("/v1/policies")).await
    }

    /// `PUT /v1/policies`: `{placement}`.
    pub async fn set_policies(
        &self,
        req: &serde_json::Value,
    ) -> Result<serde_json::Value, PlannerError> {
        self.call(|c| c.http().put(c.url("/v1/policies")).json(req))
            .await
    }

    /// `GET /v1/events`: the server-sent event stream, as a response to
    /// read chunk by chunk.
    pub async fn events(&self) -> Result<reqwest::Response, PlannerError> {
        let c = self.client();
        let r = c.authed(get("/v1/events")(c));
        let r = r.send().await.map_err(|source| ClientError::Unreachable {
            addr: self.base().to_string(),
            source,
        })?;
        if r.status().is_success() {
            return Ok(r);
        }
        let status = r.status().as_u16();
        let error = r.text().await.unwrap_or_default();
        Err(PlannerError::Api { status, error })
    }

    /// `GET /metrics`: the Prometheus text.
    pub async fn metrics(&self) -> Result<String, PlannerError> {
        let b = self.call_bytes(get("/metrics")).await?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port nothing listens on: bound, then closed.
    fn closed_port() -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn fails_over_to_the_next_planner_only_when_one_cannot_be_reached() {
        let app = axum::Router::new().route(
            "/v1/nodes",
            axum::routing::get(|| async { axum::Json(serde_json::json!([])) }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = l.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(l, app).await });
        let dead = closed_port();
        let p =
            PlannerClient::with_auth(&format!("{dead}, {live}"), &ClientAuth::default()).unwrap();
        assert!(p.base().contains(&dead));
        assert!(p.nodes().await.unwrap().is_empty());
        assert!(p.base().contains(&live), "{}", p.base());
        // An answer, even an error, is not a reason to try another.
        let e = p.cell("c-1").await.unwrap_err();
        assert!(matches!(e, PlannerError::Api { status: 404, .. }), "{e}");
        assert!(p.base().contains(&live));
        // None reachable: the last connection error.
        let p = PlannerClient::with_auth(&closed_port(), &ClientAuth::default()).unwrap();
        assert!(p.nodes().await.unwrap_err().is_unreachable());
    }

    #[test]
    fn a_bad_planner_list_is_refused() {
        let auth = ClientAuth::default();
        for bad in ["", "a:1,", ",a:1", "a:1,,b:2"] {
            assert!(PlannerClient::with_auth(bad, &auth).is_err(), "{bad:?}");
        }
        let many = vec!["127.0.0.1:1"; MAX_PLANNERS + 1].join(",");
        assert!(PlannerClient::with_auth(&many, &auth).is_err());
    }
}
