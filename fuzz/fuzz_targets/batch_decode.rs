//! Arbitrary bytes must decode to an error or records that re-encode to the
//! same batch, and applying them must never panic or write out of bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roam_snapshot::InitialImage;
use roam_transfer::{
    batch_checksum, decode_batch, BatchWriter, ChunkStore, Decoder, MemoryTarget, PAGE_SIZE,
};
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    // Also exercise the decoder past the checksum: reseal the input as a
    // batch body so that structurally interesting inputs reach the parser.
    let mut sealed = vec![1u8];
    sealed.extend_from_slice(data);
    let count = data.first().map_or(0, |&b| u32::from(b & 7));
    sealed.extend_from_slice(&count.to_le_bytes());
    let sum = batch_checksum(&sealed);
    sealed.extend_from_slice(&sum);

    for input in [data, &sealed[..]] {
        let Ok(records) = decode_batch(input) else {
            continue;
        };
        let mut w = BatchWriter::default();
        for r in &records {
            w.push(r);
        }
        assert_eq!(
            w.take(),
            input,
            "decoded records re-encode to the same batch"
        );
        let initial = InitialImage::new(4 * PAGE_SIZE as u64, vec![(0, vec![3; 100])]);
        let mut mem = vec![0u8; 4 * PAGE_SIZE];
        let store = Arc::new(ChunkStore::new(1 << 20));
        store.insert_many([&mem[..PAGE_SIZE]]);
        let _ = Decoder::with_store(store, true)
            .apply(input, &mut MemoryTarget::new(&mut mem, &initial));
    }
});
