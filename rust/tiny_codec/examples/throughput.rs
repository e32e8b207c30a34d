//! Scanner throughput without Python: `cargo run --release --example throughput -- FILE.ndjson [RECORDS_PER_BODY]`.
//! Cuts the file into bodies of RECORDS_PER_BODY lines (default 1600) and encodes them repeatedly.

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: throughput FILE.ndjson [RECORDS_PER_BODY]");
    let per_body: usize = args.next().map_or(1600, |n| n.parse().expect("a number"));
    let data = std::fs::read(&path).expect("readable file");
    let mut bodies = Vec::new();
    let mut start = 0;
    let mut count = 0;
    let mut records = 0;
    for (i, &b) in data.iter().enumerate() {
        if b == b'\n' {
            count += 1;
            if count == per_body {
                bodies.push(&data[start..=i]);
                records += count;
                start = i + 1;
                count = 0;
            }
        }
    }
    let mut rates = Vec::new();
    for _ in 0..15 {
        let t = Instant::now();
        let mut valid = 0;
        for body in &bodies {
            valid += tiny_codec::batch::encode(body, Default::default()).valid;
        }
        assert_eq!(valid, records);
        rates.push(records as f64 / t.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "{} bodies of {per_body}: median {:.2}M records/s (max {:.2}M)",
        bodies.len(),
        rates[7] / 1e6,
        rates[14] / 1e6
    );
}
