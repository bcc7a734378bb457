//! A client of a node's control API, used by the `roam` command and by
//! nodes talking to each other.
//!
//! With [`ClientAuth`], requests go over mutual TLS (the CA checks the
//! node; the client certificate, if any, identifies the caller) and carry
//! the bearer token. An `https://` address, or TLS material with a bare
//! `host:port`, selects TLS. Redirects (a cell's log on the node it moved
//! to) are followed here, not by reqwest, so the token goes along.

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::types::*;

/// Talks to one node.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    auth: ClientAuth,
}

/// The credentials a client presents.
#[derive(Debug, Clone, Default)]
pub struct ClientAuth {
    /// The cluster CA and, optionally, a client certificate.
    pub tls: Option<roam_auth::ClientTls>,
    /// The bearer token.
    pub token: Option<roam_auth::Token>,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer.
    #[error("cannot reach {addr}: {source}")]
    Unreachable {
        /// The node's address.
        addr: String,
        /// What failed.
        #[source]
        source: reqwest::Error,
    },
    /// The node answered, but not what the call expects (a body that does
    /// not parse, a stream that broke off).
    #[error("{0}")]
    Api(String),
    /// The node refused the request; `kind` says how (its status code).
    #[error("{message}")]
    Refused {
        /// The kind of refusal, from the answer's status code.
        kind: Refusal,
        /// The node's reason, and the status code.
        message: String,
    },
    /// The node answered that it has no such thing (`404`): a cell, a
    /// migration or a kept checkpoint it does not know.
    #[error("{0}")]
    NotFound(String),
    /// The TLS configuration could not be built.
    #[error("cannot set up TLS for {addr}")]
    Tls {
        /// The node's address.
        addr: String,
        /// What failed.
        #[source]
        source: roam_auth::rustls::Error,
    },
    /// An `https://` address without a CA to check the node against.
    #[error("{addr} is an https:// address: give the cluster CA with --tls-ca (or ROAM_TLS_CA)")]
    NoCa {
        /// The node's address.
        addr: String,
    },
}

/// How a node (or the planner) refused a request: its typed error, as the
/// status code carried it (`docs/node-api.md`, "Errors"). A `404` is
/// [`ClientError::NotFound`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `400`: the request itself is wrong; asking again fails again.
    BadRequest,
    /// `401`: no token, or the wrong one.
    Unauthorized,
    /// `403`: this caller may not do this.
    Forbidden,
    /// `409`: not now (another state, no room, an id taken).
    Conflict,
    /// `413`: a body over one of the server's caps.
    TooLarge,
    /// `502`: a node it had to ask failed.
    Upstream,
    /// `503`: nothing can serve it now.
    Unavailable,
    /// `500`: the server itself failed.
    Internal,
    /// Any other status code.
    Other(u16),
}

impl Refusal {
    /// The kind of a status code.
    pub fn of(status: u16) -> Refusal {
        match status {
            400 => Refusal::BadRequest,
            401 => Refusal::Unauthorized,
            403 => Refusal::Forbidden,
            409 => Refusal::Conflict,
            413 => Refusal::TooLarge,
            502 => Refusal::Upstream,
            503 => Refusal::Unavailable,
            500 => Refusal::Internal,
            s => Refusal::Other(s),
        }
    }
}

impl ClientError {
    /// How the server refused the request, if it did.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            ClientError::Refused { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

impl Client {
    /// A client for the node whose control API listens on `addr`
    /// (`host:port`, or a full `http://` URL).
    pub fn new(addr: &str) -> Client {
        Client::with_auth(addr, &ClientAuth::default())
            .expect("a client without TLS material builds")
    }

    /// A client of a node presenting `auth`. A bare `host:port` means
    /// `https://` when `auth` has TLS material, `http://` otherwise. Under
    /// TLS the server's certificate must carry the `node` role.
    pub fn with_auth(addr: &str, auth: &ClientAuth) -> Result<Client, ClientError> {
        Client::for_role(addr, auth, roam_auth::Role::Node)
    }

    /// [`Client::with_auth`] for a server of `role`.
    pub(crate) fn for_role(
        addr: &str,
        auth: &ClientAuth,
        role: roam_auth::Role,
    ) -> Result<Client, ClientError> {
        let base = if addr.starts_with("http://") || addr.starts_with("https://") {
            addr.trim_end_matches('/').to_string()
        } else if auth.tls.is_some() {
            format!("https://{addr}")
        } else {
            format!("http://{addr}")
        };
        // Servers close a connection that sends no request head for
        // `serve::ConnLimits::header_timeout` (15 s): drop idle ones first,
        // so a request never goes out on a connection being closed.
        let mut b = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none());
        match &auth.tls {
            Some(tls) => {
                let cfg = tls
                    .config_for(roam_auth::ALPN_HTTP, role)
                    .map_err(|source| ClientError::Tls {
                        addr: base.clone(),
                        source,
                    })?;
                b = b.use_preconfigured_tls((*cfg).clone());
            }
            None if base.starts_with("https://") => return Err(ClientError::NoCa { addr: base }),
            None => {}
        }
        let http = b.build().map_err(|source| ClientError::Unreachable {
            addr: base.clone(),
            source,
        })?;
        Ok(Client {
            base,
            http,
            auth: auth.clone(),
        })
    }

    /// The base URL (`http(s)://host:port`).
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// Send a request built on this client's connection and credentials;
    /// the status and body, whatever the status (for clients that must
    /// tell one error status from another).
    pub(crate) async fn send_raw(
        &self,
        r: reqwest::RequestBuilder,
    ) -> Result<(reqwest::StatusCode, Vec<u8>), ClientError> {
        let r = self
            .authed(r)
            .send()
            .await
            .map_err(|source| ClientError::Unreachable {
                addr: self.base.clone(),
                source,
            })?;
        let status = r.status();
        let body = r.bytes().await.map_err(|source| ClientError::Unreachable {
            addr: self.base.clone(),
            source,
        })?;
        Ok((status, body.to_vec()))
    }

    /// The HTTP client (for requests sent with [`Client::send_raw`]).
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Add the token, if any, to a request.
    pub(crate) fn authed(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.auth.token {
            Some(t) => r.header(reqwest::header::AUTHORIZATION, t.header_value()),
            None => r,
        }
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
            let msg = format!("{msg} ({status})");
            return Err(if status == reqwest::StatusCode::NOT_FOUND {
                ClientError::NotFound(msg)
            } else {
                ClientError::Refused {
                    kind: Refusal::of(status.as_u16()),
                    message: msg,
                }
            });
        }
        serde_json::from_slice(&body)
            .map_err(|e| ClientError::Api(format!("unexpected answer from {}: {e}", self.base)))
    }

    /// A successful answer's raw body, or the error it carries.
    async fn body_of(&self, r: reqwest::Response) -> Result<Vec<u8>, ClientError> {
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

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.parse(self.authed(self.http.get(self.url(path))).send().await)
            .await
    }

    async fn post_json<B: serde::Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.parse(
            self.authed(self.http.post(self.url(path)))
                .json(body)
                .send()
                .await,
        )
        .await
    }

    async fn post<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.parse(self.authed(self.http.post(self.url(path))).send().await)
            .await
    }

    /// `GET /v1/node`.
    pub async fn node(&self) -> Result<NodeInfo, ClientError> {
        self.get("/v1/node").await
    }

    /// `POST /v1/modules`.
    pub async fn upload_module(&self, bytes: Vec<u8>) -> Result<ModuleInfo, ClientError> {
        self.parse(
            self.authed(self.http.post(self.url("/v1/modules")))
                .body(bytes)
                .send()
                .await,
        )
        .await
    }

    /// `POST /v1/cells`.
    pub async fn launch(&self, req: &LaunchRequest) -> Result<LaunchResponse, ClientError> {
        self.post_json("/v1/cells", req).await
    }

    /// `POST /v1/cells/restore`: start a cell from a kept checkpoint.
    pub async fn restore(&self, req: &RestoreRequest) -> Result<CellInfo, ClientError> {
        self.post_json("/v1/cells/restore", req).await
    }

    /// `POST /v1/cells/{id}/keep`: checkpoint a cell and keep the snapshot
    /// on another node.
    pub async fn keep(&self, id: &str, req: &KeepRequest) -> Result<KeepResponse, ClientError> {
        self.post_json(&format!("/v1/cells/{id}/keep"), req).await
    }

    /// `POST /v1/kept/{cell}/missing` (asked of a holder): which of these
    /// page hashes it lacks for the cell's kept checkpoint.
    pub async fn kept_missing<H>(&self, cell: &str, hashes: &[H]) -> Result<Vec<H>, ClientError>
    where
        H: serde::Serialize + serde::de::DeserializeOwned,
    {
        self.post_json(&format!("/v1/kept/{cell}/missing"), &hashes)
            .await
    }

    /// `PUT /v1/kept/{cell}` (asked of a holder): a kept checkpoint's
    /// manifest, state and the pages the holder lacked, streamed from
    /// `chunks` as the sender produces them, so that neither end holds the
    /// whole body. An error from `chunks` aborts the request.
    pub async fn put_kept(
        &self,
        cell: &str,
        chunks: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, std::io::Error>>,
    ) -> Result<serde_json::Value, ClientError> {
        let stream = futures_util::stream::unfold(chunks, |mut rx| async move {
            rx.recv().await.map(|c| (c, rx))
        });
        self.parse(
            self.authed(self.http.put(self.url(&format!("/v1/kept/{cell}"))))
                .body(reqwest::Body::wrap_stream(stream))
                .send()
                .await,
        )
        .await
    }

    /// `POST /v1/kept/{cell}/grant` (asked of a holder by the planner):
    /// let a node store, or read one version of, the cell's kept
    /// checkpoints for the next few minutes.
    pub async fn grant_kept(&self, cell: &str, grant: &KeptGrant) -> Result<(), ClientError> {
        let _: serde_json::Value = self
            .post_json(&format!("/v1/kept/{cell}/grant"), grant)
            .await?;
        Ok(())
    }

    /// `POST /v1/kept/{cell}/commit` (asked of a holder by the planner):
    /// the planner recorded kept checkpoint `snapshot`; older ones go.
    pub async fn commit_kept(&self, cell: &str, snapshot: &str) -> Result<(), ClientError> {
        let body = serde_json::json!({ "snapshot": snapshot });
        let _: serde_json::Value = self
            .post_json(&format!("/v1/kept/{cell}/commit"), &body)
            .await?;
        Ok(())
    }

    /// `GET /v1/kept/{cell}?snapshot=NAME` (asked of a holder): the kept
    /// checkpoint of that name, written to `out` as it arrives. Refused
    /// once it passes `limit` bytes; returns the bytes written.
    pub async fn get_kept(
        &self,
        cell: &str,
        snapshot: &str,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
        limit: u64,
    ) -> Result<u64, ClientError> {
        use tokio::io::AsyncWriteExt;
        let r = self
            .authed(
                self.http
                    .get(self.url(&format!("/v1/kept/{cell}?snapshot={snapshot}"))),
            )
            .send()
            .await;
        let mut r = r.map_err(|source| ClientError::Unreachable {
            addr: self.base.clone(),
            source,
        })?;
        if !r.status().is_success() {
            return self.parse::<u64>(Ok(r)).await;
        }
        let mut written = 0u64;
        loop {
            let chunk = r.chunk().await.map_err(|source| ClientError::Unreachable {
                addr: self.base.clone(),
                source,
            })?;
            let Some(chunk) = chunk else { break };
            written = written.saturating_add(chunk.len() as u64);
            if written > limit {
                return Err(ClientError::Api(format!(
                    "the kept checkpoint from {} is larger than this node's limit of {limit} bytes",
                    self.base
                )));
            }
            out.write_all(&chunk)
                .await
                .map_err(|e| ClientError::Api(format!("cannot store the kept checkpoint: {e}")))?;
        }
        out.flush()
            .await
            .map_err(|e| ClientError::Api(format!("cannot store the kept checkpoint: {e}")))?;
        Ok(written)
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
        let mut url = self.url(&format!("/v1/cells/{id}/logs"));
        let mut hops = 0;
        let r = loop {
            let r = self
                .authed(self.http.get(&url))
                .send()
                .await
                .map_err(|source| ClientError::Unreachable {
                    addr: self.base.clone(),
                    source,
                })?;
            let next = r
                .status()
                .is_redirection()
                .then(|| r.headers().get(reqwest::header::LOCATION))
                .flatten()
                .and_then(|l| l.to_str().ok())
                .map(str::to_string);
            match next {
                // A cell that moved more often than this went in circles.
                Some(next) if hops < 16 => {
                    hops += 1;
                    url = next;
                }
                _ => break r,
            }
        };
        self.body_of(r).await
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
        self.post_json(&format!("/v1/cells/{id}/migrate"), req)
            .await
    }

    /// `GET /v1/migrations/{id}`.
    pub async fn migration(&self, id: &str) -> Result<MigrationStatus, ClientError> {
        self.get(&format!("/v1/migrations/{id}")).await
    }

    /// `GET /v1/migrations/{id}/timings` (asked of a destination after the
    /// commit): its share of the pause.
    pub async fn inbound_timings(&self, id: &str) -> Result<DestTimings, ClientError> {
        self.parse(
            self.authed(
                self.http
                    .get(self.url(&format!("/v1/migrations/{id}/timings"))),
            )
            .timeout(Duration::from_secs(5))
            .send()
            .await,
        )
        .await
    }

    /// `POST /v1/migrations/{id}/resolve` (asked of a destination).
    pub async fn resolve(&self, id: &str) -> Result<Resolution, ClientError> {
        self.parse(
            self.authed(
                self.http
                    .post(self.url(&format!("/v1/migrations/{id}/resolve"))),
            )
            .timeout(Duration::from_secs(10))
            .send()
            .await,
        )
        .await
    }
}
