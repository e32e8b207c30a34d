//! The fast path of the line scanner ([`parse_line`]) for the usual line: a compact flat object
//! (`{"key":value,...}`, no whitespace), pure ASCII, no backslash, no control character, at
//! most [`MAX_LINE`] bytes, values that are strings, numbers, true, false or null.
//!
//! Why it is faster: the general scanner finds each string's end by scanning from its
//! start, so every member waits for the previous one (a chain of dependent loads, about
//! half of the run time). Here one pass over the line marks every `"` in a bitmap, 16 bytes
//! per step; with no backslash in the line, strings are exactly the pairs of consecutive
//! quotes, so walking the members only pops bits off the bitmap. The bytes between them
//! (`:`, `,`, numbers, literals) are still checked one by one, but nothing waits on them.
//!
//! It accepts a subset of what the general scanner accepts, filling the same [`Field`]s;
//! on anything else it returns None *before deciding anything*, and the general scanner
//! starts over. So it can only be wrong by accepting a line orjson refuses or by filling a
//! field differently, which the checks below rule out: every byte of an accepted line is
//! covered, contiguously from `{` to the final `}`.

use crate::json::{at, key_slot, literal, parse_record, scan_number, Field, Parsed};
use crate::runs::quotes_and_specials;

/// Longest line the fast path takes (its quote bitmap lives on the stack).
pub(crate) const MAX_LINE: usize = 512;

/// The positions of the quotes, in order, popped off the bitmap.
struct Quotes<'a> {
    words: &'a [u64],
    index: usize,
    current: u64,
}

impl Quotes<'_> {
    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        while self.current == 0 {
            self.index += 1;
            self.current = *self.words.get(self.index)?;
        }
        let bit = self.current.trailing_zeros() as usize;
        self.current &= self.current - 1;
        Some(self.index * 64 + bit)
    }
}

/// Parse one line: the fast path when it takes the line, else the general scanner
/// ([`crate::json::parse_record`]), with the same result either way.
pub(crate) fn parse_line(s: &[u8], fields: &mut [Field; 10], key_buf: &mut Vec<u8>) -> Parsed {
    match parse_compact(s, fields) {
        Some(parsed) => parsed,
        None => parse_record(s, fields, key_buf),
    }
}

/// Parse a compact line, or None to leave it to the general scanner.
#[inline]
pub(crate) fn parse_compact(s: &[u8], fields: &mut [Field; 10]) -> Option<Parsed> {
    if s.len() > MAX_LINE || s.first() != Some(&b'{') || s.get(1) == Some(&b'}') {
        return None;
    }
    // One pass: the quote bitmap, and whether any byte rules the fast path out.
    let mut bitmap = [0u64; MAX_LINE / 64];
    let mut specials = 0;
    let mut i = 0;
    while i < s.len() {
        let mut padded = [b' '; 16]; // spaces: neither quotes nor special
        let chunk = match s.get(i..i + 16) {
            Some(chunk) => chunk,
            None => {
                let tail = &s[i..];
                padded[..tail.len()].copy_from_slice(tail);
                &padded[..]
            }
        };
        let (quotes, special) = quotes_and_specials(chunk.try_into().ok()?);
        bitmap[i / 64] |= (quotes as u64) << (i % 64);
        specials |= special;
        i += 16;
    }
    if specials != 0 {
        return None;
    }
    let words = &bitmap[..s.len().div_ceil(64)];
    let mut quotes = Quotes { words, index: 0, current: words[0] };

    *fields = [Field::Missing; 10];
    let mut key_start = 1; // where the next key's opening quote must be
    loop {
        if quotes.next()? != key_start {
            return None;
        }
        let key_end = quotes.next()?; // no backslash in the line: the next quote closes it
        if at(s, key_end + 1) != b':' {
            return None;
        }
        let value = key_end + 2;
        let (end, field) = match at(s, value) {
            b'"' => {
                if quotes.next()? != value {
                    return None;
                }
                let close = quotes.next()?;
                (close + 1, Field::Str { start: value + 1, end: close, escaped: false })
            }
            b'-' | b'0'..=b'9' => match scan_number(s, value).ok()? {
                (end, Some(negative)) => (end, Field::Int { negative, start: value + negative as usize, end }),
                (end, None) => (end, Field::Other),
            },
            b'n' => (literal(s, value, b"null").ok()?, Field::Missing),
            b't' => (literal(s, value, b"true").ok()?, Field::Other),
            b'f' => (literal(s, value, b"false").ok()?, Field::Other),
            _ => return None, // arrays, objects: the general scanner
        };
        if let Some(slot) = key_slot(&s[key_start + 1..key_end]) {
            fields[slot] = field;
        }
        match at(s, end) {
            b',' => key_start = end + 1,
            b'}' if end + 1 == s.len() => return Some(Parsed::Object),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(line: &[u8]) -> (Option<Parsed>, [Field; 10], Parsed, [Field; 10]) {
        let mut fast = [Field::Other; 10];
        let quick = parse_compact(line, &mut fast);
        let mut general = [Field::Other; 10];
        let parsed = parse_record(line, &mut general, &mut Vec::new());
        (quick, fast, parsed, general)
    }

    /// Mutate compact lines at random (insert, delete, replace bytes that matter to JSON) and
    /// check that whatever the fast path accepts, the general scanner accepts the same way.
    #[test]
    fn agrees_with_the_general_scanner_on_mutated_lines() {
        let seeds: [&[u8]; 3] = [
            br#"{"date":"2014-05-04","time":"00:50:55","size":695181,"r_version":"3.0.2","r_arch":"x86_64","r_os":"linux-gnu","package":"caret","version":"6.0-24","country":"MX","ip_id":1}"#,
            br#"{"ip_id":-0,"size":1.5e3,"r_os":null,"x":true,"y":false,"date":"","country":"NA"}"#,
            br#"{"size":18446744073709551615,"ip_id":-9223372036854775808,"a":0.5,"b":-1e-5}"#,
        ];
        let pieces: [&[u8]; 24] = [
            b"{",
            b"}",
            b"[",
            b"]",
            b",",
            b":",
            b"\"",
            b"\\",
            b"0",
            b"-",
            b".",
            b"e",
            b"E",
            b"+",
            b"1",
            b"9",
            b"null",
            b"true",
            b"false",
            b" ",
            b"\t",
            b"\xc3\xa9",
            b"\x01",
            b"\"date\":",
        ];
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let (mut accepted, mut total) = (0, 0);
        for _ in 0..200_000 {
            let mut line = seeds[next(seeds.len())].to_vec();
            for _ in 0..1 + next(3) {
                let at = next(line.len() + 1);
                match next(3) {
                    0 => line.splice(at..at, pieces[next(pieces.len())].iter().copied()).for_each(drop),
                    1 if at < line.len() => drop(line.remove(at)),
                    _ if at < line.len() => line[at] = pieces[next(pieces.len())][0],
                    _ => {}
                }
            }
            let (quick, fast, parsed, general) = both(&line);
            total += 1;
            if let Some(quick) = quick {
                accepted += 1;
                assert_eq!(quick, parsed, "{}", String::from_utf8_lossy(&line));
                assert_eq!(fast, general, "{}", String::from_utf8_lossy(&line));
            }
        }
        assert!(accepted > total / 20, "the mutations should leave the fast path some lines: {accepted}/{total}");
    }

    #[test]
    fn takes_compact_records_and_agrees_with_the_general_scanner() {
        for line in [
            &br#"{"date":"2014-05-04","time":"00:50:55","size":695181,"r_version":"3.0.2","r_arch":"x86_64","r_os":"linux-gnu","package":"caret","version":"6.0-24","country":"MX","ip_id":1}"#[..],
            br#"{"ip_id":-0,"size":1.5e3,"r_os":null,"x":true,"y":false,"date":"","date":"d"}"#,
            br#"{"a":1}"#,
            br#"{"":""}"#,
            br#"{"size":18446744073709551616,"ip_id":-9223372036854775808}"#,
        ] {
            let (quick, fast, parsed, general) = both(line);
            assert_eq!(quick, Some(Parsed::Object), "{}", String::from_utf8_lossy(line));
            assert_eq!(parsed, Parsed::Object);
            assert_eq!(fast, general);
        }
    }

    #[test]
    fn leaves_everything_else_to_the_general_scanner() {
        let long = [&br#"{"package":""#[..], &[b'x'; 600], br#""}"#].concat();
        for line in [
            &br#"{ "a":1}"#[..],
            br#"{"a" :1}"#,
            br#"{"a":1 }"#,
            br#"{"a":1} "#,
            br#"{"a":"\u0041"}"#,
            br#"{"a":"\""}"#,
            "{\"a\":\"é\"}".as_bytes(),
            b"{\"a\":\"\t\"}",
            br#"{"a":[1]}"#,
            br#"{"a":{}}"#,
            br#"{}"#,
            br#"[1]"#,
            br#"{"a":1,}"#,
            br#"{"a":01}"#,
            br#"{"a":1e400}"#,
            br#"{"a":nul}"#,
            br#"{"a":"x"1}"#,
            br#"{"a":1"b":2}"#,
            br#"{"a""b":1}"#,
            br#"{"a":1}}"#,
            br#"{"a":1},"#,
            br#"{"a:1}"#,
            br#"{"a":"#,
            br#"{"a":1,"b"#,
            br#"{"a"}"#,
            &long,
        ] {
            let (quick, ..) = both(line);
            assert_eq!(quick, None, "{}", String::from_utf8_lossy(line));
        }
    }
}
