//! `roam gateway`: the fixed address clients connect to, in front of cells
//! that move between nodes (`docs/gateway.md`).
//!
//! With `--planner`, the gateway routes a service only to the node the
//! planner's records say owns its cell ([`PlannerAuthority`], the gateway
//! crate's `ServeAuthority` over the planner's client: the gateway itself
//! knows no HTTP).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use roam_api::{ClientAuth, PlannerClient, PlannerError};
use roam_gateway::server::{
    Assignment, AuthorityError, AuthorityFuture, Gateway, GatewayConfig, ServeAuthority,
    ServiceConfig,
};
use roam_node::roam_auth::Token;

use crate::auth_args::ServerTlsArgs;
use crate::node_args::size;

/// `roam gateway`.
#[derive(Args, Debug)]
pub struct GatewayArgs {
    /// Where clients of --service connect.
    #[arg(long, requires = "service")]
    pub listen: Option<SocketAddr>,
    /// The service whose clients connect to --listen (the name given to
    /// `roam launch --service`).
    #[arg(long, requires = "listen")]
    pub service: Option<String>,
    /// --service speaks RESP (Redis): a client whose wait times out gets a
    /// `-ERR` line before the close.
    #[arg(long, requires = "service")]
    pub resp: bool,
    /// Another service: NAME=ADDR, or NAME=ADDR,resp (repeatable).
    #[arg(long = "route", value_name = "NAME=ADDR[,resp]")]
    pub routes: Vec<String>,
    /// Where nodes connect (`roam node --gateway`).
    #[arg(long, default_value = "127.0.0.1:7800")]
    pub control: SocketAddr,
    /// TLS and --insecure: the same as every server's. Nodes connect with
    /// their own node certificates.
    #[command(flatten)]
    pub tls: ServerTlsArgs,
    /// How long a client waits for a service's cell (not launched yet,
    /// moving, or its node unreachable) before it gets an error, seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    pub wait_timeout: f64,
    /// Client-to-cell bytes buffered per connection; beyond, the gateway
    /// stops reading the client.
    #[arg(long, value_name = "SIZE", value_parser = size, default_value = "1MiB")]
    pub conn_buffer: u64,
    /// Client-to-cell bytes buffered over all connections.
    #[arg(long, value_name = "SIZE", value_parser = size, default_value = "256MiB")]
    pub total_buffer: u64,
    /// Most clients at once; more wait in the listen backlog.
    #[arg(long, default_value_t = roam_gateway::server::DEFAULT_MAX_CLIENTS)]
    pub max_clients: usize,
    /// The planner (URL or host:port; several, comma-separated, for planners
    /// on one etcd): a node's `Serve` changes a service's route only if the
    /// planner says that node owns the service's cell at that generation.
    /// Under TLS the gateway asks with its own certificate (which needs the
    /// client usage: `roam cert gateway` makes it so). Without it, any node
    /// that links may serve any service.
    #[arg(long, value_name = "URL")]
    pub planner: Option<String>,
    /// The planner's bearer token, when it has one (`roam planner
    /// --token-file`).
    #[arg(long, requires = "planner")]
    pub token_file: Option<PathBuf>,
    /// Serve `GET /metrics` (Prometheus text) on ADDR: clients and bytes
    /// per service, the round trip to each client machine and to each
    /// node. Plain HTTP, without authentication, and it names client
    /// addresses: an address that is not loopback needs --insecure.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
}

/// The planner as the gateway's authority on who may serve a service.
#[derive(Debug)]
struct PlannerAuthority(PlannerClient);

impl ServeAuthority for PlannerAuthority {
    fn assignments<'a>(&'a self, service: &'a str) -> AuthorityFuture<'a> {
        Box::pin(async move {
            let answer = self.0.service(service).await.map_err(|e| match e {
                e if e.is_unreachable() => AuthorityError::Unreachable(e.to_string()),
                e @ PlannerError::Client(_) => AuthorityError::Unreachable(e.to_string()),
                e @ PlannerError::Decode { .. } => AuthorityError::Malformed(e.to_string()),
                e => AuthorityError::Refused(e.to_string()),
            })?;
            if answer.service != service {
                return Err(AuthorityError::Malformed(format!(
                    "asked about service {service}, answered about {:?}",
                    answer.service
                )));
            }
            answer
                .cells
                .into_iter()
                .map(|c| {
                    roam_wire::ident::check_cell_id(&c.cell)
                        .and_then(|()| roam_wire::ident::check_node_name(&c.owner))
                        .map_err(|e| AuthorityError::Malformed(e.to_string()))?;
                    Ok(Assignment {
                        cell: c.cell,
                        node: c.owner,
                        generation: c.generation,
                    })
                })
                .collect()
        })
    }
}

/// The planner's client for `--planner`, with the gateway's own
/// certificate under TLS.
fn authority(
    a: &GatewayArgs,
    tls: Option<&roam_node::roam_auth::Identity>,
) -> Result<Option<Arc<dyn ServeAuthority>>> {
    let Some(url) = &a.planner else {
        return Ok(None);
    };
    if let Some(id) = tls {
        id.check_client_usage().map_err(|e| {
            anyhow::anyhow!(
                "--planner: the gateway's certificate cannot be used to ask the planner ({e}): \
                 re-issue it with this version's `roam cert gateway NAME --force`, which adds \
                 the client usage"
            )
        })?;
    }
    let auth = ClientAuth {
        tls: tls.map(|id| id.client().clone()),
        token: a.token_file.as_deref().map(Token::load).transpose()?,
    };
    let client = PlannerClient::with_auth(url, &auth).context("--planner")?;
    Ok(Some(Arc::new(PlannerAuthority(client))))
}

fn route(s: &str) -> Result<ServiceConfig> {
    let (name, rest) = s
        .split_once('=')
        .with_context(|| format!("--route {s}: expected NAME=ADDR or NAME=ADDR,resp"))?;
    let (addr, resp) = match rest.strip_suffix(",resp") {
        Some(a) => (a, true),
        None => (rest, false),
    };
    let listen = addr
        .parse()
        .with_context(|| format!("--route {s}: {addr:?} is not an address like 0.0.0.0:6379"))?;
    Ok(ServiceConfig {
        name: name.to_string(),
        listen,
        resp,
    })
}

/// `roam gateway`.
pub fn gateway(a: GatewayArgs) -> Result<i32> {
    let mut services = Vec::new();
    if let (Some(name), Some(listen)) = (&a.service, a.listen) {
        services.push(ServiceConfig {
            name: name.clone(),
            listen,
            resp: a.resp,
        });
    }
    for r in &a.routes {
        services.push(route(r)?);
    }
    if !(a.wait_timeout.is_finite() && a.wait_timeout > 0.0 && a.wait_timeout <= 86_400.0) {
        bail!("--wait-timeout must be between 0 and 86400 seconds");
    }
    if let Some(m) = a.metrics {
        if !m.ip().is_loopback() && !a.tls.insecure {
            bail!(
                "--metrics {m}: the metrics port has no authentication and names client \
                 addresses; bind it to loopback (127.0.0.1:PORT), or add --insecure"
            );
        }
    }
    let tls = a.tls.identity()?;
    let authority = authority(&a, tls.as_ref())?;
    let cfg = GatewayConfig {
        services,
        control: a.control,
        tls,
        insecure: a.tls.insecure,
        wait_timeout: Duration::from_secs_f64(a.wait_timeout),
        conn_buffer: usize::try_from(a.conn_buffer).context("--conn-buffer is too large")?,
        total_buffer: usize::try_from(a.total_buffer).context("--total-buffer is too large")?,
        max_clients: a.max_clients,
        window: roam_gateway::server::DEFAULT_WINDOW,
        link_backlog: roam_gateway::server::DEFAULT_LINK_BACKLOG,
        authority,
    };
    let names: Vec<_> = cfg.services.iter().map(|s| s.name.clone()).collect();
    crate::runtime()?.block_on(async move {
        let gw = Gateway::bind(cfg).await?;
        for n in &names {
            eprintln!(
                "roam gateway: service {n} on {}",
                gw.service_addr(n).expect("bound")
            );
        }
        eprintln!("roam gateway: nodes connect to {}", gw.control_addr());
        if let Some(addr) = a.metrics {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--metrics {addr}: cannot listen"))?;
            eprintln!(
                "roam gateway: metrics on http://{}/metrics",
                l.local_addr()?
            );
            let handle = gw.handle();
            let app = axum::Router::new().route(
                "/metrics",
                axum::routing::get(move || {
                    let text = handle.metrics_text();
                    async move {
                        (
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            text,
                        )
                    }
                }),
            );
            tokio::spawn(async move {
                if let Err(e) = axum::serve(l, app).await {
                    eprintln!("roam gateway: the metrics server stopped: {e}");
                }
            });
        }
        match &a.planner {
            Some(p) => eprintln!(
                "roam gateway: a Serve changes a route only for the owner the planner at {p} names"
            ),
            None => {
                eprintln!("roam gateway: no --planner: any node that links may serve any service")
            }
        }
        gw.run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
        Ok(0)
    })
}
