//! Exercises std::fs, std::env and std::time on wasm32-wasip1.
//! argv[1] is the directory to work in.
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::{Instant, SystemTime};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let base = std::path::PathBuf::from(&args[1]);
    println!("args={}", args.len());
    println!("env={}", std::env::var("ROAM_GREETING").unwrap_or_default());
    let t = Instant::now();
    let after_2020 = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        > 1_577_836_800;
    println!("realtime_after_2020={after_2020}");

    let d = base.join("tree/deep");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("one"), b"1").unwrap();
    std::fs::write(base.join("tree/two"), b"22").unwrap();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(base.join("tree/log"))
        .unwrap();
    f.write_all(b"line1\nline2\n").unwrap();
    f.seek(SeekFrom::Start(6)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    println!("seek_read={:?}", s);
    drop(f);
    std::fs::rename(base.join("tree/two"), base.join("tree/three")).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(base.join("tree"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    println!("tree={names:?}");
    let m = std::fs::metadata(base.join("tree/three")).unwrap();
    println!("three.len={} is_file={}", m.len(), m.is_file());
    println!(
        "missing={:?}",
        std::fs::read(base.join("nope")).unwrap_err().kind()
    );
    std::fs::remove_dir_all(base.join("tree")).unwrap();
    println!("removed={}", !base.join("tree").exists());
    println!("elapsed_ok={}", t.elapsed().as_secs() < 60);
}
