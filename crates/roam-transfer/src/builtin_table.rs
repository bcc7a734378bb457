// Measured with `cargo test -p roam-transfer --release --test adapt
// print_builtin_table -- --ignored --nocapture` (2000 pages of
// `reference_workload`, one x86-64 core, minimum of two runs on a loaded
// 2-core machine). Columns: nanoseconds per page, output/input ratio.
const BUILTIN_PLAIN: [(f64, f64); 9] = [
    (490.1, 1.0000),     // none
    (6905.6, 0.6770),    // lz4
    (18716.3, 0.4968),   // zstd-1
    (23816.5, 0.5019),   // zstd-3
    (60077.3, 0.4971),   // zstd-6
    (111779.2, 0.4956),  // zstd-9
    (251162.0, 0.4843),  // zstd-12
    (668279.5, 0.4797),  // zstd-15
    (1359271.2, 0.4699), // zstd-19
];
const BUILTIN_DELTA: [(f64, f64); 9] = [
    (744.7, 1.0000),    // delta+none
    (1333.7, 0.0325),   // delta+lz4
    (7336.6, 0.0267),   // delta+zstd-1
    (9340.5, 0.0267),   // delta+zstd-3
    (14625.0, 0.0269),  // delta+zstd-6
    (16438.3, 0.0266),  // delta+zstd-9
    (18960.8, 0.0278),  // delta+zstd-12
    (340424.5, 0.0278), // delta+zstd-15
    (715541.5, 0.0279), // delta+zstd-19
];
