//! `roam inspect`: a human-readable account of a snapshot.

use anyhow::Context;
use roam_wasi::OsState;

use crate::args::InspectArgs;

pub fn main(a: InspectArgs) -> anyhow::Result<i32> {
    let (snap, header) = roam_snapshot::Snapshot::read_file_with_header(&a.snapshot)
        .with_context(|| format!("cannot load snapshot {}", a.snapshot.display()))?;
    println!("{}", snap.summary().with_header(&header));
    match OsState::decode(&snap.os_state) {
        Ok(os) => print_net(&os),
        Err(e) => println!("os state:     cannot be read: {e}"),
    }
    Ok(0)
}

/// The program's listeners and connections, if it has any.
fn print_net(os: &OsState) {
    let net = &os.net;
    if net.listeners.is_empty() && net.conns.is_empty() {
        return;
    }
    let labels: Vec<String> = net
        .listeners
        .iter()
        .map(|l| {
            if l.open {
                l.label.clone()
            } else {
                format!("{} (closed)", l.label)
            }
        })
        .collect();
    println!("listeners:    {}", labels.join(", "));
    println!("connections:  {}", net.conns.len());
    for c in &net.conns {
        let mut state = Vec::new();
        if !c.accepted {
            state.push("waiting to be accepted");
        }
        for (on, what) in [
            (c.rx_eof.is_some(), "client ended its stream"),
            (c.shut_rd, "shut for reading"),
            (c.shut_wr, "shut for writing"),
            (c.reset, "reset"),
            (c.closed, "closed by the program"),
        ] {
            if on {
                state.push(what);
            }
        }
        println!(
            "  {} from {}: {} B unread at offset {}, {} B undelivered at offset {}{}{}",
            c.conn,
            if c.peer.is_empty() { "?" } else { &c.peer },
            c.rx.len(),
            c.rx_offset,
            c.tx.len(),
            c.tx_offset,
            if state.is_empty() { "" } else { "; " },
            state.join(", ")
        );
    }
}
