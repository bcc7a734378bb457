//! Generated programs, prepared and run side by side with the unprepared
//! module, for a time budget: `ROAM_DIFF_SECS` (default 120 s), starting at
//! `ROAM_DIFF_SEED` (default: from the clock, printed so that a failure can
//! be replayed with the same seed).

use std::time::{Duration, Instant};

use roam_prepare::{Capture, PointPolicy, PrepareOptions};

use crate::{Harness, Verdict};

/// The option sets every case runs under: the default (records, frames
/// that leave by returning), the same by exceptions, the Asyncify
/// fallback, and the point policies that place fewest points.
fn option_sets() -> Vec<PrepareOptions> {
    let d = PrepareOptions::default;
    vec![
        d(),
        PrepareOptions {
            capture: Capture::Eh,
            ..d()
        },
        PrepareOptions {
            capture: Capture::Asyncify,
            ..d()
        },
        PrepareOptions {
            points: PointPolicy::Outer,
            ..d()
        },
        PrepareOptions {
            points: PointPolicy::Functions,
            ..d()
        },
    ]
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn generated_programs_run_the_same_prepared() {
    if !roam_testkit::have("wasm-opt") {
        roam_testkit::missing(&roam_testkit::WASM_OPT, "not on PATH");
        return;
    }
    let secs = env_u64("ROAM_DIFF_SECS").unwrap_or(120);
    let seed = env_u64("ROAM_DIFF_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    println!("ROAM_DIFF_SEED={seed} ROAM_DIFF_SECS={secs}");
    let harness = Harness::new(option_sets()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut cases, mut same, mut restored, mut unbounded, mut refused) = (0, 0, 0, 0, 0);
    let mut seed_now = seed;
    while Instant::now() < deadline {
        let data = roam_testkit::pseudo_random(4096, seed_now);
        match harness.check(&data) {
            Ok(verdicts) => {
                for v in verdicts {
                    match v {
                        Verdict::Same { restored: r, .. } => {
                            same += 1;
                            restored += u32::from(r);
                        }
                        Verdict::Unbounded { .. } => unbounded += 1,
                        Verdict::Refused(_) => refused += 1,
                        Verdict::NoProgram => {}
                    }
                }
            }
            Err(m) => {
                let saved = save(&data);
                panic!(
                    "case seed {seed_now}: {m}\nprogram: {saved}\n\
                     replay: ROAM_DIFF_SEED={seed_now} ROAM_DIFF_SECS=1"
                )
            }
        }
        cases += 1;
        seed_now += 1;
    }
    println!(
        "{cases} programs: {same} runs the same ({restored} restored from a stop), \
         {unbounded} unbounded (gap checked), {refused} refused"
    );
    assert!(same > 0, "no generated program ran to its end");
}

/// Write the failing program next to the test's target directory, and say
/// where.
fn save(data: &[u8]) -> String {
    let Ok(program) = crate::gen::program(&mut arbitrary::Unstructured::new(data)) else {
        return "(not a program)".into();
    };
    let dir = std::env::temp_dir().join("roam-diff-failures");
    let path = dir.join(format!("{}.wasm", blake3::hash(&program).to_hex()));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &program)) {
        Ok(()) => path.display().to_string(),
        Err(e) => format!("(cannot save it: {e})"),
    }
}
