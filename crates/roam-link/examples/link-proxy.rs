//! A stand-alone emulated link, for benchmarks by hand: forwards TCP from a
//! local address to a target with a rate and a one-way delay per direction,
//! until killed. Kernel shaping has no delay on machines without netem, so
//! this adds it in user space (see docs/network-emulation.md).
//!
//! ```text
//! cargo run -p roam-link --example link-proxy -- LISTEN TARGET [RATE [DELAY_MS [RATE_BACK [DELAY_BACK_MS]]]]
//! cargo run -p roam-link --example link-proxy -- 127.0.0.1:7000 127.0.0.1:7001 10mbit 20
//! ```

use std::process::ExitCode;
use std::time::Duration;

use roam_link::{parse_rate, DirectionConfig, LinkConfig, LinkProxy};

const USAGE: &str =
    "usage: link-proxy LISTEN TARGET [RATE [DELAY_MS [RATE_BACK [DELAY_BACK_MS]]]]\n  \
                     RATE like 10mbit or unlimited (default); DELAY_MS one-way, default 0;\n  \
                     the *_BACK values (target to client) default to the forward ones";

fn parse(
    args: &[String],
) -> Result<(std::net::SocketAddr, std::net::SocketAddr, LinkConfig), String> {
    if !(2..=6).contains(&args.len()) {
        return Err(USAGE.to_string());
    }
    let addr = |s: &String| s.parse().map_err(|e| format!("bad address {s:?}: {e}"));
    let rate = |s: Option<&String>| {
        s.map_or(Ok(roam_link::Rate::UNLIMITED), |s| {
            parse_rate(s).map_err(|e| e.to_string())
        })
    };
    let delay = |s: Option<&String>| {
        s.map_or(Ok(Duration::ZERO), |s| {
            s.parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|e| format!("bad delay {s:?} (milliseconds): {e}"))
        })
    };
    let fwd = DirectionConfig::new(rate(args.get(2))?, delay(args.get(3))?);
    let back = DirectionConfig::new(
        args.get(4).map_or(Ok(fwd.rate), |s| rate(Some(s)))?,
        args.get(5).map_or(Ok(fwd.delay), |s| delay(Some(s)))?,
    );
    let config = LinkConfig {
        client_to_server: fwd,
        server_to_client: back,
        max_in_flight: None,
    };
    Ok((addr(&args[0])?, addr(&args[1])?, config))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (listen, target, config) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(msg) => {
            eprintln!("link-proxy: {msg}");
            return ExitCode::from(2);
        }
    };
    let proxy = match LinkProxy::start(listen, target, config).await {
        Ok(proxy) => proxy,
        Err(e) => {
            eprintln!("link-proxy: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "link-proxy: {} -> {target}: {} +{:?} forward, {} +{:?} back",
        proxy.local_addr(),
        config.client_to_server.rate,
        config.client_to_server.delay,
        config.server_to_client.rate,
        config.server_to_client.delay
    );
    std::future::pending::<()>().await;
    ExitCode::SUCCESS
}
