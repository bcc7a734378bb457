//! Gateway–node frames (`Header::parse`, then `ToGateway::decode` and
//! `ToNode::decode`): a node or a gateway controls every byte. Parsing must
//! return a message or an error, never panic or allocate past `MAX_FRAME`,
//! and every message that decodes must re-encode to the same frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roam_gateway::proto::{Header, ToGateway, ToNode, FRAME_HEADER, MAX_FRAME};

fuzz_target!(|input: &[u8]| {
    let mut rest = input;
    while rest.len() >= FRAME_HEADER {
        let (head, tail) = rest.split_at(FRAME_HEADER);
        let Ok(h) = Header::parse(head.try_into().expect("12 bytes")) else {
            return;
        };
        assert!(h.len <= MAX_FRAME);
        // The CRC is skipped: it would hide the decoders from the fuzzer.
        let payload = &tail[..h.len.min(tail.len())];
        rest = &tail[payload.len()..];
        if let Ok(m) = ToGateway::decode(h.kind, payload) {
            let mut again = Vec::new();
            m.encode(&mut again).expect("a decoded message encodes");
            assert_eq!(&again[FRAME_HEADER..], payload);
            assert_eq!(again[4], h.kind);
        }
        if let Ok(m) = ToNode::decode(h.kind, payload) {
            let mut again = Vec::new();
            m.encode(&mut again).expect("a decoded message encodes");
            assert_eq!(&again[FRAME_HEADER..], payload);
        }
    }
});
