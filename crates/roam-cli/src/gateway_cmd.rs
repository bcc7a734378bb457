//! `roam gateway`: the fixed address clients connect to, in front of cells
//! that move between nodes (`docs/gateway.md`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use roam_gateway::server::{Gateway, GatewayConfig, ServiceConfig};

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
    let tls = a.tls.identity()?;
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
        gw.run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
        Ok(0)
    })
}
