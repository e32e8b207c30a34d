//! Counting a day file's lines for the dashboard's day list (`tiny._codec.count_lines`,
//! tiny/analytics/answers.py `count_rows`): pread(2) into one buffer and memchr's vectorised
//! count.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

const PIECE: usize = 1 << 20;

/// What [`count_lines`] found: the LFs among the bytes it read, how many it read (fewer than
/// asked at the end of the file), and the last `tail` of them.
#[derive(Debug, PartialEq, Eq)]
pub struct Counted {
    pub lines: u64,
    pub read: u64,
    pub tail: Vec<u8>,
}

/// The LF bytes among bytes `start..end` of `file`, read in pieces of 1 MiB, with the last
/// `tail` bytes read (those just before `start + read`).
pub fn count_lines(file: &File, start: u64, end: u64, tail: usize) -> io::Result<Counted> {
    let mut buffer = vec![0u8; PIECE];
    let mut last: Vec<u8> = Vec::new();
    let (mut at, mut lines) = (start, 0u64);
    while at < end {
        let want = usize::try_from(end - at).unwrap_or(PIECE).min(PIECE);
        let n = match file.read_at(&mut buffer[..want], at) {
            Ok(0) => break, // the file ends before `end`
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let piece = &buffer[..n];
        lines += memchr::memchr_iter(b'\n', piece).count() as u64;
        if n >= tail {
            last.clear();
            last.extend_from_slice(&piece[n - tail..]);
        } else {
            last.extend_from_slice(piece);
            let excess = last.len().saturating_sub(tail);
            last.drain(..excess);
        }
        at += n as u64;
    }
    Ok(Counted { lines, read: at - start, tail: last })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(data: &[u8]) -> File {
        let path = std::env::temp_dir().join(format!("tiny-lines-{}-{}", std::process::id(), data.len()));
        File::create(&path).unwrap().write_all(data).unwrap();
        let file = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }

    #[test]
    fn counts_the_lfs_of_a_range_across_pieces() {
        let data: Vec<u8> = (0..3 * PIECE + 17).map(|i| if i % 97 == 0 { b'\n' } else { b'x' }).collect();
        let file = file_of(&data);
        for (start, end) in [(0, data.len()), (5, 2 * PIECE + 3), (PIECE, PIECE), (100, 101)] {
            let counted = count_lines(&file, start as u64, end as u64, 256).unwrap();
            let expected = data[start..end].iter().filter(|&&b| b == b'\n').count() as u64;
            assert_eq!(counted.lines, expected);
            assert_eq!(counted.read, (end - start) as u64);
            assert_eq!(counted.tail, data[end.saturating_sub(256).max(start)..end].to_vec());
        }
    }

    #[test]
    fn stops_at_the_end_of_the_file() {
        let file = file_of(b"a\nb\nc");
        let counted = count_lines(&file, 1, 100, 3).unwrap();
        assert_eq!(counted, Counted { lines: 2, read: 4, tail: b"b\nc".to_vec() });
    }
}
