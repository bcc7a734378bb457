//! Prepare one file: `prepare_file IN OUT [loops|functions|manual] [O0|O1|O2|O3|Os]`.
//! Used to measure the size and speed effect of the policies and levels.

use roam_prepare::{prepare, OptLevel, PrepareOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, input, output, rest @ ..] = args.as_slice() else {
        return Err("usage: prepare_file IN OUT [policy] [level]".into());
    };
    let mut opts = PrepareOptions::default();
    if let Some(policy) = rest.first() {
        opts.points = policy.parse()?;
    }
    if let Some(level) = rest.get(1) {
        opts.opt_level = match level.as_str() {
            "O0" => OptLevel::O0,
            "O1" => OptLevel::O1,
            "O2" => OptLevel::O2,
            "O3" => OptLevel::O3,
            "Os" => OptLevel::Os,
            other => return Err(format!("unknown level {other}").into()),
        };
    }
    let start = std::time::Instant::now();
    let prepared = prepare(&std::fs::read(input)?, &opts)?;
    std::fs::write(output, &prepared.bytes)?;
    eprintln!(
        "{input}: {} bytes, {:?}, {:?}",
        prepared.bytes.len(),
        start.elapsed(),
        prepared.stats
    );
    Ok(())
}
