//! A client of a node's control API, used by the `roam` command and by
//! nodes talking to each other.

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::types::*;

/// Talks to one node.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer.
    #[error("cannot reach node at {addr}: {source}")]
    Unreachable {
        /// The node's address.
        addr: String,
        /// What failed.
        #[source]
        source: reqwest::Error,
    },
    /// The node answered with an error.
    #[error("{0}")]
    Api(String),
}

impl Client {
    /// A client for the node whose control API listens on `addr`
    /// (`host:port`, or a full `http://` URL).
    pub fn new(addr: &str) -> Client {
        let base = if addr.starts_with("http://") || addr.starts_with("https://") {
            addr.trim_end_matches('/').to_string()
        } else {
            format!("http://{addr}")
        };
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client without TLS builds");
        Client { base, http }
    }

    async fn parse<T: DeserializeOwned>(
        &self,
        r: Result<reqwest::Response, reqwest::Error>,
    ) -> Result<T, ClientError> {
        let r = r.map_err(|source| ClientError::Unreachable {
            addr: self.base.clone(),
            source,
        })?;
        let status = r.status();
        let body = r.bytes().await.map_err(|source| ClientError::Unreachable {
            addr: self.base.clone(),
            source,
        })?;
        if !status.is_success() {
            let msg = serde_json::from_slice::<ApiError>(&body)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
            return Err(ClientError::Api(format!("{} ({status})", msg)));
        }
        serde_json::from_slice(&body)
            .map_err(|e| ClientError::Api(format!("unexpected answer from {}: {e}", self.base)))
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.parse(self.http.get(self.url(path)).send().await).await
    }

    async fn post<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.parse(self.http.post(self.url(path)).send().await)
            .await
    }

    /// `GET /v1/node`.
    pub async fn node(&self) -> Result<NodeInfo, ClientError> {
        self.get("/v1/node").await
    }

    /// `POST /v1/modules`.
    pub async fn upload_module(&self, bytes: Vec<u8>) -> Result<ModuleInfo, ClientError> {
        self.parse(
            self.http
                .post(self.url("/v1/modules"))
                .body(bytes)
                .send()
                .await,
        )
        .await
    }

    /// `POST /v1/cells`.
    pub async fn launch(&self, req: &LaunchRequest) -> Result<LaunchResponse, ClientError> {
        self.parse(self.http.post(self.url("/v1/cells")).json(req).send().await)
            .await
    }

    /// `GET /v1/cells`.
    pub async fn cells(&self) -> Result<Vec<CellInfo>, ClientError> {
        self.get("/v1/cells").await
    }

    /// `GET /v1/cells/{id}`.
    pub async fn cell(&self, id: &str) -> Result<CellInfo, ClientError> {
        self.get(&format!("/v1/cells/{id}")).await
    }

    /// `GET /v1/cells/{id}/logs`, following the cell to wherever it runs.
    pub async fn logs(&self, id: &str) -> Result<Vec<u8>, ClientError> {
        let r = self
            .http
            .get(self.url(&format!("/v1/cells/{id}/logs")))
            .send()
            .await
            .map_err(|source| ClientError::Unreachable {
                addr: self.base.clone(),
                source,
            })?;
        if !r.status().is_success() {
            return self.parse::<Vec<u8>>(Ok(r)).await;
        }
        r.bytes()
            .await
            .map(|b| b.to_vec())
            .map_err(|source| ClientError::Unreachable {
                addr: self.base.clone(),
                source,
            })
    }

    /// `POST /v1/cells/{id}/kill`.
    pub async fn kill(&self, id: &str) -> Result<CellInfo, ClientError> {
        self.post(&format!("/v1/cells/{id}/kill")).await
    }

    /// `POST /v1/cells/{id}/checkpoint`.
    pub async fn checkpoint(&self, id: &str) -> Result<serde_json::Value, ClientError> {
        self.post(&format!("/v1/cells/{id}/checkpoint")).await
    }

    /// `POST /v1/cells/{id}/migrate`.
    pub async fn migrate(
        &self,
        id: &str,
        req: &MigrateRequest,
    ) -> Result<MigrateResponse, ClientError> {
        self.parse(
            self.http
                .post(self.url(&format!("/v1/cells/{id}/migrate")))
                .json(req)
                .send()
                .await,
        )
        .await
    }

    /// `GET /v1/migrations/{id}`.
    pub async fn migration(&self, id: &str) -> Result<MigrationStatus, ClientError> {
        self.get(&format!("/v1/migrations/{id}")).await
    }

    /// `POST /v1/migrations/{id}/resolve` (asked of a destination).
    pub async fn resolve(&self, id: &str) -> Result<Resolution, ClientError> {
        self.parse(
            self.http
                .post(self.url(&format!("/v1/migrations/{id}/resolve")))
                .timeout(Duration::from_secs(10))
                .send()
                .await,
        )
        .await
    }
}
