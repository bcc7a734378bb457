//! Pause and resume on the source; incoming cells on the destination.

use roam_snapshot::PAGE_SIZE;

use super::common::*;
use crate::{Cell, CellOptions, CheckpointKind, Outcome, Trigger};

#[test]
fn pause_resume_many_times_equals_an_uninterrupted_run() {
    let env = env();
    let Some(m) = load(&env.rt, COMPUTE_WAT) else {
        return;
    };
    let want = reference(&env.rt, &m);
    let (mut cell, out) = start(&env.rt, &m, CellOptions::default());
    let ctl = cell.controller();
    let mut pauses = 0;
    loop {
        if pauses < 50 {
            ctl.request(CheckpointKind::Pause, Trigger::Api);
        }
        match run(&mut cell) {
            Outcome::Paused(snap, timing) => {
                assert_eq!(snap.memory.byte_len(), 0, "a pause copies no memory");
                assert_eq!(snap.stack.buffer_offset, 0);
                assert!(!snap.stack.data.is_empty());
                assert!(cell.memory().len() >= 7 * 65536);
                if pauses == 0 {
                    eprintln!("pause took {:?} after the migration point", timing.capture);
                }
                pauses += 1;
                // A paused cell does not run again by accident.
                assert!(matches!(
                    cell.run(&mut |_, _| Ok(())),
                    Err(crate::RunError::Stopped)
                ));
                cell.resume(&snap).unwrap();
            }
            Outcome::Exited(0) => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(pauses, 50);
    assert_eq!(out.stdout(), want);
}

#[test]
fn resume_after_stop_continues_in_the_same_cell() {
    let env = env();
    let Some(m) = load(&env.rt, COMPUTE_WAT) else {
        return;
    };
    let want = reference(&env.rt, &m);
    let (mut cell, snap, out) = stopped_at(&env.rt, &m, 20_000);
    assert!(snap.memory.byte_len() > 0);
    cell.resume(&snap).unwrap();
    assert!(matches!(
        cell.resume(&snap),
        Err(crate::RestoreError::NotStopped)
    ));
    assert!(matches!(run(&mut cell), Outcome::Exited(0)));
    assert_eq!(out.stdout(), want);
}

#[test]
fn pause_of_a_large_memory_is_fast() {
    // 256 MiB of memory, touched everywhere, then paused: no copy of it.
    let wat = r#"(module (memory (export "memory") 4096)
      (func (export "_start") (local $i i32)
        (loop $l
          (i32.store (local.get $i) (local.get $i))
          (local.set $i (i32.add (local.get $i) (i32.const 4096)))
          (br_if $l (i32.lt_u (local.get $i) (i32.const 268435456))))
        (loop $spin (br $spin))))"#;
    let env = env();
    let Some(m) = load(&env.rt, wat) else { return };
    let (mut cell, _out) = start(&env.rt, &m, CellOptions::default());
    let ctl = cell.controller();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        ctl.request(CheckpointKind::Pause, Trigger::Api);
    });
    let Outcome::Paused(snap, timing) = run(&mut cell) else {
        panic!("no pause")
    };
    t.join().unwrap();
    cell.resume(&snap).unwrap();
    cell.controller()
        .request(CheckpointKind::Pause, Trigger::Api);
    let Outcome::Paused(snap, again) = run(&mut cell) else {
        panic!("no pause")
    };
    eprintln!(
        "pause of a 256 MiB memory: {:?} (first), {:?} (second) from the migration point to the outcome",
        timing.capture, again.capture
    );
    assert_eq!(snap.memory.byte_len(), 0);
    let mem = cell.memory();
    assert_eq!(mem.len(), 256 << 20);
    assert_eq!(&mem[4096..4100], &4096u32.to_le_bytes());
}

#[test]
fn live_memory_reads_while_the_program_runs() {
    let env = env();
    let Some(m) = load(&env.rt, MAILBOX_WAT) else {
        return;
    };
    let (mut cell, _out) = start(&env.rt, &m, CellOptions::default());
    let live = cell.live_memory();
    let runner = std::thread::spawn(move || run(&mut cell));
    let mut mb = Mailbox::new(live.clone());
    mb.command(&[40, 41], 0);
    let mut page = [0u8; PAGE_SIZE];
    assert!(live.read_page(40, &mut page));
    assert_eq!(&page[100..104], &1u32.to_le_bytes());
    mb.command(&[], 2);
    assert_eq!(live.len(), 18 * 65536);
    assert!(live.read_page(18 * 16 - 1, &mut page));
    assert!(!live.read_page(18 * 16, &mut page));
    mb.exit();
    assert!(matches!(runner.join().unwrap(), Outcome::Exited(0)));
    // The mapping outlives the cell.
    assert!(live.read_page(40, &mut page));
}

#[test]
fn incoming_filled_page_by_page_equals_restore() {
    let env = env();
    let Some(m) = load(&env.rt, COMPUTE_WAT) else {
        return;
    };
    let want = reference(&env.rt, &m);
    // The source pauses; its memory is sent from the live cell.
    let (mut src, out1) = start(&env.rt, &m, CellOptions::default());
    let mut points = 0;
    let snap = loop {
        src.controller()
            .request(CheckpointKind::Pause, Trigger::Api);
        let Outcome::Paused(snap, _) = run(&mut src) else {
            panic!()
        };
        points += 1;
        if points == 300 {
            break snap;
        }
        src.resume(&snap).unwrap();
    };
    let mut incoming = Cell::incoming(&env.rt, m.clone(), CellOptions::default()).unwrap();
    let live = src.live_memory();
    incoming.grow_to(live.len() as u64).unwrap();
    let mut page = [0u8; PAGE_SIZE];
    let dst = incoming.memory_mut();
    for i in 0..live.page_count() {
        assert!(live.read_page(i, &mut page));
        dst[i as usize * PAGE_SIZE..][..PAGE_SIZE].copy_from_slice(&page);
    }
    let mut dst = incoming.finish(&snap, vec![]).unwrap();
    let out2 = dst.capture_output();
    assert!(matches!(run(&mut dst), Outcome::Exited(0)));
    assert!(out1.stdout().is_empty());
    assert_eq!(out2.stdout(), want);

    // A full snapshot through incoming + finish, and through restore.
    let (_c, full, _o) = stopped_at(&env.rt, &m, 30_000);
    for via_incoming in [true, false] {
        let mut cell = if via_incoming {
            Cell::incoming(&env.rt, m.clone(), CellOptions::default())
                .unwrap()
                .finish(&full, vec![])
                .unwrap()
        } else {
            Cell::restore(&env.rt, m.clone(), &full, vec![], CellOptions::default()).unwrap()
        };
        let out = cell.capture_output();
        assert!(matches!(run(&mut cell), Outcome::Exited(0)));
        assert_eq!(out.stdout(), want);
    }
}

#[test]
fn incoming_checks_the_memory_size() {
    let env = env();
    let Some(m) = load(&env.rt, COMPUTE_WAT) else {
        return;
    };
    let (_c, full, _o) = stopped_at(&env.rt, &m, 1000);
    let mut incoming = Cell::incoming(&env.rt, m.clone(), CellOptions::default()).unwrap();
    incoming.grow_to(16 * 65536).unwrap();
    assert!(incoming.grow_to(8 * 65536).is_err(), "memory cannot shrink");
    let err = incoming.finish(&full, vec![]).err().expect("size mismatch");
    assert!(err.to_string().contains("memory"), "{err}");
}
