//! Builds a snapshot from fuzzer bytes (memory contents, initial image,
//! metadata), then checks encode -> decode -> restore reproduces the memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roam_snapshot::*;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (ctl, rest) = data.split_at(4);
    // One or two wasm pages; sparse writes so all page kinds occur.
    let wasm_pages = 1 + (ctl[0] & 1) as usize;
    let len = wasm_pages * WASM_PAGE_SIZE as usize;
    let split = rest.len() / 2;
    let (seg, writes) = rest.split_at(split);
    let seg_off = (u64::from(ctl[1]) * 512) % (len as u64 - seg.len().min(len) as u64 + 1);
    let initial = InitialImage::new(WASM_PAGE_SIZE, vec![(seg_off, seg.to_vec())]);
    let mut mem = vec![0u8; len];
    for (i, p) in mem.chunks_exact_mut(PAGE_SIZE).enumerate() {
        if let Some(init) = initial.page(i as u64) {
            p.copy_from_slice(init);
        }
    }
    for w in writes.chunks(3) {
        if let [a, b, v] = *w {
            let at = (usize::from(a) << 8 | usize::from(b)) * 7 % len;
            mem[at] = v;
        }
    }
    let snap = Snapshot {
        module: ModuleRef::embedded(seg.to_vec()),
        origin: Origin {
            isa: "fuzz".into(),
            roam_version: "0".into(),
            created_unix_ms: u64::from(ctl[2]),
            reason: "fuzz".into(),
        },
        memory: MemoryImage::capture(&mem, &initial),
        globals: vec![GlobalValue {
            name: "g".into(),
            value: GlobalVal::I32(i32::from(ctl[3])),
        }],
        stack: UnwoundStack {
            buffer_offset: 0,
            capacity: 8 + u32::from(ctl[3]),
            data: vec![ctl[3]; ctl[3] as usize],
        },
        os_state: writes.to_vec(),
        files: None,
        // 0 to 3 other threads (format 2.1), each with its own stack.
        threads: (1..=u32::from(ctl[1] % 4))
            .map(|tid| ThreadImage {
                tid,
                start_arg: u32::from(ctl[2]).wrapping_mul(tid),
                globals: vec![GlobalValue {
                    name: "g".into(),
                    value: GlobalVal::I32(tid as i32),
                }],
                stack: UnwoundStack {
                    buffer_offset: 0,
                    capacity: 8 + u32::from(ctl[3]),
                    data: vec![tid as u8; ctl[3] as usize],
                },
            })
            .collect(),
    };
    // Both formats; the last byte of the control word picks which one
    // restores below.
    let mut back = None;
    for format in [Format::V1, Format::V2] {
        if format == Format::V1 && !snap.threads.is_empty() {
            // Format 1.0 holds one thread, and says so.
            assert!(snap.encode(&EncodeOptions { level: 1, format }).is_err());
            continue;
        }
        let bytes = snap
            .encode(&EncodeOptions { level: 1, format })
            .expect("valid snapshot encodes");
        let b = Snapshot::decode(&bytes).expect("encoded snapshot decodes");
        assert_eq!(b, snap);
        if (format == Format::V2) == (ctl[0] & 2 != 0 || !snap.threads.is_empty()) {
            back = Some(b);
        }
    }
    let back = back.expect("one format chosen");
    let mut fresh = vec![0u8; len];
    for (i, p) in fresh.chunks_exact_mut(PAGE_SIZE).enumerate() {
        if let Some(init) = initial.page(i as u64) {
            p.copy_from_slice(init);
        }
    }
    back.memory
        .restore_into(&mut fresh, &initial, true)
        .expect("restore fresh");
    assert!(fresh == mem);
    let mut dirty = vec![0xA5u8; len];
    back.memory
        .restore_into(&mut dirty, &initial, false)
        .expect("restore non-fresh");
    assert!(dirty == mem);
});
