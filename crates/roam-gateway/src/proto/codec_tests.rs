//! Round trips and hostile inputs of the message codec.

use super::super::frame::{Header, FRAME_HEADER};
use super::*;

fn split(frame: &[u8]) -> (u8, &[u8]) {
    let h = Header::parse(frame[..FRAME_HEADER].try_into().unwrap()).unwrap();
    h.check(&frame[FRAME_HEADER..]).unwrap();
    (h.kind, &frame[FRAME_HEADER..])
}

fn all_to_gateway() -> Vec<ToGateway> {
    vec![
        ToGateway::Hello(Hello {
            version: 1,
            node: "node-a.lan".into(),
            window: 256 << 10,
        }),
        ToGateway::Serve {
            service: "kv".into(),
            cell: "c-1".into(),
            generation: 3,
            conns: vec![ConnResume {
                conn: 9,
                rx_next: 10,
                tx_from: 11,
            }],
        },
        ToGateway::Hold {
            service: "kv".into(),
            cell: "c-1".into(),
            generation: 3,
        },
        ToGateway::Unserve {
            service: "kv".into(),
            cell: "c-1".into(),
            generation: 4,
        },
        ToGateway::Data {
            conn: 1,
            offset: 5,
            bytes: b"abc".to_vec(),
        },
        ToGateway::Consumed { conn: 1, offset: 2 },
        ToGateway::Shutdown { conn: 1, offset: 3 },
        ToGateway::Closed { conn: 1 },
        ToGateway::Ping { nonce: u64::MAX },
    ]
}

fn all_to_node() -> Vec<ToNode> {
    vec![
        ToNode::Welcome {
            version: 1,
            window: 1 << 20,
        },
        ToNode::Refused {
            reason: "no".into(),
        },
        ToNode::Open {
            service: "kv".into(),
            conn: 7,
            peer: "127.0.0.1:5555".into(),
        },
        ToNode::Data {
            conn: 7,
            offset: 0,
            bytes: vec![0; MAX_DATA],
        },
        ToNode::Eof { conn: 7, offset: 9 },
        ToNode::Gone { conn: 7 },
        ToNode::Delivered { conn: 7, offset: 9 },
        ToNode::Stale {
            service: "kv".into(),
            cell: "c-1".into(),
            generation: 3,
            current: 5,
        },
        ToNode::Pong {
            nonce: 42,
            gateway: "gw-0123456789abcdef".into(),
        },
    ]
}

#[test]
fn every_message_roundtrips() {
    for m in all_to_gateway() {
        let mut v = Vec::new();
        m.encode(&mut v).unwrap();
        let (k, p) = split(&v);
        assert_eq!(ToGateway::decode(k, p).unwrap(), m);
        // Any strict prefix is an error, not a panic or a shorter message.
        for cut in 0..p.len() {
            if !matches!(m, ToGateway::Data { .. }) || cut < 16 {
                assert!(ToGateway::decode(k, &p[..cut]).is_err(), "{m:?} cut {cut}");
            }
        }
        // The other direction does not know it.
        assert!(matches!(
            ToNode::decode(k, p),
            Err(DecodeError::UnknownType(_))
        ));
    }
    for m in all_to_node() {
        let mut v = Vec::new();
        m.encode(&mut v).unwrap();
        let (k, p) = split(&v);
        assert_eq!(ToNode::decode(k, p).unwrap(), m);
    }
}

#[test]
fn hostile_fields_are_refused_precisely() {
    let enc = |m: &ToGateway| {
        let mut v = Vec::new();
        m.encode(&mut v).unwrap();
        v
    };
    // A bad service name.
    let v = enc(&ToGateway::Hold {
        service: "../etc".into(),
        cell: "c".into(),
        generation: 0,
    });
    let (k, p) = split(&v);
    let e = ToGateway::decode(k, p).unwrap_err();
    assert!(
        e.to_string().starts_with("Hold message")
            && std::error::Error::source(&e)
                .unwrap()
                .to_string()
                .starts_with("service name \"../etc\" is invalid"),
        "{e}"
    );
    // A window of zero.
    let v = enc(&ToGateway::Hello(Hello {
        version: 1,
        node: "n".into(),
        window: 0,
    }));
    let (k, p) = split(&v);
    assert!(matches!(
        ToGateway::decode(k, p),
        Err(DecodeError::Window { window: 0, .. })
    ));
    // A Serve claiming four billion resume points in a tiny payload.
    let mut w = Writer::new("Serve");
    name_fields(&mut w, "kv", "c", 0).unwrap();
    w.u32(u32::MAX);
    assert!(matches!(
        ToGateway::decode(0x02, &w.b),
        Err(DecodeError::TooLong { field: "conns", .. })
    ));
    let mut w = Writer::new("Serve");
    name_fields(&mut w, "kv", "c", 0).unwrap();
    w.u32(1000);
    assert!(matches!(
        ToGateway::decode(0x02, &w.b),
        Err(DecodeError::Truncated { field: "conns", .. })
    ));
    // Data over the chunk limit, and offsets that wrap.
    let mut p = vec![0u8; 16 + MAX_DATA + 1];
    assert!(matches!(
        ToGateway::decode(0x05, &p),
        Err(DecodeError::TooLong { field: "bytes", .. })
    ));
    p.truncate(17);
    p[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        ToNode::decode(0x84, &p),
        Err(DecodeError::Overflow { .. })
    ));
    // Trailing bytes, control characters, unknown types.
    assert!(matches!(
        ToGateway::decode(0x08, &[0; 9]),
        Err(DecodeError::Trailing { extra: 1, .. })
    ));
    let mut w = Writer::new("Refused");
    w.str("reason", "a\nb", 10).unwrap();
    assert!(matches!(
        ToNode::decode(0x82, &w.b),
        Err(DecodeError::Control { .. })
    ));
    assert!(matches!(
        ToGateway::decode(0x42, &[]),
        Err(DecodeError::UnknownType(0x42))
    ));
}

#[test]
fn oversized_values_do_not_encode() {
    let m = ToGateway::Data {
        conn: 1,
        offset: 0,
        bytes: vec![0; MAX_DATA + 1],
    };
    assert!(m.encode(&mut Vec::new()).is_err());
    let m = ToNode::Refused {
        reason: "x".repeat(MAX_REASON_LEN + 1),
    };
    assert!(m.encode(&mut Vec::new()).is_err());
}

#[test]
fn decoders_are_total_on_arbitrary_payloads() {
    // A cheap stand-in for the fuzz target in every test run: random and
    // mutated payloads for every type byte, both directions. Whatever
    // decodes must re-encode to the same bytes.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let seeds: Vec<Vec<u8>> = all_to_gateway()
        .iter()
        .map(|m| {
            let mut v = Vec::new();
            m.encode(&mut v).unwrap();
            v
        })
        .chain(all_to_node().iter().map(|m| {
            let mut v = Vec::new();
            m.encode(&mut v).unwrap();
            v
        }))
        .collect();
    let mut decoded = 0;
    for i in 0..200_000u64 {
        let r = next();
        let (kind, payload) = if i % 2 == 0 {
            let len = (r >> 8) as usize % 96;
            (
                (r & 0xff) as u8,
                (0..len).map(|_| next() as u8).collect::<Vec<u8>>(),
            )
        } else {
            let s = &seeds[(r as usize >> 8) % seeds.len()];
            let mut p = s[FRAME_HEADER..s.len().min(FRAME_HEADER + 200)].to_vec();
            for _ in 0..1 + (r >> 40) % 3 {
                if !p.is_empty() {
                    let at = next() as usize % p.len();
                    p[at] = next() as u8;
                }
            }
            let cut = next() as usize % (p.len() + 1);
            if next() % 4 == 0 {
                p.truncate(cut);
            }
            (s[4], p)
        };
        if let Ok(m) = ToGateway::decode(kind, &payload) {
            let mut v = Vec::new();
            m.encode(&mut v).unwrap();
            assert_eq!(&v[FRAME_HEADER..], &payload[..], "{m:?}");
            decoded += 1;
        }
        if let Ok(m) = ToNode::decode(kind, &payload) {
            let mut v = Vec::new();
            m.encode(&mut v).unwrap();
            assert_eq!(&v[FRAME_HEADER..], &payload[..], "{m:?}");
            decoded += 1;
        }
    }
    assert!(
        decoded > 1000,
        "the mutations reached the decoders ({decoded})"
    );
}
