//! The build id of the compiled codec: FNV-1a (64-bit) over this crate's sources, each file
//! as its path relative to the crate, a NUL, its bytes and a NUL, in sorted path order
//! (Cargo.toml, then src/*.rs). tiny/codec.py's `source_hash` computes the same over the
//! checkout, so a server refuses a compiled module built from other sources than the
//! checkout's (a checkout moved to another commit without `make codec`).

use std::fs;
use std::path::Path;

fn main() {
    let mut files = vec!["Cargo.toml".to_string()];
    let mut sources: Vec<String> = fs::read_dir("src")
        .expect("src/")
        .map(|entry| entry.expect("an entry of src/").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".rs"))
        .map(|name| format!("src/{name}"))
        .collect();
    sources.sort();
    files.extend(sources);
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for name in &files {
        let content = fs::read(Path::new(name)).expect("a source file");
        for byte in name.as_bytes().iter().chain([0u8].iter()).chain(content.iter()).chain([0u8].iter()) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        println!("cargo:rerun-if-changed={name}");
    }
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rustc-env=TINY_CODEC_SOURCE_HASH={hash:016x}");
}
