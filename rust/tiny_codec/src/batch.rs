//! A whole request body: split into lines, parse and check each, group rows per day.
//! Pure Rust (no Python objects), so it runs with the GIL released.

use std::collections::HashMap;

use crate::fast::parse_line;
use crate::json::{Field, Parsed};
use crate::record::{day_text, encode_fields, Rows};

/// One refused line: 1-based line number, reason, and `start..end` of its raw bytes in the
/// body (without the LF or CRLF).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub line: usize,
    pub reason: &'static str,
    pub start: usize,
    pub end: usize,
}

/// The reason of a valid record whose day would be one more than `max_days`.
pub const TOO_MANY_DAYS: &str = "date: more days in one request than --max-days";

/// Every reason a line can be refused with, in the order the checks run: tiny/codec.py's
/// `REASONS`, which it holds equal to this list (exported as `tiny._codec.REASONS`) when it
/// imports the compiled codec.
pub const REASONS: [&str; 34] = [
    "invalid UTF-8",
    "invalid JSON",
    "not a JSON object",
    "date: missing",
    "date: not a string",
    "date: not a calendar date YYYY-MM-DD",
    "time: missing",
    "time: not a string",
    "time: not a time of day HH:MM:SS",
    "size: missing",
    "size: not an integer",
    "size: less than 0",
    "r_version: not a string or null",
    "r_version: longer than 1024 characters",
    "r_version: control character",
    "r_arch: not a string or null",
    "r_arch: longer than 1024 characters",
    "r_arch: control character",
    "r_os: not a string or null",
    "r_os: longer than 1024 characters",
    "r_os: control character",
    "package: not a string or null",
    "package: longer than 1024 characters",
    "package: control character",
    "version: not a string or null",
    "version: longer than 1024 characters",
    "version: control character",
    "country: not a string or null",
    "country: longer than 1024 characters",
    "country: control character",
    "ip_id: missing",
    "ip_id: not an integer",
    "ip_id: less than 1",
    TOO_MANY_DAYS,
];

/// What one body may hold (tiny/codec.py's MAX_DAYS and MAX_REJECTS by default).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Distinct days; a valid record of a further day is refused with [`TOO_MANY_DAYS`].
    pub max_days: usize,
    /// Refused lines kept as a [`Reject`]; the rest are only counted, with their line range.
    pub max_rejects: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_days: 16, max_rejects: 1000 }
    }
}

/// The result of [`encode`]: tiny/codec.py's `Batch`, minus the Python objects.
#[derive(Debug, Default)]
pub struct Encoded {
    /// Each day's rows, in order of the day's first record.
    pub days: Vec<([u8; 10], Vec<u8>)>,
    /// The first `max_rejects` refused lines.
    pub rejects: Vec<Reject>,
    pub valid: usize,
    /// Every refused line, kept or not.
    pub invalid: usize,
    /// First and last line number of the refused lines past `max_rejects`.
    pub omitted: Option<(usize, usize)>,
}

/// Refused lines: the first `max` kept whole, the others only counted (memory stays bounded
/// by the body's size whatever share of its lines are refused).
struct Refused {
    kept: Vec<Reject>,
    max: usize,
    count: usize,
    omitted: Option<(usize, usize)>,
}

impl Refused {
    fn push(&mut self, reject: Reject) {
        self.count += 1;
        if self.kept.len() < self.max {
            self.kept.push(reject);
        } else {
            let first = self.omitted.map_or(reject.line, |(first, _)| first);
            self.omitted = Some((first, reject.line));
        }
    }
}

/// Lines that are empty or only spaces, tabs and CRs are no records.
#[inline]
fn blank(line: &[u8]) -> bool {
    line.iter().all(|&b| b == b' ' || b == b'\t' || b == b'\r')
}

/// Encode a body: the same days, rows, rejects and counts as `encode_reference`.
pub fn encode(body: &[u8], limits: Limits) -> Encoded {
    // All rows go into one buffer, in body order, and `rows` remembers each row's day and
    // end; most bodies hold a single day, whose rows are then that buffer as it is. CSV
    // rows are about half as long as their JSON lines, hence the capacity.
    let mut out = Rows::with_capacity(body.len() / 2 + 256);
    let mut rows: Vec<(u32, usize)> = Vec::with_capacity(body.len() / 128 + 1);
    // Days as YYYYMMDD numbers, in order of first appearance.
    let mut days: Vec<u32> = Vec::new();
    let mut day_index: HashMap<u32, u32> = HashMap::new();
    let mut last_day: Option<(u32, u32)> = None;
    let mut rejects = Refused { kept: Vec::new(), max: limits.max_rejects, count: 0, omitted: None };

    let mut fields = [Field::Missing; 10];
    let mut key_buf = Vec::new();
    let mut scratch = Vec::new();

    let mut start = 0;
    // body.split(b"\n") yields one more piece than there are LFs: the last runs to the end.
    let ends = memchr::memchr_iter(b'\n', body).chain(std::iter::once(body.len()));
    for (line_index, end) in ends.enumerate() {
        let number = line_index + 1;
        let line_start = start;
        start = end + 1;
        let mut line = &body[line_start..end];
        if let [rest @ .., b'\r'] = line {
            line = rest;
        }
        let refuse = |reason| Reject { line: number, reason, start: line_start, end: line_start + line.len() };
        if line.first().is_none_or(|&b| b == b' ' || b == b'\t' || b == b'\r') && blank(line) {
            continue;
        }
        match parse_line(line, &mut fields, &mut key_buf) {
            // The scanner accepts only valid UTF-8 (see json.rs), so UTF-8 is only in doubt
            // for a line it refused: orjson refuses every line that is not valid UTF-8.
            Parsed::Invalid if std::str::from_utf8(line).is_err() => rejects.push(refuse("invalid UTF-8")),
            Parsed::Invalid => rejects.push(refuse("invalid JSON")),
            Parsed::NotObject => rejects.push(refuse("not a JSON object")),
            Parsed::Object => {
                let row_start = out.len();
                match encode_fields(line, &body[line_start..], &fields, &mut out, &mut scratch) {
                    Err(reason) => {
                        out.truncate(row_start);
                        rejects.push(refuse(reason));
                    }
                    Ok(day) => {
                        let index = match last_day {
                            Some((last, index)) if last == day => index,
                            _ => match day_index.get(&day) {
                                Some(&index) => {
                                    last_day = Some((day, index));
                                    index
                                }
                                None if days.len() >= limits.max_days => {
                                    out.truncate(row_start);
                                    rejects.push(refuse(TOO_MANY_DAYS));
                                    continue;
                                }
                                None => {
                                    let index = days.len() as u32;
                                    day_index.insert(day, index);
                                    days.push(day);
                                    last_day = Some((day, index));
                                    index
                                }
                            },
                        };
                        rows.push((index, out.len()));
                    }
                }
            }
        }
    }

    let valid = rows.len();
    let days = match days.len() {
        0 => Vec::new(),
        1 => vec![(day_text(days[0]), out.into_vec())],
        _ => {
            // Gather each day's rows, sizing each buffer exactly first.
            let mut sizes = vec![0usize; days.len()];
            let mut row_start = 0;
            for &(day, end) in &rows {
                sizes[day as usize] += end - row_start;
                row_start = end;
            }
            let mut grouped: Vec<([u8; 10], Vec<u8>)> =
                days.iter().zip(sizes).map(|(&day, size)| (day_text(day), Vec::with_capacity(size))).collect();
            let mut row_start = 0;
            for &(day, end) in &rows {
                grouped[day as usize].1.extend_from_slice(&out.as_slice()[row_start..end]);
                row_start = end;
            }
            grouped
        }
    };
    Encoded { days, rejects: rejects.kept, valid, invalid: rejects.count, omitted: rejects.omitted }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = r#"{"date":"2014-05-04","time":"00:50:55","size":1,"ip_id":1}"#;
    const B: &str = r#"{"date":"2014-05-05","time":"00:50:55","size":2,"ip_id":2}"#;

    #[test]
    fn lines_blanks_crlf_and_days() {
        let body = format!("{A}\r\n\n \t\r\n{B}\n[1]\n{A}\r\r\n{A},\nX\n");
        let mut bytes = body.into_bytes();
        let n = bytes.len();
        bytes[n - 2] = 0xff; // invalid UTF-8 on line 8
        let enc = encode(&bytes, Limits::default());
        assert_eq!(enc.valid, 3);
        assert_eq!(enc.days.len(), 2);
        assert_eq!(enc.days[0].0, *b"2014-05-04");
        let a = "\"2014-05-04\",\"00:50:55\",1,NA,NA,NA,NA,NA,NA,1\n";
        assert_eq!(enc.days[0].1, format!("{a}{a}").as_bytes());
        assert_eq!(enc.days[1].1, b"\"2014-05-05\",\"00:50:55\",2,NA,NA,NA,NA,NA,NA,2\n");
        let reasons: Vec<_> = enc.rejects.iter().map(|r| (r.line, r.reason)).collect();
        assert_eq!(reasons, [(5, "not a JSON object"), (7, "invalid JSON"), (8, "invalid UTF-8")]);
        assert!(reasons.iter().all(|(_, reason)| REASONS.contains(reason)));
        let raw = &enc.rejects[1];
        assert_eq!(&bytes[raw.start..raw.end], format!("{A},").as_bytes());
    }

    #[test]
    fn empty_body() {
        let enc = encode(b"", Limits::default());
        assert_eq!((enc.days.len(), enc.rejects.len(), enc.valid, enc.invalid, enc.omitted), (0, 0, 0, 0, None));
    }

    #[test]
    fn rejects_past_the_limit_are_counted_with_their_line_range() {
        let body = format!("x\n{A}\ny\n\nz\nw\n{A}\nv");
        let enc = encode(body.as_bytes(), Limits { max_days: 16, max_rejects: 2 });
        let kept: Vec<_> = enc.rejects.iter().map(|r| r.line).collect();
        assert_eq!((kept, enc.invalid, enc.omitted, enc.valid), (vec![1, 3], 5, Some((5, 8)), 2));
        let none = encode(body.as_bytes(), Limits { max_days: 16, max_rejects: 0 });
        assert_eq!((none.rejects.len(), none.invalid, none.omitted), (0, 5, Some((1, 8))));
    }

    #[test]
    fn records_of_days_past_the_limit_are_refused_and_write_nothing() {
        let body = format!("{A}\n{B}\n{A}\n{B}\n");
        let enc = encode(body.as_bytes(), Limits { max_days: 1, max_rejects: 10 });
        assert_eq!(enc.days.len(), 1);
        assert_eq!(enc.days[0].1.len(), 2 * "\"2014-05-04\",\"00:50:55\",1,NA,NA,NA,NA,NA,NA,1\n".len());
        let reasons: Vec<_> = enc.rejects.iter().map(|r| (r.line, r.reason)).collect();
        assert_eq!(reasons, [(2, TOO_MANY_DAYS), (4, TOO_MANY_DAYS)]);
        assert_eq!((enc.valid, enc.invalid), (2, 2));
    }
}
