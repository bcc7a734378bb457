//! The hub's state rules, driven from both sides without a wasm engine.

use super::*;
use crate::errno::Errno;
use std::sync::atomic::{AtomicUsize, Ordering};

fn hub() -> Arc<NetHub> {
    NetHub::new(&["kv".to_string(), "admin".to_string()])
}

/// A hub with one accepted connection 7 on "kv".
fn with_conn() -> Arc<NetHub> {
    let h = hub();
    h.open("kv", 7, "1.2.3.4:5").unwrap();
    assert_eq!(h.accept(0).unwrap(), Some(7));
    h.take_outgoing();
    h
}

fn read_all(h: &NetHub, conn: ConnId) -> Vec<u8> {
    match h.recv(conn, usize::MAX, false).unwrap() {
        Recv::Data(d) => d,
        other => panic!("expected data, got {other:?}"),
    }
}

#[test]
fn open_queues_until_accepted_in_order() {
    let h = hub();
    assert_eq!(h.accept(0).unwrap(), None);
    h.open("kv", 2, "a").unwrap();
    h.open("kv", 1, "b").unwrap();
    h.open("admin", 3, "").unwrap();
    assert!(h.listener_ready(0));
    assert_eq!(h.accept(0).unwrap(), Some(2));
    assert_eq!(h.accept(0).unwrap(), Some(1));
    assert_eq!(h.accept(0).unwrap(), None);
    assert!(!h.listener_ready(0));
    assert_eq!(h.accept(1).unwrap(), Some(3));
    assert_eq!(h.open("kv", 2, "x"), Err(NetError::DuplicateConn(2)));
    assert_eq!(
        h.open("nope", 9, "x"),
        Err(NetError::NoListener("nope".into()))
    );
    assert_eq!(h.open("kv", 9, "a\0b"), Err(NetError::BadPeer));
    assert_eq!(h.accept(5), Err(Errno::BADF));
}

#[test]
fn backlog_and_connection_counts_are_capped() {
    let h = hub();
    for i in 0..MAX_BACKLOG as u64 {
        h.open("kv", i, "p").unwrap();
    }
    assert_eq!(
        h.open("kv", 100_000, "p"),
        Err(NetError::BacklogFull("kv".into()))
    );
    for i in 0..(MAX_CONNS - MAX_BACKLOG) as u64 {
        h.open("admin", 10_000 + i, "p").unwrap();
    }
    assert_eq!(h.open("admin", 99_999, "p"), Err(NetError::TooManyConns));
}

#[test]
fn deliver_dedups_replays_and_refuses_gaps() {
    let h = with_conn();
    h.deliver(7, 0, b"hello").unwrap();
    // A replay from an older offset adds only what is new.
    h.deliver(7, 2, b"llo wor").unwrap();
    h.deliver(7, 0, b"he").unwrap();
    let e = h.deliver(7, 12, b"x").unwrap_err();
    assert_eq!(
        e,
        NetError::Gap {
            conn: 7,
            expected: 9,
            offset: 12
        }
    );
    assert!(e.to_string().contains("resend from 9"), "{e}");
    assert_eq!(read_all(&h, 7), b"hello wor");
    // After a read, a replay of read bytes is still dropped.
    h.deliver(7, 0, b"hello world").unwrap();
    assert_eq!(read_all(&h, 7), b"ld");
    assert_eq!(h.deliver(8, 0, b"x"), Err(NetError::UnknownConn(8)));
    assert_eq!(
        h.deliver(7, u64::MAX, b"xy"),
        Err(NetError::OffsetOverflow(7))
    );
}

#[test]
fn peek_leaves_bytes_and_zero_length_reads_return_nothing() {
    let h = with_conn();
    assert_eq!(h.recv(7, 10, false).unwrap(), Recv::WouldBlock);
    h.deliver(7, 0, b"abc").unwrap();
    assert_eq!(h.recv(7, 2, true).unwrap(), Recv::Data(b"ab".to_vec()));
    assert_eq!(h.recv(7, 2, false).unwrap(), Recv::Data(b"ab".to_vec()));
    assert_eq!(h.recv(7, 0, false).unwrap(), Recv::Data(vec![]));
    assert_eq!(h.recv(7, 9, false).unwrap(), Recv::Data(b"c".to_vec()));
}

#[test]
fn the_window_bounds_input_and_opens_as_the_program_reads() {
    let h = with_conn();
    let w = h.window() as usize;
    h.deliver(7, 0, &vec![1u8; w]).unwrap();
    let e = h.deliver(7, w as u64, b"x").unwrap_err();
    assert!(
        matches!(e, NetError::OverWindow { end, limit, .. } if end == w as u64 + 1 && limit == w as u64)
    );
    assert_eq!(h.recv(7, 100, false).unwrap(), Recv::Data(vec![1u8; 100]));
    h.deliver(7, w as u64, &[2u8; 100]).unwrap();
    assert_eq!(
        h.take_outgoing(),
        vec![NetOut::Consumed {
            conn: 7,
            offset: 100
        }]
    );
}

#[test]
fn output_is_bounded_by_the_window_and_resent_until_delivered() {
    let h = with_conn();
    let w = h.window() as usize;
    assert_eq!(h.send(7, b"abc", false).unwrap(), Some(3));
    assert_eq!(
        h.take_outgoing(),
        vec![NetOut::Data {
            conn: 7,
            offset: 0,
            bytes: b"abc".to_vec()
        }]
    );
    // Nothing new: nothing sent twice.
    assert_eq!(h.take_outgoing(), vec![]);
    assert_eq!(h.send(7, &vec![0u8; w], false).unwrap(), Some(w - 3));
    assert_eq!(h.send(7, b"z", false).unwrap(), None);
    assert_eq!(h.readiness(7).room, 0);
    assert!(!h.readiness(7).writable);
    h.take_outgoing();
    assert_eq!(
        h.delivered(7, w as u64 + 1),
        Err(NetError::BeyondWritten {
            conn: 7,
            offset: w as u64 + 1,
            written: w as u64
        })
    );
    h.delivered(7, 2).unwrap();
    h.delivered(7, 1).unwrap(); // stale confirmations are harmless
    assert_eq!(h.readiness(7).room, 2);
    assert_eq!(h.send(7, b"xyz", false).unwrap(), Some(2));
    let out = h.take_outgoing();
    assert_eq!(
        out,
        vec![NetOut::Data {
            conn: 7,
            offset: w as u64,
            bytes: b"xy".to_vec()
        }]
    );
}

#[test]
fn an_overdraft_is_held_back_until_the_window_opens() {
    let h = with_conn();
    let w = h.window() as usize;
    assert_eq!(h.send(7, &vec![1u8; w], false).unwrap(), Some(w));
    assert_eq!(h.send(7, b"more", false).unwrap(), None);
    assert_eq!(h.send(7, b"more", true).unwrap(), Some(4));
    // Once: a second overdraft waits.
    assert_eq!(h.send(7, b"x", true).unwrap(), None);
    let out = h.take_outgoing();
    assert!(matches!(&out[..], [NetOut::Data { offset: 0, bytes, .. }] if bytes.len() == w));
    h.delivered(7, 10).unwrap();
    assert_eq!(
        h.take_outgoing(),
        vec![NetOut::Data {
            conn: 7,
            offset: w as u64,
            bytes: b"more".to_vec()
        }]
    );
}

#[test]
fn peer_eof_ends_the_stream_after_buffered_bytes() {
    let h = with_conn();
    h.deliver(7, 0, b"ab").unwrap();
    assert!(matches!(
        h.peer_eof(7, 1),
        Err(NetError::EofBeforeData { have: 2, .. })
    ));
    h.peer_eof(7, 2).unwrap();
    h.peer_eof(7, 2).unwrap();
    assert!(matches!(h.peer_eof(7, 3), Err(NetError::AfterEof { .. })));
    assert!(matches!(
        h.deliver(7, 2, b"c"),
        Err(NetError::AfterEof { .. })
    ));
    assert!(h.readiness(7).readable);
    assert!(!h.readiness(7).hangup);
    assert_eq!(read_all(&h, 7), b"ab");
    // Readable (a read returns 0) and still writable: a half-closed client
    // is not a hangup, the program can still answer it.
    let r = h.readiness(7);
    assert!(r.readable && r.writable && !r.hangup, "{r:?}");
    assert_eq!(h.recv(7, 10, false).unwrap(), Recv::Eof);
    assert_eq!(h.send(7, b"bye", false).unwrap(), Some(3));
    // Once the program shuts its side too, both directions are over.
    h.shutdown(7, false, true).unwrap();
    assert!(h.readiness(7).hangup);
}

#[test]
fn reset_gives_buffered_bytes_then_connreset_and_drops_output() {
    let h = with_conn();
    h.deliver(7, 0, b"ab").unwrap();
    h.send(7, b"unsent", false).unwrap();
    h.peer_reset(7);
    assert!(h.readiness(7).hangup && h.readiness(7).writable);
    assert_eq!(h.send(7, b"x", false), Err(Errno::CONNRESET));
    assert_eq!(read_all(&h, 7), b"ab");
    assert_eq!(h.recv(7, 10, false), Err(Errno::CONNRESET));
    assert_eq!(h.shutdown(7, false, true), Err(Errno::NOTCONN));
    // Output was discarded: only the consumed offset goes out.
    assert_eq!(
        h.take_outgoing(),
        vec![NetOut::Consumed { conn: 7, offset: 2 }]
    );
    h.close(7);
    assert_eq!(h.take_outgoing(), vec![NetOut::Closed { conn: 7 }]);
    assert!(h.state().conns.is_empty(), "forgotten once closed and told");
}

#[test]
fn a_reset_before_accept_removes_the_connection() {
    let h = hub();
    h.open("kv", 1, "p").unwrap();
    h.open("kv", 2, "p").unwrap();
    h.peer_reset(1);
    assert_eq!(h.accept(0).unwrap(), Some(2));
    assert_eq!(h.state().conns.len(), 1);
}

#[test]
fn shutdown_and_close_are_reported_once_after_the_data() {
    let h = with_conn();
    h.send(7, b"last", false).unwrap();
    h.shutdown(7, false, true).unwrap();
    assert_eq!(h.send(7, b"x", false), Err(Errno::PIPE));
    assert_eq!(
        h.take_outgoing(),
        vec![
            NetOut::Data {
                conn: 7,
                offset: 0,
                bytes: b"last".to_vec()
            },
            NetOut::Shutdown { conn: 7, offset: 4 }
        ]
    );
    h.deliver(7, 0, b"ignored?").unwrap();
    h.close(7);
    // Unread input is discarded (consumed), the close is told, and the
    // connection lives on until its output is delivered.
    assert_eq!(
        h.take_outgoing(),
        vec![
            NetOut::Consumed { conn: 7, offset: 8 },
            NetOut::Closed { conn: 7 }
        ]
    );
    assert_eq!(h.state().conns.len(), 1);
    // Input after the close is consumed on arrival.
    h.deliver(7, 8, b"zz").unwrap();
    assert_eq!(
        h.take_outgoing(),
        vec![NetOut::Consumed {
            conn: 7,
            offset: 10
        }]
    );
    h.delivered(7, 4).unwrap();
    assert!(h.state().conns.is_empty());
    assert_eq!(h.delivered(7, 4), Err(NetError::UnknownConn(7)));
}

#[test]
fn shut_rd_discards_input() {
    let h = with_conn();
    h.deliver(7, 0, b"abc").unwrap();
    h.shutdown(7, true, false).unwrap();
    assert_eq!(h.recv(7, 10, false).unwrap(), Recv::Eof);
    h.deliver(7, 3, b"de").unwrap();
    assert_eq!(
        h.take_outgoing(),
        vec![NetOut::Consumed { conn: 7, offset: 5 }]
    );
}

#[test]
fn closing_a_listener_closes_its_waiting_connections() {
    let h = hub();
    h.open("kv", 1, "p").unwrap();
    h.close_listener(0);
    assert_eq!(h.listeners(), vec!["admin".to_string()]);
    assert_eq!(h.open("kv", 2, "p"), Err(NetError::NoListener("kv".into())));
    assert_eq!(h.take_outgoing(), vec![NetOut::Closed { conn: 1 }]);
    assert!(h.state().conns.is_empty());
    h.state().validate().unwrap();
}

#[test]
fn resume_points_report_offsets_and_resend_everything_undelivered() {
    let h = with_conn();
    h.open("admin", 9, "q").unwrap();
    h.deliver(7, 0, b"request").unwrap();
    assert_eq!(h.recv(7, 3, false).unwrap(), Recv::Data(b"req".to_vec()));
    h.send(7, b"reply", false).unwrap();
    h.take_outgoing();
    h.delivered(7, 2).unwrap();
    let r = h.resume_points();
    assert_eq!(
        r,
        vec![
            Resume {
                conn: 7,
                listener: "kv".into(),
                rx_next: 7,
                tx_from: 2
            },
            Resume {
                conn: 9,
                listener: "admin".into(),
                rx_next: 0,
                tx_from: 0
            }
        ]
    );
    assert_eq!(
        h.take_outgoing(),
        vec![
            NetOut::Data {
                conn: 7,
                offset: 2,
                bytes: b"ply".to_vec()
            },
            NetOut::Consumed { conn: 7, offset: 3 }
        ]
    );
}

#[test]
fn reset_all_is_the_standalone_restore_rule() {
    let h = with_conn();
    h.open("kv", 8, "p").unwrap();
    h.deliver(7, 0, b"x").unwrap();
    h.send(7, b"y", false).unwrap();
    h.reset_all();
    let st = h.state();
    assert_eq!(st.conns.len(), 1, "the waiting connection is gone");
    assert!(st.conns[0].reset && st.conns[0].tx.is_empty());
    assert_eq!(read_all(&h, 7), b"x");
    assert_eq!(h.recv(7, 1, false), Err(Errno::CONNRESET));
    assert_eq!(h.accept(0).unwrap(), None);
    st.validate().unwrap();
}

#[test]
fn notify_fires_once_per_batch_of_news_from_the_guest() {
    let h = with_conn();
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    h.set_notify(Arc::new(move || {
        m.fetch_add(1, Ordering::SeqCst);
    }));
    h.send(7, b"a", false).unwrap();
    h.send(7, b"b", false).unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 1);
    h.take_outgoing();
    h.send(7, b"c", false).unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 2);
    // Backend calls never notify; a read that consumes nothing neither.
    h.take_outgoing();
    h.deliver(7, 0, b"z").unwrap();
    assert_eq!(h.recv(7, 1, true).unwrap(), Recv::Data(b"z".to_vec()));
    assert_eq!(n.load(Ordering::SeqCst), 2);
}

#[test]
fn backend_activity_kicks_the_guest() {
    let h = with_conn();
    let i = Interrupt::new();
    h.attach(i.clone());
    let k = i.kicks();
    h.deliver(7, 0, b"x").unwrap();
    assert_ne!(i.kicks(), k);
    let k = i.kicks();
    assert!(h.deliver(7, 5, b"x").is_err());
    assert_eq!(i.kicks(), k, "a refused call changes nothing");
}

pub(crate) fn sample_state() -> NetState {
    let h = with_conn();
    h.open("kv", 8, "waiting").unwrap();
    h.deliver(7, 0, b"in").unwrap();
    h.send(7, b"out", false).unwrap();
    h.peer_eof(7, 2).unwrap();
    h.state()
}

#[test]
fn state_validation_catches_every_cross_reference() {
    let good = sample_state();
    good.validate().unwrap();
    type Case = (&'static str, Box<dyn Fn(&mut NetState)>);
    let cases: Vec<Case> = vec![
        ("window", Box::new(|s| s.window = 0)),
        ("window", Box::new(|s| s.window = MAX_WINDOW + 1)),
        (
            "buffers more",
            Box::new(|s| s.conns[0].rx = vec![0; DEFAULT_WINDOW as usize + 1]),
        ),
        (
            "buffers more",
            Box::new(|s| s.conns[0].tx = vec![0; 2 * DEFAULT_WINDOW as usize + 1]),
        ),
        ("out of order", Box::new(|s| s.conns.swap(0, 1))),
        ("does not exist", Box::new(|s| s.conns[0].listener = 5)),
        (
            "does not exist",
            Box::new(|s| s.listeners[0].backlog = vec![99]),
        ),
        ("fresh", Box::new(|s| s.listeners[0].backlog = vec![7])),
        ("fresh", Box::new(|s| s.listeners[1].backlog = vec![8])),
        (
            "waits on no listener",
            Box::new(|s| s.listeners[0].backlog.clear()),
        ),
        ("end of stream", Box::new(|s| s.conns[0].rx_eof = Some(1))),
        ("overflowing", Box::new(|s| s.conns[0].rx_offset = u64::MAX)),
        ("still holds output", Box::new(|s| s.conns[0].reset = true)),
        ("label", Box::new(|s| s.listeners[0].label = String::new())),
        ("peer", Box::new(|s| s.conns[0].peer = "x".repeat(300))),
        ("closed listener", Box::new(|s| s.listeners[0].open = false)),
        (
            "listeners",
            Box::new(|s| {
                s.listeners = (0..=MAX_LISTENERS)
                    .map(|i| ListenerState {
                        label: format!("l{i}"),
                        open: true,
                        backlog: vec![],
                    })
                    .collect()
            }),
        ),
    ];
    for (want, f) in cases {
        let mut s = good.clone();
        f(&mut s);
        let e = s.validate().unwrap_err();
        assert!(e.contains(want), "expected {want:?} in {e:?}");
    }
}

#[test]
fn a_restored_hub_resends_output_and_repeats_the_close() {
    let h = with_conn();
    h.send(7, b"abc", false).unwrap();
    h.close(7);
    h.take_outgoing();
    let r = NetHub::from_state(h.state());
    assert_eq!(
        r.take_outgoing(),
        vec![
            NetOut::Data {
                conn: 7,
                offset: 0,
                bytes: b"abc".to_vec()
            },
            NetOut::Closed { conn: 7 }
        ]
    );
}
