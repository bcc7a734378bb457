//! A client of the planner's API (`docs/control-plane.md`), used by nodes
//! (registration, heartbeats, ownership transactions) and by the `roam`
//! command.
//!
//! It rides on [`Client`]'s connection setup, TLS and token handling; what
//! it adds is the planner's paths and the statuses that mean something
//! here: `410` (register again) and `409` (an ownership transaction lost).

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::client::{Client, ClientAuth, ClientError};
use crate::planner::*;
use crate::types::{ApiError, ModuleInfo};

/// Talks to one planner.
#[derive(Debug, Clone)]
pub struct PlannerClient {
    inner: Client,
}

/// Why a request to the planner failed.
#[derive(Debug, thiserror::Error)]
pub enum PlannerError {
    /// No answer, or no client could be built.
    #[error(transparent)]
    Client(#[from] ClientError),
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
    /// A client of the planner at `addr` (`host:port` or an `http(s)://`
    /// URL) presenting `auth`.
    pub fn with_auth(addr: &str, auth: &ClientAuth) -> Result<PlannerClient, PlannerError> {
        Ok(PlannerClient {
            inner: Client::with_auth(addr, auth)?,
        })
    }

    /// The planner's base URL.
    pub fn base(&self) -> &str {
        self.inner.base()
    }

    async fn call<T: DeserializeOwned>(
        &self,
        r: reqwest::RequestBuilder,
    ) -> Result<T, PlannerError> {
        let body = self.call_bytes(r).await?;
        serde_json::from_slice(&body).map_err(|e| PlannerError::Decode {
            addr: self.base().to_string(),
            error: e.to_string(),
        })
    }

    async fn call_bytes(&self, r: reqwest::RequestBuilder) -> Result<Vec<u8>, PlannerError> {
        let (status, body) = self.inner.send_raw(r).await?;
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

    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.inner.http().get(self.inner.url(path))
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.inner.http().post(self.inner.url(path))
    }

    fn post_json<B: Serialize>(&self, path: &str, body: &B) -> reqwest::RequestBuilder {
        self.post(path).json(body)
    }

    /// `POST /v1/nodes`: register (again).
    pub async fn register(&self, req: &RegisterRequest) -> Result<HeartbeatResponse, PlannerError> {
        self.call(self.post_json("/v1/nodes", req)).await
    }

    /// `POST /v1/nodes/{name}/heartbeat`; [`PlannerError::LeaseExpired`]
    /// means: register again.
    pub async fn heartbeat(
        &self,
        name: &str,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, PlannerError> {
        self.call(self.post_json(&format!("/v1/nodes/{name}/heartbeat"), req))
            .await
    }

    /// `GET /v1/nodes`.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, PlannerError> {
        self.call(self.get("/v1/nodes")).await
    }

    /// `POST /v1/nodes/{name}/drain`: the migrations started.
    pub async fn drain(&self, name: &str) -> Result<serde_json::Value, PlannerError> {
        self.call(self.post(&format!("/v1/nodes/{name}/drain")))
            .await
    }

    /// `POST /v1/nodes/{name}/undrain`: the node takes cells again.
    pub async fn undrain(&self, name: &str) -> Result<NodeRecord, PlannerError> {
        self.call(self.post(&format!("/v1/nodes/{name}/undrain")))
            .await
    }

    /// `POST /v1/modules`: upload to the module repository.
    pub async fn upload_module(&self, bytes: Vec<u8>) -> Result<ModuleInfo, PlannerError> {
        self.call(self.post("/v1/modules").body(bytes)).await
    }

    /// `GET /v1/modules/{hash}`: a module's bytes.
    pub async fn module(&self, hash: &str) -> Result<Vec<u8>, PlannerError> {
        self.call_bytes(self.get(&format!("/v1/modules/{hash}")))
            .await
    }

    /// `POST /v1/cells`: launch a cell where the policy (or `req.node`)
    /// says.
    pub async fn place(&self, req: &PlaceRequest) -> Result<CellRecord, PlannerError> {
        self.call(self.post_json("/v1/cells", req)).await
    }

    /// `GET /v1/cells`.
    pub async fn cells(&self) -> Result<Vec<CellRecord>, PlannerError> {
        self.call(self.get("/v1/cells")).await
    }

    /// `GET /v1/cells/{id}`.
    pub async fn cell(&self, id: &str) -> Result<CellRecord, PlannerError> {
        self.call(self.get(&format!("/v1/cells/{id}"))).await
    }

    /// `GET /v1/cells/{id}/logs`: the owner's log of the cell.
    pub async fn logs(&self, id: &str) -> Result<Vec<u8>, PlannerError> {
        self.call_bytes(self.get(&format!("/v1/cells/{id}/logs")))
            .await
    }

    /// `POST /v1/cells/{id}/kill`.
    pub async fn kill(&self, id: &str) -> Result<CellRecord, PlannerError> {
        self.call(self.post(&format!("/v1/cells/{id}/kill"))).await
    }

    /// `POST /v1/cells/{id}/migrate`: `{migration, to}`.
    pub async fn migrate(
        &self,
        id: &str,
        req: &MoveRequest,
    ) -> Result<serde_json::Value, PlannerError> {
        self.call(self.post_json(&format!("/v1/cells/{id}/migrate"), req))
            .await
    }

    /// `POST /v1/cells/{id}/checkpoint`: a kept checkpoint now.
    pub async fn checkpoint(&self, id: &str) -> Result<Kept, PlannerError> {
        self.call(self.post(&format!("/v1/cells/{id}/checkpoint")))
            .await
    }

    /// `POST /v1/cells/{id}/owner`: the ownership transaction;
    /// [`PlannerError::Conflict`] when it lost.
    pub async fn owner(&self, id: &str, req: &OwnerRequest) -> Result<OwnerResponse, PlannerError> {
        self.call(self.post_json(&format!("/v1/cells/{id}/owner"), req))
            .await
    }

    /// `GET /v1/policies`.
    pub async fn policies(&self) -> Result<serde_json::Value, PlannerError> {
        self.call(self.get("/v1/policies")).await
    }

    /// `PUT /v1/policies`: `{placement}`.
    pub async fn set_policies(
        &self,
        req: &serde_json::Value,
    ) -> Result<serde_json::Value, PlannerError> {
        let r = self.inner.http().put(self.inner.url("/v1/policies"));
        self.call(r.json(req)).await
    }

    /// `GET /v1/events`: the server-sent event stream, as a response to
    /// read chunk by chunk.
    pub async fn events(&self) -> Result<reqwest::Response, PlannerError> {
        let r = self.inner.authed(self.get("/v1/events"));
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
        let b = self.call_bytes(self.get("/metrics")).await?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
}
