//! Deterministic helpers shared by the unit tests.

use crate::*;

/// xorshift64*: tiny, deterministic, good enough to shuffle test data.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_u64() as u8;
        }
    }
}

/// An initial image with a few non-zero pages in the first 64 KiB page, and
/// a memory of `wasm_pages` 64 KiB pages mixing zero, initial and random pages
/// (including an initial page later zeroed and one modified by one byte).
pub(crate) fn sample_memory(wasm_pages: u64, seed: u64) -> (InitialImage, Vec<u8>) {
    let mut rng = Rng::new(seed);
    let mut seg = vec![0u8; 6 * PAGE_SIZE];
    rng.fill(&mut seg);
    let initial = InitialImage::new(
        WASM_PAGE_SIZE,
        vec![(1024, seg.clone()), (40_000, vec![9; 100])],
    );
    let mut mem = vec![0u8; (wasm_pages * WASM_PAGE_SIZE) as usize];
    mem[1024..1024 + seg.len()].copy_from_slice(&seg);
    mem[40_000..40_100].fill(9);
    // Page 2 (inside the initial image) zeroed, page 3 slightly changed.
    mem[2 * PAGE_SIZE..3 * PAGE_SIZE].fill(0);
    mem[3 * PAGE_SIZE + 17] ^= 0xff;
    let pages = mem.len() / PAGE_SIZE;
    for p in 16..pages {
        match rng.below(4) {
            0 => rng.fill(&mut mem[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]),
            1 => mem[p * PAGE_SIZE + rng.below(PAGE_SIZE as u64) as usize] = 1,
            _ => {}
        }
    }
    (initial, mem)
}

/// A snapshot with every field populated.
pub(crate) fn sample_snapshot(wasm_pages: u64, seed: u64) -> (InitialImage, Vec<u8>, Snapshot) {
    let (initial, mem) = sample_memory(wasm_pages, seed);
    let module = ModuleRef::embedded(b"\0asm\x01\0\0\0 pretend prepared module".to_vec());
    let files = FileTree {
        entries: vec![
            FileEntry {
                preopen: "/data".into(),
                path: "sub".into(),
                kind: FileKind::Dir,
                mode: 0o755,
                mtime_ns: 1,
            },
            FileEntry {
                preopen: "/data".into(),
                path: "sub/a.txt".into(),
                kind: FileKind::File {
                    data: b"hello".to_vec(),
                },
                mode: 0o644,
                mtime_ns: 1_700_000_000_000_000_000,
            },
            FileEntry {
                preopen: "/data".into(),
                path: "link".into(),
                kind: FileKind::Symlink {
                    target: "sub/a.txt".into(),
                },
                mode: 0o777,
                mtime_ns: 2,
            },
        ],
    };
    let snap = Snapshot {
        module,
        origin: Origin {
            isa: "x86_64".into(),
            roam_version: "0.1.0".into(),
            created_unix_ms: 1_700_000_000_123,
            reason: "api".into(),
        },
        memory: MemoryImage::capture(&mem, &initial),
        globals: vec![
            GlobalValue {
                name: "__stack_pointer".into(),
                value: GlobalVal::I32(65_000),
            },
            GlobalValue {
                name: "g64".into(),
                value: GlobalVal::I64(-5),
            },
            GlobalValue {
                name: "nan".into(),
                value: GlobalVal::F32(0x7fc0_0001),
            },
            GlobalValue {
                name: "d".into(),
                value: GlobalVal::F64(1.5f64.to_bits()),
            },
            GlobalValue {
                name: "v".into(),
                value: GlobalVal::V128(u128::MAX - 7),
            },
        ],
        stack: UnwoundStack {
            buffer_offset: 8192,
            capacity: 1024,
            data: (0..200u8).collect(),
        },
        os_state: b"opaque os state".to_vec(),
        files: Some(files),
        threads: Vec::new(),
    };
    (initial, mem, snap)
}
