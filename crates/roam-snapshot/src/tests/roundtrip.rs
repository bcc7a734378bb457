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
