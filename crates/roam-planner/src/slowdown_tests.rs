use super::*;

fn s(isa: &str, ms: u64) -> (String, u64) {
    (isa.to_string(), ms)
}

#[test]
fn a_run_on_one_isa_is_its_time_there() {
    let mut t = Table::default();
    t.learn("m", "ep", &[s("x86_64", 1000)]);
    t.learn("m", "ep", &[s("x86_64", 2000)]);
    let e = t.programs["m"].isas["x86_64"];
    assert_eq!((e.cpu_ms, e.runs), (1500.0, 2.0));
    assert_eq!(t.programs["m"].name, "ep");
    // Two stints on the same ISA (a move between two servers) add up.
    let mut t = Table::default();
    t.learn("m", "ep", &[s("x86_64", 400), s("x86_64", 600)]);
    assert_eq!(t.programs["m"].isas["x86_64"].cpu_ms, 1000.0);
}

#[test]
fn a_split_run_times_the_unknown_side_by_the_known_one() {
    let mut t = Table::default();
    t.learn("m", "cg", &[s("x86_64", 1000)]);
    // A quarter of the work on x86-64 (250 of 1,000 ms), the rest on the
    // board in 6,000 ms: a whole run there takes 8,000 ms.
    t.learn("m", "cg", &[s("x86_64", 250), s("aarch64", 6000)]);
    let e = t.programs["m"].isas["aarch64"];
    assert_eq!((e.cpu_ms, e.runs), (8000.0, 0.75));
    let p = t.predict("m", "x86_64", "aarch64", 1.0);
    assert_eq!((p.slowdown, p.basis), (8.0, Basis::Learned));
    let back = t.predict("m", "aarch64", "x86_64", 1.0);
    assert_eq!(back.slowdown, 1.0 / 8.0);
    // Known on the board only: the same sum the other way round.
    let mut t = Table::default();
    t.learn("m", "cg", &[s("aarch64", 8000)]);
    t.learn("m", "cg", &[s("x86_64", 750), s("aarch64", 2000)]);
    assert_eq!(t.programs["m"].isas["x86_64"].cpu_ms, 1000.0);
    assert_eq!(t.programs["m"].isas["x86_64"].runs, 0.75);
}

#[test]
fn with_both_sides_known_the_side_that_did_most_of_the_run_is_learned() {
    let mut t = Table::default();
    t.learn("m", "cg", &[s("x86_64", 1000)]);
    t.learn("m", "cg", &[s("aarch64", 8000)]);
    // 90 % of the work on x86-64: the board's 20 % share is the known
    // side, and x86-64 is learned from it.
    t.learn("m", "cg", &[s("x86_64", 900), s("aarch64", 1600)]);
    // A whole run on x86-64: 900 / (1 − 1,600 / 8,000) = 1,125 ms, weight
    // 0.8, taken 0.8 / 1.8 of the way from 1,000.
    let x = t.programs["m"].isas["x86_64"];
    assert!(
        (x.cpu_ms - (1000.0 + 125.0 * 0.8 / 1.8)).abs() < 1e-9,
        "{x:?}"
    );
    assert!((x.runs - 1.8).abs() < 1e-9, "{x:?}");
    assert_eq!(t.programs["m"].isas["aarch64"].runs, 1.0);
}

#[test]
fn a_split_run_without_a_known_side_teaches_nothing() {
    let mut t = Table::default();
    t.learn("m", "cg", &[s("x86_64", 250), s("aarch64", 6000)]);
    assert!(t.programs["m"].isas.is_empty());
    // Nor one whose known side did over half of the work.
    t.learn("m", "cg", &[s("x86_64", 1000)]);
    t.learn("m", "cg", &[s("x86_64", 600), s("aarch64", 4000)]);
    assert!(!t.programs["m"].isas.contains_key("aarch64"));
}

#[test]
fn unknown_programs_get_the_median_then_the_declared_speeds() {
    let mut t = Table::default();
    let p = t.predict("new", "x86_64", "aarch64", 10.0);
    assert_eq!((p.slowdown, p.basis), (10.0, Basis::Declared));
    for (m, board) in [("a", 3000), ("b", 9000), ("c", 30000)] {
        t.learn(m, m, &[s("x86_64", 1000)]);
        t.learn(m, m, &[s("aarch64", board)]);
    }
    let p = t.predict("new", "x86_64", "aarch64", 10.0);
    assert_eq!((p.slowdown, p.basis), (9.0, Basis::Median));
    // A program known on one side only is no better known.
    t.learn("half", "half", &[s("x86_64", 1000)]);
    assert_eq!(
        t.predict("half", "x86_64", "aarch64", 10.0).basis,
        Basis::Median
    );
}

#[test]
fn the_estimate_follows_a_program_that_changes() {
    let mut t = Table::default();
    for _ in 0..50 {
        t.learn("m", "m", &[s("x86_64", 1000)]);
    }
    t.learn("m", "m", &[s("x86_64", 2000)]);
    // At least MIN_STEP of the way, not 1/51 of it.
    assert_eq!(t.programs["m"].isas["x86_64"].cpu_ms, 1200.0);
}

#[test]
fn the_learner_joins_a_cells_stints_and_skips_failed_runs() {
    let mut l = Learner::default();
    l.ended("c0", "m", "cg", "x86_64", 1, 1000, true);
    l.moved("c1", "x86_64", 250);
    l.ended("c1", "m", "cg", "aarch64", 2, 7500, true);
    assert_eq!(l.table.programs["m"].isas["aarch64"].cpu_ms, 10000.0);
    assert!(l.dirty);
    // A killed run does not count, and its stints are dropped.
    l.moved("c2", "x86_64", 10);
    l.ended("c2", "m", "cg", "aarch64", 2, 10, false);
    assert_eq!(l.table.programs["m"].isas["aarch64"].runs, 0.75);
    assert!(l.runs.is_empty());
    // A run with a move this planner did not see (generation 3, one
    // stint) is not whole here: nothing learned.
    let before = l.table.clone();
    l.moved("c4", "x86_64", 100);
    l.ended("c4", "m", "cg", "aarch64", 3, 100, true);
    assert_eq!(l.table, before);
    // A cell gone without an end is forgotten.
    l.moved("c3", "x86_64", 10);
    l.retain(|id| id != "c3");
    assert!(l.runs.is_empty());
}

#[test]
fn the_table_keeps_at_most_max_programs() {
    let mut t = Table::default();
    for i in 0..MAX_PROGRAMS + 5 {
        let runs = if i == 0 { 3 } else { 1 };
        for _ in 0..runs {
            t.learn(&format!("m{i}"), "p", &[s("x86_64", 100)]);
        }
    }
    assert_eq!(t.programs.len(), MAX_PROGRAMS);
    assert!(t.programs.contains_key("m0"), "the most observed stays");
}

#[test]
fn bad_figures_are_ignored() {
    let mut t = Table::default();
    t.learn("m", "m", &[s("x86_64", 0)]);
    assert!(t.programs["m"].isas.is_empty());
    t.learn("m", "m", &[s("x86_64", 1000)]);
    t.learn("m", "m", &[s("x86_64", 1000), s("aarch64", 0)]);
    assert!(!t.programs["m"].isas.contains_key("aarch64"));
}

#[test]
fn the_table_survives_the_store_round_trip() {
    let mut t = Table::default();
    t.learn("m", "cg", &[s("x86_64", 1000)]);
    let text = serde_json::to_string(&t).unwrap();
    assert_eq!(serde_json::from_str::<Table>(&text).unwrap(), t);
}

#[test]
fn the_stored_table_fits_in_a_setting() {
    let mut t = Table::default();
    // More programs than `learn` keeps (a table from a planner with a
    // larger limit): 2,000 would not fit in a setting.
    for i in 0..2_000u32 {
        let p = t.programs.entry(format!("{i:064x}")).or_default();
        p.name = format!("{i}-{}", "x".repeat(50));
        for isa in ["x86_64", "aarch64"] {
            let runs = f64::from(1 + i % 3);
            p.isas.insert(
                isa.into(),
                Estimate {
                    cpu_ms: 1000.0,
                    runs,
                },
            );
        }
    }
    let full = serde_json::to_string(&t).unwrap();
    assert!(
        full.len() > roam_cluster::MAX_SETTING_BYTES,
        "{}",
        full.len()
    );
    let text = encode(&t);
    assert!(text.len() <= roam_cluster::MAX_SETTING_BYTES);
    let kept: Table = serde_json::from_str(&text).unwrap();
    assert!(kept.programs.len() > 500, "{}", kept.programs.len());
    // The most observed stay.
    let runs = |p: &Program| p.isas.values().map(|e| e.runs).sum::<f64>();
    let least_kept = kept.programs.values().map(runs).fold(f64::MAX, f64::min);
    let dropped = t
        .programs
        .iter()
        .filter(|(k, _)| !kept.programs.contains_key(*k));
    assert!(dropped.map(|(_, p)| runs(p)).all(|r| r <= least_kept));
}
