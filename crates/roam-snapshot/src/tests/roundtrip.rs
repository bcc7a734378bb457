use crate::testutil::{sample_snapshot, Rng};
use crate::*;

fn fresh_memory(initial: &InitialImage, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len];
    for (i, page) in m.chunks_exact_mut(PAGE_SIZE).enumerate() {
        if let Some(p) = initial.page(i as u64) {
            page.copy_from_slice(p);
        }
    }
    m
}

#[test]
fn full_snapshot_round_trips_and_restores_fresh_and_non_fresh() {
    for seed in 0..4 {
        let (initial, mem, snap) = sample_snapshot(16, seed);
        let bytes = snap.encode(&EncodeOptions::default()).unwrap();
        let back = Snapshot::decode(&bytes).unwrap();
        assert_eq!(back, snap);
        // Re-encoding is deterministic.
        assert_eq!(back.encode(&EncodeOptions::default()).unwrap(), bytes);

        let mut fresh = fresh_memory(&initial, mem.len());
        back.memory
            .restore_into(&mut fresh, &initial, true)
            .unwrap();
        assert!(fresh == mem, "fresh restore, seed {seed}");

        let mut dirty = vec![0u8; mem.len()];
        Rng::new(seed + 100).fill(&mut dirty);
        back.memory
            .restore_into(&mut dirty, &initial, false)
            .unwrap();
        assert!(dirty == mem, "non-fresh restore, seed {seed}");
    }
}

#[test]
fn minimal_snapshot_round_trips() {
    let snap = Snapshot {
        module: ModuleRef {
            hash: [0; 32],
            embedded: None,
        },
        origin: Origin {
            isa: String::new(),
            roam_version: String::new(),
            created_unix_ms: 0,
            reason: String::new(),
        },
        memory: MemoryImage::empty(),
        globals: vec![],
        stack: UnwoundStack::default(),
        os_state: vec![],
        files: None,
        threads: Vec::new(),
    };
    let bytes = snap.encode(&EncodeOptions::default()).unwrap();
    assert_eq!(Snapshot::decode(&bytes).unwrap(), snap);
    // An empty file tree is distinct from no file tree.
    let mut with_files = snap.clone();
    with_files.files = Some(FileTree::default());
    let bytes = with_files.encode(&EncodeOptions::default()).unwrap();
    assert_eq!(
        Snapshot::decode(&bytes).unwrap().files,
        Some(FileTree::default())
    );
    // An embedded empty module is distinct from no module.
    let mut with_module = snap;
    with_module.module = ModuleRef::embedded(vec![]);
    let bytes = with_module.encode(&EncodeOptions::default()).unwrap();
    assert_eq!(
        Snapshot::decode(&bytes).unwrap().module.embedded,
        Some(vec![])
    );
}

#[test]
fn nan_payloads_and_extreme_values_survive() {
    let (_, _, mut snap) = sample_snapshot(1, 7);
    snap.globals = vec![
        GlobalValue {
            name: "a".into(),
            value: GlobalVal::F32(0xffc0_1234),
        },
        GlobalValue {
            name: "b".into(),
            value: GlobalVal::F64(0x7ff0_0000_0000_0001),
        },
        GlobalValue {
            name: "c".into(),
            value: GlobalVal::I32(i32::MIN),
        },
        GlobalValue {
            name: "d".into(),
            value: GlobalVal::I64(i64::MIN),
        },
        GlobalValue {
            name: "e".into(),
            value: GlobalVal::V128(u128::MAX),
        },
    ];
    let bytes = snap.encode(&EncodeOptions::default()).unwrap();
    assert_eq!(Snapshot::decode(&bytes).unwrap().globals, snap.globals);
}

#[test]
fn all_zero_and_all_data_memories() {
    let initial = InitialImage::empty();
    let (_, _, mut snap) = sample_snapshot(1, 8);
    snap.files = None;
    snap.module.embedded = None;
    for fill in [0u8, 0x5c] {
        let mem = vec![fill; 3 * WASM_PAGE_SIZE as usize];
        snap.memory = MemoryImage::capture(&mem, &initial);
        snap.stack = UnwoundStack::default();
        let back = Snapshot::decode(&snap.encode(&EncodeOptions::default()).unwrap()).unwrap();
        let mut out = vec![1u8; mem.len()];
        back.memory.restore_into(&mut out, &initial, false).unwrap();
        assert!(out == mem);
        assert_eq!(back.memory.stored_pages(), if fill == 0 { 0 } else { 48 });
    }
}

#[test]
fn threads_round_trip_as_format_2_1_and_a_program_of_one_thread_stays_2_0() {
    let (_, _, mut snap) = sample_snapshot(16, 3);
    let one = snap.encode(&EncodeOptions::default()).unwrap();
    assert_eq!(peek_header(&one).unwrap().version, Version::V2);

    snap.threads = (1..=3)
        .map(|tid| ThreadImage {
            tid,
            start_arg: 70_000 + tid,
            globals: vec![GlobalValue {
                name: "__stack_pointer".into(),
                value: GlobalVal::I32(60_000 - tid as i32),
            }],
            stack: UnwoundStack {
                buffer_offset: 0,
                capacity: 512,
                data: vec![tid as u8; 40],
            },
        })
        .collect();
    let bytes = snap.encode(&EncodeOptions::default()).unwrap();
    assert_eq!(
        peek_header(&bytes).unwrap().version,
        Version { major: 2, minor: 1 }
    );
    let back = Snapshot::decode(&bytes).unwrap();
    assert_eq!(back, snap);

    // Format 1.0 has no room for them, and says so.
    let v1 = EncodeOptions {
        format: Format::V1,
        ..EncodeOptions::default()
    };
    let err = snap.encode(&v1).unwrap_err().to_string();
    assert!(err.contains("threads"), "{err}");

    // A repeated id is refused on both sides.
    snap.threads[1].tid = 1;
    let err = snap
        .encode(&EncodeOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("thread id 1"), "{err}");
}

#[test]
fn a_2_0_file_with_threads_after_its_metadata_is_refused() {
    let (_, _, snap) = sample_snapshot(4, 1);
    let meta = crate::payload::Meta {
        module_hash: snap.module.hash,
        origin: snap.origin.clone(),
        globals: vec![],
        stack: UnwoundStack::default(),
        memory: crate::payload::MemoryMeta {
            byte_len: 0,
            initial_digest: [0; 32],
            runs: vec![],
        },
        threads: vec![ThreadImage {
            tid: 1,
            start_arg: 0,
            globals: vec![],
            stack: UnwoundStack::default(),
        }],
    };
    let bytes = meta.to_bytes().unwrap();
    assert!(crate::payload::Meta::from_bytes(&bytes, 1).is_ok());
    let err = crate::payload::Meta::from_bytes(&bytes, 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("trailing bytes"), "{err}");
}

#[test]
fn a_thread_id_past_what_wasi_threads_gives_is_refused() {
    let (_, _, mut snap) = sample_snapshot(4, 2);
    snap.threads = vec![ThreadImage {
        tid: u32::MAX,
        start_arg: 0,
        globals: vec![],
        stack: UnwoundStack::default(),
    }];
    let err = snap
        .encode(&EncodeOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("thread id 4294967295"), "{err}");
}
