//! The module fetch path: a destination without the cell's module gets it
//! from the source, checks it against the offered hash, and compiles it;
//! a peer that sends other bytes than it offered is refused.
//!
//! Host nodes have a cache each (see `Node::spawn`), so every host-to-host
//! migration in these tests makes the destination fetch.

use roam_wire::{recv, send, CellSpec, Features, Hello, Mode, Msg, Offer};

use super::*;

/// The module files in a node's cache.
fn cached_modules(node: &Node) -> Vec<String> {
    std::fs::read_dir(node.dir.path().join("cache/modules"))
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn destination_fetches_a_missing_module_and_runs_the_cell() {
    let expected = reference(&SMALL);
    let (a, b) = (Node::start(Isa::X86_64), Node::start(Isa::X86_64));
    let id = a.launch(&SMALL);
    let hash = a.cell(&id).unwrap()["module"].as_str().unwrap().to_string();
    assert!(
        !cached_modules(&b).iter().any(|m| m.contains(&hash)),
        "the destination has the module before the migration: {:?}",
        cached_modules(&b)
    );
    let (out, status) = migrate(&id, &a, &b, "stop-and-copy", &[]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        both_logs(&a, &b)
    );
    assert!(
        a.log().contains("phase=sending-module"),
        "the source never sent the module\n{}",
        a.log()
    );
    assert!(status["summary"]["wire_bytes"].as_u64().unwrap() > 0);
    let end = b.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", both_logs(&a, &b));
    assert_eq!(end["code"], 0, "{end}");
    assert_eq!(text(&logs(&id, &a)), text(&expected));
    assert!(
        cached_modules(&b).iter().any(|m| m.contains(&hash)),
        "the fetched module is not in the destination's cache: {:?}",
        cached_modules(&b)
    );
}

/// A hostile source offers one module hash and sends other bytes: the
/// destination refuses before compiling, says why, and keeps nothing.
#[test]
fn a_module_that_does_not_match_the_offered_hash_is_refused() {
    let b = Node::start(Isa::X86_64);
    let addr = b.info()["migrate_addr"].as_str().unwrap().to_string();
    let real = std::fs::read(workload("dirty")).unwrap();
    let offered = *blake3::hash(b"a module the peer does not send").as_bytes();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let reason = rt.block_on(async {
        let sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let (mut rd, mut wr) = sock.into_split();
        let theirs = recv(&mut rd).await.unwrap();
        assert!(matches!(theirs, Msg::Hello(_)), "{theirs:?}");
        send(
            &mut wr,
            &Msg::Hello(Hello::new("hostile", "x86_64", Features::default())),
        )
        .await
        .unwrap();
        let offer = Offer {
            migration_id: "m-hostile".into(),
            cell: CellSpec {
                id: "c-hostile".into(),
                module_hash: offered,
                args: vec!["dirty".into()],
                env: Vec::new(),
                dirs: Vec::new(),
                launched_unix_ms: 0,
                hops: 0,
                max_memory: 64 << 20,
                service: None,
                generation: None,
                cpu: Default::default(),
                far: None,
            },
            mode: Mode::StopAndCopy,
            module_len: real.len() as u64,
            memory_bytes: 1 << 20,
        };
        send(&mut wr, &Msg::Offer(offer)).await.unwrap();
        match recv(&mut rd).await.unwrap() {
            Msg::Accept(a) => assert!(a.need_module, "the node claims a module it cannot have"),
            m => panic!("expected accept, got {m:?}"),
        }
        for (k, chunk) in real.chunks(1 << 20).enumerate() {
            let m = Msg::ModuleChunk {
                offset: (k << 20) as u64,
                bytes: chunk.to_vec(),
            };
            send(&mut wr, &m).await.unwrap();
        }
        match tokio::time::timeout(Duration::from_secs(60), recv(&mut rd)).await {
            Ok(Ok(Msg::Abort { reason })) => reason,
            Ok(Ok(m)) => panic!("expected abort, got {m:?}"),
            Ok(Err(e)) => panic!("the node closed without saying why: {e}"),
            Err(_) => panic!("the node did not answer within 60 s"),
        }
    });
    assert!(
        reason.contains("does not match the offered hash"),
        "{reason}"
    );
    assert!(b.cell("c-hostile").is_none(), "{}", b.log());
    assert!(
        cached_modules(&b).is_empty(),
        "the refused module reached the cache: {:?}",
        cached_modules(&b)
    );
    assert!(
        !b.dir.path().join("state/cells/c-hostile").exists(),
        "a cell directory was left behind"
    );
    wait_for("the refusal in the log", Duration::from_secs(10), || {
        b.log()
            .contains("does not match the offered hash")
            .then_some(())
    });
}

/// A source that fails after the destination fetched and compiled its
/// module and built the receiving instance (here: a final state that does
/// not decode): the destination says why in its log, frees what it took,
/// and the resolve endpoint answers `aborted`.
#[test]
fn a_destination_that_cannot_finish_says_why_and_frees_what_it_took() {
    let (a, b) = (Node::start(Isa::X86_64), Node::start(Isa::X86_64));
    let id = a.launch(&SMALL);
    let hash = a.cell(&id).unwrap()["module"].as_str().unwrap().to_string();
    let module = std::fs::read(a.dir.path().join(format!("cache/modules/{hash}.wasm"))).unwrap();
    let module_hash = *blake3::hash(&module).as_bytes();
    let addr = b.info()["migrate_addr"].as_str().unwrap().to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let reason = rt.block_on(async {
        let sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let (mut rd, mut wr) = sock.into_split();
        let _ = recv(&mut rd).await.unwrap();
        let hello = Hello::new("broken", "x86_64", Features::default());
        send(&mut wr, &Msg::Hello(hello)).await.unwrap();
        let offer = Offer {
            migration_id: "m-broken".into(),
            cell: CellSpec {
                id: "c-broken".into(),
                module_hash,
                args: vec!["dirty".into()],
                env: Vec::new(),
                dirs: vec!["/data".into()],
                launched_unix_ms: 0,
                hops: 0,
                max_memory: 64 << 20,
                service: None,
                generation: None,
                cpu: Default::default(),
                far: None,
            },
            mode: Mode::StopAndCopy,
            module_len: module.len() as u64,
            memory_bytes: 1 << 20,
        };
        send(&mut wr, &Msg::Offer(offer)).await.unwrap();
        assert!(matches!(recv(&mut rd).await.unwrap(), Msg::Accept(_)));
        for (k, chunk) in module.chunks(1 << 20).enumerate() {
            let m = Msg::ModuleChunk {
                offset: (k << 20) as u64,
                bytes: chunk.to_vec(),
            };
            send(&mut wr, &m).await.unwrap();
        }
        let prepared = recv(&mut rd).await.unwrap();
        assert!(matches!(prepared, Msg::Prepared), "{prepared:?}");
        let fin = roam_wire::Final {
            snapshot: vec![9; 10],
            memory_bytes: 1 << 20,
        };
        send(&mut wr, &Msg::Final(Box::new(fin))).await.unwrap();
        match tokio::time::timeout(Duration::from_secs(60), recv(&mut rd)).await {
            Ok(Ok(Msg::Abort { reason })) => reason,
            other => panic!("expected abort, got {other:?}"),
        }
    });
    assert!(reason.contains("final state"), "{reason}");
    wait_for("the reason in the log", Duration::from_secs(10), || {
        b.log().contains("freeing what it took").then_some(())
    });
    assert!(b.cell("c-broken").is_none(), "{}", b.log());
    // The directory goes once the destination has lingered for the source
    // to read its abort (up to a second after the reason is logged).
    wait_for(
        "the cell directory to be removed",
        Duration::from_secs(10),
        || (!b.dir.path().join("state/cells/c-broken").exists()).then_some(()),
    );
    let (st, body) = http_post(&b.addr, "/v1/migrations/m-broken/resolve", &Value::Null).unwrap();
    assert_eq!((st, text(&body)), (200, "\"aborted\"".to_string()));
}
