//! A guard on [`OUTPUT_REVISION`]: prepared modules are cached under it, so
//! a change to what `prepare` emits without a new revision lets two nodes
//! hold different modules for the same program, and a checkpoint of one
//! cannot be restored from the other.
//!
//! The guard fingerprints what roam itself decides: the instrumented
//! modules of the test fixtures under several option sets, the lists
//! handed to Asyncify, and every `wasm-opt` argument. It does not run
//! `wasm-opt`, whose output depends on its own version (recorded in the
//! `roam` section and checked apart).
//!
//! The steps that work on `wasm-opt`'s output (`spill.rs`, which also puts
//! the quiet indirect calls back, and `compares.rs`) have a guard of their
//! own, [`AFTER_HISTORY`], over fixtures that stand in for that output:
//! their result depends on roam alone once their input is fixed.

use std::path::Path;

use crate::compares::turn_compares;
use crate::instrument::instrument;
use crate::spill::spill;
use crate::wasm_opt::{asyncify_arguments, optimise_arguments};
use crate::{
    validate, AsyncifyScope, LiftExits, LoopPoints, PointPolicy, PrepareOptions, QuietIndirect,
    TrimOutlined, OUTPUT_REVISION,
};

/// Every revision with its fingerprint, oldest first. When the test fails,
/// bump `OUTPUT_REVISION` (lib.rs, with a word on what changed) and add a
/// line here; never edit an old one.
const HISTORY: &[(u32, &str)] = &[
    (
        6,
        "5210430f21a4c05a2c00a5d204a38ccef4b289668ddc34bdc4f64fe2baa7c1ec",
    ),
    (
        7,
        "21dce38169e81bb20f9a8a04512bbb87c2c6eacaaddebadd2a6ad4cf4a551ded",
    ),
    (
        8,
        "cd8e38bd5dabd666d2f0671b08f1f8b7d8070a35276fcd0d45fd64eb9d7dbef2",
    ),
    (
        9,
        "8d3c938e3c8fbd102b9503768deb4158c5db6677ed3b8f8394d7d6b6d9a4057b",
    ),
    (
        10,
        "22330de62c76f04831a73d2fa25b1edf58a8f9f8d97828a36b89985730236571",
    ),
    (
        11,
        "b3ce8d3fd7ad23ea20b3b738febcbfed44ad86aaadfc1e17fe5b6c32fa3f6964",
    ),
    (
        12,
        "7e9a1b2372eef9e0d324dcaa74c2c628570e4b07878917d711025b23a3b01519",
    ),
    (
        13,
        "55450e1fb75cbf5b2b105e89fa87e495a89a456de47221f78266a29f6c8b5ffa",
    ),
    (
        14,
        "82e113f52c6d8e980673b2e23bb818b429b8753305b51751a45116e2ff6b46d3",
    ),
    (
        15,
        "5cdeb6dff7ea10bbc168aab075d181f7b628bd22656c4ae58680f1cbba524dce",
    ),
    (
        16,
        "3548469c0940a6d26114425c611183821f34646b7fff66426dd07320b3856b7f",
    ),
    // The fixtures have no loop that leaves an output unset on some way
    // out, so 17's fix leaves the fingerprint as it was.
    (
        17,
        "3548469c0940a6d26114425c611183821f34646b7fff66426dd07320b3856b7f",
    ),
    // Capture by exceptions became the default: the default options'
    // canonical text names it.
    (
        18,
        "5cf8fedb374859175718e8b6d1afd43a5e3afe7017764f23d6bea0dfa22bb8a6",
    ),
    // The default capture's name is part of the options' text.
    (
        19,
        "e8dcec6d11549cd8a984f7a4d55b851dca6133d2691ea66b1b1ea6e5a7ad9dd9",
    ),
    // The optimiser's run at `O2` names Binaryen's passes, without Stack IR.
    (
        20,
        "f3c97bfc66f0cb7c767c327e2f53c1727ee72b839f8363467aa5fd8f158b0219",
    ),
    // The capture by records' one run leaves out Binaryen's inlining; the
    // guard now lists the arguments of both optimiser runs.
    (
        21,
        "8042915d017173288d030d98a25af7272ac1da1df2fd87f725d0d43e82299a01",
    ),
];

/// The same for the steps after `wasm-opt`, from the revision the guard
/// began to cover them. A change there needs a new `OUTPUT_REVISION` as
/// well, with a line in both lists (the same fingerprint again in the list
/// whose steps did not change).
const AFTER_HISTORY: &[(u32, &str)] = &[
    (
        16,
        "5cdf218e2fa99c402c070fbe6e911e1627b503c2b7db3c0743192d287cea67f2",
    ),
    (
        17,
        "5cdf218e2fa99c402c070fbe6e911e1627b503c2b7db3c0743192d287cea67f2",
    ),
    // Capture by exceptions became the default, and its rewrite joined
    // this guard.
    (
        18,
        "393be1c16f20d57f10f5662c6d5c13d3cf958ba7b3a2fa97ac2ec5057a5f08a8",
    ),
    // `--capture returns` joined the guard's fixtures.
    (
        19,
        "800b4569577af3c56f25b9f0fb785a76870d82088b90cb1cf1826a9a3b56391b",
    ),
    (
        20,
        "800b4569577af3c56f25b9f0fb785a76870d82088b90cb1cf1826a9a3b56391b",
    ),
    (
        21,
        "800b4569577af3c56f25b9f0fb785a76870d82088b90cb1cf1826a9a3b56391b",
    ),
];

fn option_sets() -> Vec<PrepareOptions> {
    let d = PrepareOptions::default;
    vec![
        d(),
        PrepareOptions {
            points: PointPolicy::Outer,
            ..d()
        },
        PrepareOptions {
            loop_points: LoopPoints::Versioned,
            ..d()
        },
        PrepareOptions {
            asyncify_scope: AsyncifyScope::Reachable,
            ..d()
        },
        PrepareOptions {
            quiet_indirect: QuietIndirect::Off,
            ..d()
        },
        PrepareOptions {
            trim_outlined: TrimOutlined::Off,
            ..d()
        },
        PrepareOptions {
            lift_exits: LiftExits::Off,
            ..d()
        },
    ]
}

fn fingerprint() -> String {
    let fixtures = [
        crate::instrument::tests::LOOPS_WAT,
        crate::instrument::tests::NESTED_WAT,
        crate::hoist::tests::WAT,
        crate::indirect::tests::WAT,
        crate::pure::tests::WAT,
        crate::unroll::tests::WAT,
        crate::counted::tests::WAT,
        crate::counted::tests::BIG,
        crate::nest::tests::WAT,
        crate::bulk::tests::WAT,
        crate::leave::tests::WAT,
    ];
    let mut h = blake3::Hasher::new();
    let mut put = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    for opts in option_sets() {
        put(opts.canonical().as_bytes());
        for wat in fixtures {
            let wasm = wat::parse_str(wat).unwrap();
            let info = validate(&wasm).unwrap();
            let out = instrument(&wasm, &info, &opts).unwrap();
            put(&out.bytes);
            let list = out.list.as_ref();
            let arg = list.map(|l| l.pass_arg(Path::new("LIST")));
            put(list
                .map_or(String::new(), |l| l.names().join(","))
                .as_bytes());
            for a in asyncify_arguments(&opts, arg.clone(), true)
                .into_iter()
                .chain(asyncify_arguments(&opts, arg, false))
                .chain(optimise_arguments(&opts, false))
                .chain(optimise_arguments(&opts, true))
            {
                put(a.as_bytes());
            }
        }
    }
    h.finalize().to_hex().to_string()
}

/// What the steps after `wasm-opt` make of their fixtures.
fn after_fingerprint() -> String {
    let mut h = blake3::Hasher::new();
    let mut put = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    for wat in [
        crate::spill::tests::WAT,
        crate::indirect::tests::SHAPES,
        crate::compares::tests::WAT,
    ] {
        let wasm = wat::parse_str(wat).unwrap();
        for names in [true, false] {
            let (spilled, _) = spill(&wasm, names).unwrap();
            put(&spilled);
        }
        let mut turned = wasm.clone();
        let n = turn_compares(&mut turned).unwrap();
        put(&(n as u64).to_le_bytes());
        put(&turned);
    }
    // Capture by exceptions rewrites what the optimiser gave back; its
    // fixtures stand in for that output as instrumented, unoptimised.
    let opts = PrepareOptions::default();
    for wat in [
        crate::eh::tests::WAT,
        crate::instrument::tests::LOOPS_WAT,
        crate::instrument::tests::NESTED_WAT,
        crate::indirect::tests::WAT,
    ] {
        let wasm = wat::parse_str(wat).unwrap();
        let info = validate(&wasm).unwrap();
        let instrumented = instrument(&wasm, &info, &opts).unwrap().bytes;
        for (names, wrap, returns) in [
            (true, true, false),
            (false, true, false),
            (true, false, false),
            (true, true, true),
        ] {
            let (out, stats) = crate::eh::transform(&instrumented, names, wrap, returns).unwrap();
            put(&out);
            put(format!("{stats:?}").as_bytes());
        }
    }
    h.finalize().to_hex().to_string()
}

/// Checks `now` against the last line of `history` (named `list`).
fn check(list: &str, history: &[(u32, &str)], now: &str) {
    let &(revision, pinned) = history.last().unwrap();
    assert!(
        history.windows(2).all(|w| w[0].0 < w[1].0),
        "revisions in {list} must increase"
    );
    assert_eq!(
        revision, OUTPUT_REVISION,
        "OUTPUT_REVISION is {OUTPUT_REVISION} but the last line of {list} is for {revision}: add ({OUTPUT_REVISION}, \"{now}\")"
    );
    assert_eq!(
        pinned, now,
        "what prepare emits has changed: bump OUTPUT_REVISION (lib.rs) and add ({}, \"{now}\") to {list}",
        OUTPUT_REVISION + 1
    );
}

#[test]
fn a_change_of_the_output_comes_with_a_new_revision() {
    let now = fingerprint();
    check("HISTORY", HISTORY, &now);
    // Same input, same fingerprint: the guard itself is deterministic.
    assert_eq!(fingerprint(), now);
}

#[test]
fn a_change_after_the_optimiser_comes_with_a_new_revision_too() {
    let now = after_fingerprint();
    check("AFTER_HISTORY", AFTER_HISTORY, &now);
    assert_eq!(after_fingerprint(), now);
}
