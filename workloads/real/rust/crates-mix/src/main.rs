//! A log-processing pipeline on well-known crates: `regex` parses synthetic
//! access-log lines, `serde`/`serde_json` turn them into records and a JSON
//! report and read it back, and `miniz_oxide` deflates the report and
//! inflates it again. The crates are theirs, unmodified; this driver is ours.
//!
//! Usage: `crates-mix N` (N >= 1 scales the work). Deterministic (fixed
//! seed); exits 1 with "VERIFICATION FAILED" if a round trip differs.

use regex::Regex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
struct Request {
    ip: String,
    method: String,
    path: String,
    status: u16,
    bytes: u64,
    agent: String,
}

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Report {
    round: u32,
    requests: Vec<Request>,
    by_status: BTreeMap<u16, u64>,
    bytes_by_method: BTreeMap<String, u64>,
}

/// SplitMix64, as in the rest of roam's workloads.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const METHODS: [&str; 4] = ["GET", "POST", "PUT", "DELETE"];
const PATHS: [&str; 6] = ["/", "/index.html", "/api/v1/items", "/api/v1/items/42", "/static/app.js", "/login"];
const AGENTS: [&str; 3] = ["curl/8.0", "Mozilla/5.0 (X11; Linux x86_64)", "roam-bench/1"];
const STATUS: [u16; 5] = [200, 201, 304, 404, 500];

fn make_log(rng: &mut Rng, lines: usize) -> String {
    let mut log = String::new();
    for i in 0..lines {
        let ip = format!("10.{}.{}.{}", rng.below(256), rng.below(256), rng.below(256));
        let m = METHODS[rng.below(4) as usize];
        let p = PATHS[rng.below(6) as usize];
        let q = if rng.below(3) == 0 { format!("?page={}&sort=name", rng.below(50)) } else { String::new() };
        let s = STATUS[rng.below(5) as usize];
        let b = rng.below(100_000);
        let a = AGENTS[rng.below(3) as usize];
        log.push_str(&format!(
            "{ip} - - [12/Mar/2024:10:{:02}:{:02} +0000] \"{m} {p}{q} HTTP/1.1\" {s} {b} \"-\" \"{a}\"\n",
            (i / 60) % 60,
            i % 60
        ));
        if i % 97 == 0 {
            log.push_str("# malformed line that the parser must skip\n");
        }
    }
    log
}

fn fnv(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h ^= b as u64;
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("VERIFICATION FAILED: {msg}");
    std::process::exit(1);
}

fn main() {
    let n: u32 = match std::env::args().nth(1).map(|a| a.parse()) {
        Some(Ok(n)) if n > 0 => n,
        _ => {
            eprintln!("usage: crates-mix N   (N >= 1 scales the work)");
            std::process::exit(2);
        }
    };
    let line_re = Regex::new(
        r#"^(?P<ip>\d{1,3}(?:\.\d{1,3}){3}) \S+ \S+ \[(?P<ts>[^\]]+)\] "(?P<m>[A-Z]+) (?P<p>[^ ?"]+)(?:\?[^ "]*)? HTTP/1\.[01]" (?P<s>\d{3}) (?P<b>\d+) "[^"]*" "(?P<a>[^"]*)"$"#,
    )
    .unwrap();
    let query_re = Regex::new(r"page=(\d+)").unwrap();
    let api_re = Regex::new(r"^/api/v(\d+)/(\w+)(?:/(\d+))?$").unwrap();

    let mut rng = Rng(42);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let (mut parsed, mut skipped, mut pages, mut api) = (0u64, 0u64, 0u64, 0u64);
    let (mut json_bytes, mut deflated_bytes) = (0usize, 0usize);
    for round in 0..n {
        let log = make_log(&mut rng, 3000);
        for c in query_re.captures_iter(&log) {
            pages += c[1].parse::<u64>().unwrap();
        }
        let mut requests = Vec::new();
        for line in log.lines() {
            let Some(c) = line_re.captures(line) else {
                skipped += 1;
                continue;
            };
            let path = c["p"].to_string();
            if let Some(a) = api_re.captures(&path) {
                api += a[1].parse::<u64>().unwrap() + a.get(3).map_or(0, |m| m.as_str().len() as u64);
            }
            requests.push(Request {
                ip: c["ip"].to_string(),
                method: c["m"].to_string(),
                path,
                status: c["s"].parse().unwrap(),
                bytes: c["b"].parse().unwrap(),
                agent: c["a"].to_string(),
            });
        }
        parsed += requests.len() as u64;
        let mut by_status = BTreeMap::new();
        let mut bytes_by_method = BTreeMap::new();
        for r in &requests {
            *by_status.entry(r.status).or_insert(0) += 1;
            *bytes_by_method.entry(r.method.clone()).or_insert(0) += r.bytes;
        }
        let report = Report { round, requests, by_status, bytes_by_method };
        let json = serde_json::to_string(&report).unwrap();
        let back: Report = serde_json::from_str(&json).unwrap_or_else(|e| fail(&format!("JSON parse: {e}")));
        if back != report {
            fail("JSON round trip differs");
        }
        // Untyped access through serde_json::Value too.
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let total: u64 = v["bytes_by_method"].as_object().unwrap().values().map(|x| x.as_u64().unwrap()).sum();
        let deflated = miniz_oxide::deflate::compress_to_vec(json.as_bytes(), 6);
        let inflated = miniz_oxide::inflate::decompress_to_vec(&deflated)
            .unwrap_or_else(|e| fail(&format!("inflate: {e:?}")));
        if inflated != json.as_bytes() {
            fail("deflate round trip differs");
        }
        json_bytes += json.len();
        deflated_bytes += deflated.len();
        fnv(&mut h, &deflated);
        fnv(&mut h, &total.to_le_bytes());
        let pretty = serde_json::to_string_pretty(&report.by_status).unwrap();
        fnv(&mut h, pretty.as_bytes());
    }
    println!("rounds    {n}");
    println!("parsed    {parsed} (skipped {skipped})");
    println!("pages     {pages}");
    println!("api       {api}");
    println!("json      {json_bytes} bytes");
    println!("deflated  {deflated_bytes} bytes");
    println!("checksum  {h:016x}");
}
