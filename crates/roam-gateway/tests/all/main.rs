//! The gateway's integration tests: one binary, real TCP clients, node
//! peers that speak the protocol by hand (`hostile`) or through the real
//! link and `NetHub` (`flow`).

mod authority;
mod flow;
mod hostile;
mod peer;
mod program;
mod rtt;
mod tls;
