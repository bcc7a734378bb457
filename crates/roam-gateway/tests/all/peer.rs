//! A node peer that speaks the gateway protocol frame by frame, and a
//! gateway started for one test.

use std::net::SocketAddr;
use std::time::Duration;

use roam_gateway::proto::{read_frame, FrameError, ToGateway, ToNode};
use roam_gateway::server::{Gateway, GatewayConfig, GatewayHandle};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// Every wait in these tests is bounded by this.
pub const LONG: Duration = Duration::from_secs(20);

/// A gateway on loopback ports chosen by the kernel.
pub struct TestGateway {
    pub control: SocketAddr,
    pub service: SocketAddr,
    pub handle: GatewayHandle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestGateway {
    pub async fn start(edit: impl FnOnce(&mut GatewayConfig)) -> TestGateway {
        // ROAM_LOG=debug shows what the gateway and the links do.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("ROAM_LOG"))
            .with_test_writer()
            .try_init();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut cfg = GatewayConfig::new("kv", any, any);
        edit(&mut cfg);
        let gw = Gateway::bind(cfg).await.expect("gateway binds");
        let (control, service, handle) = (
            gw.control_addr(),
            gw.service_addr("kv").unwrap(),
            gw.handle(),
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(gw.run(async {
            let _ = rx.await;
        }));
        TestGateway {
            control,
            service,
            handle,
            stop: Some(tx),
            task,
        }
    }

    /// Stop the gateway (its death, as far as clients and nodes can tell).
    pub async fn kill(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = tokio::time::timeout(LONG, &mut self.task).await;
    }
}

/// A node speaking frames by hand.
pub struct RawNode {
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
}

impl RawNode {
    pub async fn connect(addr: SocketAddr) -> RawNode {
        let s = TcpStream::connect(addr).await.unwrap();
        let (rd, wr) = s.into_split();
        RawNode {
            rd: BufReader::new(rd),
            wr,
        }
    }

    pub async fn send(&mut self, m: &ToGateway) {
        let mut b = Vec::new();
        m.encode(&mut b).unwrap();
        self.send_raw(&b).await;
    }

    pub async fn send_raw(&mut self, b: &[u8]) {
        // The gateway may already have closed the link; the test then
        // reads its Refused.
        let _ = self.wr.write_all(b).await;
    }

    /// The next message within `d`: `Err(())` if none came, `Ok(None)`
    /// when the gateway closed the link.
    pub async fn recv_within(&mut self, d: Duration) -> Result<Option<ToNode>, ()> {
        match tokio::time::timeout(d, read_frame(&mut self.rd)).await {
            Err(_) => Err(()),
            Ok(Err(FrameError::Closed | FrameError::Io(_))) => Ok(None),
            Ok(Err(e)) => panic!("bad frame from the gateway: {e}"),
            Ok(Ok((k, p))) => Ok(Some(
                ToNode::decode(k, &p).expect("the gateway sends valid messages"),
            )),
        }
    }

    /// The next message, or `None` when the gateway closed the link.
    pub async fn recv(&mut self) -> Option<ToNode> {
        match tokio::time::timeout(LONG, read_frame(&mut self.rd)).await {
            Err(_) => panic!("no message from the gateway within {LONG:?}"),
            Ok(Err(FrameError::Closed)) => None,
            Ok(Err(FrameError::Io(_))) => None,
            Ok(Err(e)) => panic!("bad frame from the gateway: {e}"),
            Ok(Ok((k, p))) => {
                Some(ToNode::decode(k, &p).expect("the gateway sends valid messages"))
            }
        }
    }
}
