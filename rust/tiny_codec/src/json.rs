//! A strict, validating JSON scanner shaped for one record per line.
//!
//! It accepts exactly what orjson (the reference codec's oracle) accepts:
//!
//! - valid UTF-8 only (strict, as Python decodes it). Outside strings the grammar only
//!   allows ASCII, so the scanner validates the non-ASCII bytes it meets inside strings and
//!   a line it accepts is valid UTF-8; no separate pass over the body is needed;
//! - RFC 8259 grammar, whitespace = space, tab, CR, LF; nothing but whitespace after the
//!   value; no BOM, comments, trailing commas, NaN/Infinity, leading zeros or `+`;
//! - strings without raw control characters (U+0000..U+001F), only the standard escapes,
//!   and `\u` surrogates only as a high+low pair;
//! - at most [`MAX_DEPTH`] nested arrays/objects (the record object itself is depth 1);
//! - numbers that would be infinite as an f64 (`1e400`, a 400-digit integer) are errors.
//!
//! [`parse_record`] scans a whole line, validates all of it, and keeps only where the ten
//! known keys' values are ([`Field`]); everything else is skipped (but validated).
//!
//! Speed notes: all reads go through [`at`], which returns 0 past the end. A real NUL byte
//! is invalid in every position of JSON, so "end of input" and "NUL" can share one code
//! path and the scanner needs no separate bounds checks. Strings and digits are skipped 16
//! bytes at a time ([`crate::runs`]); escapes are only validated here and decoded later, for
//! the few fields that need the decoded text.

use crate::runs::{digit_run, string_run};

/// orjson's nesting limit: 1024 open arrays/objects are fine, 1025 are an error.
pub(crate) const MAX_DEPTH: usize = 1024;

/// The record's columns, in CSV order; [`Field`] slots use the same indices.
pub(crate) const COLUMNS: [&str; 10] =
    ["date", "time", "size", "r_version", "r_arch", "r_os", "package", "version", "country", "ip_id"];

/// The line is not JSON (as orjson sees it). Carries no detail: clients only see "invalid JSON".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Invalid;

type Scan<T> = Result<T, Invalid>;

/// What a known key's (last) value was, as far as the record checks care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    /// Key absent, or `null` (the reference treats both as missing).
    Missing,
    /// A string; `start..end` is its raw body between the quotes. Without escapes the raw
    /// bytes are the decoded text (valid UTF-8, no control characters, no quotes).
    Str { start: usize, end: usize, escaped: bool },
    /// An integer that orjson decodes as a Python int: -2^63 ..= 2^64-1. `start..end` are
    /// its digits without the sign: JSON has no leading zeros, so they are `str(abs(value))`.
    Int { negative: bool, start: usize, end: usize },
    /// Anything else: bool, float, out-of-range integer (a float to orjson), array, object.
    Other,
}

/// How a line parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// A JSON object; the known keys' values are in the field slots.
    Object,
    /// Valid JSON, but not an object.
    NotObject,
    /// Not valid JSON.
    Invalid,
}

/// The byte at `i`, or 0 past the end (see the module docs for why that is enough).
#[inline(always)]
pub(crate) fn at(s: &[u8], i: usize) -> u8 {
    match s.get(i) {
        Some(&b) => b,
        None => 0,
    }
}

#[inline(always)]
pub(crate) fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while let Some(&b) = s.get(i) {
        if b == b' ' || b == b'\t' || b == b'\r' || b == b'\n' {
            i += 1;
        } else {
            break;
        }
    }
    i
}

/// Validate the run of non-ASCII bytes starting at `i` as UTF-8 (strict: no overlongs,
/// surrogates or code points past U+10FFFF, as Python and orjson decode). A valid run of
/// multi-byte characters ends exactly where an ASCII byte (or the line) starts.
#[cold]
fn skip_non_ascii(s: &[u8], i: usize) -> Scan<usize> {
    let run = s.get(i..).unwrap_or_default();
    let len = run.iter().position(|&b| b < 0x80).unwrap_or(run.len());
    match std::str::from_utf8(&run[..len]) {
        Ok(_) => Ok(i + len),
        Err(_) => Err(Invalid),
    }
}

/// Scan a string body; `i` is just after the opening quote. Returns the index of the
/// closing quote and whether the body has escapes. Validates escapes and surrogates.
#[inline]
pub(crate) fn scan_string(s: &[u8], mut i: usize) -> Scan<(usize, bool)> {
    let mut escaped = false;
    loop {
        i = string_run(s, i);
        match at(s, i) {
            b'"' => return Ok((i, escaped)),
            b'\\' => {
                escaped = true;
                i = scan_escape(s, i + 1)?;
            }
            0x80..=0xFF => i = skip_non_ascii(s, i)?,
            _ => return Err(Invalid), // control character, or the line ended inside the string
        }
    }
}

/// Validate one escape; `i` is just after the backslash. Returns the index after it.
fn scan_escape(s: &[u8], i: usize) -> Scan<usize> {
    match at(s, i) {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Ok(i + 1),
        b'u' => match hex4(s, i + 1)? {
            0xD800..=0xDBFF => {
                // A high surrogate must be followed at once by an escaped low surrogate.
                if at(s, i + 5) == b'\\' && at(s, i + 6) == b'u' {
                    if let 0xDC00..=0xDFFF = hex4(s, i + 7)? {
                        return Ok(i + 11);
                    }
                }
                Err(Invalid)
            }
            0xDC00..=0xDFFF => Err(Invalid), // a lone low surrogate
            _ => Ok(i + 5),
        },
        _ => Err(Invalid),
    }
}

#[inline]
fn hex_digit(b: u8) -> Option<u32> {
    match b {
        b'0'..=b'9' => Some((b - b'0') as u32),
        b'a'..=b'f' => Some((b - b'a' + 10) as u32),
        b'A'..=b'F' => Some((b - b'A' + 10) as u32),
        _ => None,
    }
}

fn hex4(s: &[u8], i: usize) -> Scan<u32> {
    let mut value = 0;
    for k in 0..4 {
        value = value << 4 | hex_digit(at(s, i + k)).ok_or(Invalid)?;
    }
    Ok(value)
}

/// Append the decoded text of a string body already accepted by [`scan_string`] to `out`
/// (UTF-8). Never panics: on input that did not pass [`scan_string`] it just stops early.
pub(crate) fn decode_string(raw: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < raw.len() {
        // Copy the run up to the next backslash in one go.
        let run = memchr::memchr(b'\\', &raw[i..]).unwrap_or(raw.len() - i);
        out.extend_from_slice(&raw[i..i + run]);
        i += run;
        if i >= raw.len() {
            break;
        }
        let byte = match at(raw, i + 1) {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0C,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let Ok(unit) = hex4(raw, i + 2) else { return };
                let (code, used) = if (0xD800..=0xDBFF).contains(&unit) {
                    let Ok(low) = hex4(raw, i + 8) else { return };
                    (0x10000 + ((unit - 0xD800) << 10) + (low.wrapping_sub(0xDC00) & 0x3FF), 12)
                } else {
                    (unit, 6)
                };
                let Some(ch) = char::from_u32(code) else { return };
                let mut buf = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                i += used;
                continue;
            }
            _ => return,
        };
        out.push(byte);
        i += 2;
    }
}

/// Scan a number starting at `i` (a `-` or a digit). Returns the index after it and, when
/// orjson would make it a Python int (-2^63 ..= 2^64-1), whether it is negative; None for a
/// float. The value itself is never needed: JSON integers have no leading zeros, so their
/// digits are `str(abs(value))`, zero is the digit "0", and the range is a length and
/// lexicographic comparison.
#[inline(always)]
pub(crate) fn scan_number(s: &[u8], mut i: usize) -> Scan<(usize, Option<bool>)> {
    let start = i;
    let negative = at(s, i) == b'-';
    if negative {
        i += 1;
    }
    let int_start = i;
    match at(s, i) {
        b'0' => i += 1, // a leading zero stands alone: "01" leaves "1" for the caller to reject
        b'1'..=b'9' => i = digit_run(s, i + 1),
        _ => return Err(Invalid),
    }
    let int_digits = i - int_start;
    let mut integral = true;
    let mut exponent = false;
    if at(s, i) == b'.' {
        let end = digit_run(s, i + 1);
        if end == i + 1 {
            return Err(Invalid);
        }
        i = end;
        integral = false;
    }
    if at(s, i) | 0x20 == b'e' {
        i += 1;
        if at(s, i) == b'+' || at(s, i) == b'-' {
            i += 1;
        }
        let end = digit_run(s, i);
        if end == i {
            return Err(Invalid);
        }
        i = end;
        integral = false;
        exponent = true;
    }
    if integral {
        let limit: &[u8] = if negative { b"9223372036854775808" } else { b"18446744073709551615" };
        let digits = &s[int_start..i];
        if digits.len() < limit.len() || (digits.len() == limit.len() && digits <= limit) {
            return Ok((i, Some(negative)));
        }
    }
    // A float to orjson, which refuses it if it rounds to infinity. Without an exponent a
    // number below 10^308 is finite, so only long integers and exponents need the (correctly
    // rounded, like orjson's) full parse.
    if exponent || int_digits > 308 {
        let finite = std::str::from_utf8(&s[start..i])
            .ok()
            .and_then(|text| text.parse::<f64>().ok())
            .is_some_and(f64::is_finite);
        if !finite {
            return Err(Invalid);
        }
    }
    Ok((i, None))
}

#[inline]
pub(crate) fn literal(s: &[u8], i: usize, word: &[u8]) -> Scan<usize> {
    // Compare as a fixed-size prefix so that it compiles to one or two integer compares.
    let matches = match word.len() {
        4 => s.get(i..i + 4).and_then(|b| <[u8; 4]>::try_from(b).ok()) == word.try_into().ok(),
        5 => s.get(i..i + 5).and_then(|b| <[u8; 5]>::try_from(b).ok()) == word.try_into().ok(),
        _ => false,
    };
    if matches {
        Ok(i + word.len())
    } else {
        Err(Invalid)
    }
}

/// Skip (and validate) any scalar: string, number, true, false, null.
#[inline]
fn skip_scalar(s: &[u8], i: usize) -> Scan<usize> {
    match at(s, i) {
        b'"' => scan_string(s, i + 1).map(|(end, _)| end + 1),
        b'-' | b'0'..=b'9' => scan_number(s, i).map(|(end, _)| end),
        b't' => literal(s, i, b"true"),
        b'f' => literal(s, i, b"false"),
        b'n' => literal(s, i, b"null"),
        _ => Err(Invalid),
    }
}

/// Skip (and validate) one value starting at `i` (not whitespace), which sits inside
/// `depth` already open containers. Returns the index after it.
pub(crate) fn skip_value(s: &[u8], i: usize, depth: usize) -> Scan<usize> {
    match at(s, i) {
        b'[' | b'{' => skip_container(s, i, depth),
        _ => skip_scalar(s, i),
    }
}

/// Expect `"key"` `:` at `i` inside an object; returns the index of the value.
#[inline]
fn member_key(s: &[u8], i: usize) -> Scan<usize> {
    if at(s, i) != b'"' {
        return Err(Invalid);
    }
    let (end, _) = scan_string(s, i + 1)?;
    let i = skip_ws(s, end + 1);
    if at(s, i) != b':' {
        return Err(Invalid);
    }
    Ok(skip_ws(s, i + 1))
}

/// Skip a nested array/object at `i` without recursion, so hostile nesting cannot overflow
/// the native stack; one bit per open container says whether it is an object.
fn skip_container(s: &[u8], mut i: usize, base: usize) -> Scan<usize> {
    let mut objects = [0u64; MAX_DEPTH / 64 + 1];
    let mut depth = base;
    loop {
        // `i` is at the first byte of a value.
        let b = at(s, i);
        if b == b'[' || b == b'{' {
            depth += 1;
            if depth > MAX_DEPTH {
                return Err(Invalid);
            }
            let level = depth - base - 1; // < MAX_DEPTH because base >= 0
            let object = b == b'{';
            if object {
                objects[level / 64] |= 1 << (level % 64);
            } else {
                objects[level / 64] &= !(1 << (level % 64));
            }
            i = skip_ws(s, i + 1);
            if at(s, i) == if object { b'}' } else { b']' } {
                i += 1;
                depth -= 1; // empty container: a complete value, fall through
            } else {
                if object {
                    i = member_key(s, i)?;
                }
                continue; // to the first element's value
            }
        } else {
            i = skip_scalar(s, i)?;
        }
        // After a complete value: close containers until one has a next element.
        loop {
            if depth == base {
                return Ok(i);
            }
            let level = depth - base - 1;
            let object = objects[level / 64] >> (level % 64) & 1 == 1;
            i = skip_ws(s, i);
            match at(s, i) {
                b',' => {
                    i = skip_ws(s, i + 1);
                    if object {
                        i = member_key(s, i)?;
                    }
                    break;
                }
                b'}' if object => {
                    i += 1;
                    depth -= 1;
                }
                b']' if !object => {
                    i += 1;
                    depth -= 1;
                }
                _ => return Err(Invalid),
            }
        }
    }
}

/// A key of 4..=8 bytes as one word: its first four and last four bytes (overlapping when
/// shorter than 8). Together with the length this identifies the key exactly.
#[inline(always)]
const fn pack(k: &[u8]) -> u64 {
    let n = k.len();
    let head = u32::from_le_bytes([k[0], k[1], k[2], k[3]]) as u64;
    let tail = u32::from_le_bytes([k[n - 4], k[n - 3], k[n - 2], k[n - 1]]) as u64;
    head | tail << 32
}

/// A key's word for the lookup, if it is 4..=9 bytes long (the columns' lengths): 9-byte
/// keys (only "r_version") are packed without their first byte, which is checked apart.
#[inline(always)]
const fn key_word(k: &[u8]) -> Option<u64> {
    match k.len() {
        4..=8 => Some(pack(k)),
        9 => Some(pack(k.split_at(1).1)),
        _ => None,
    }
}

/// Multiplier of a perfect hash: `(word * KEY_HASH) >> 60` differs for the ten columns'
/// words (checked when KEY_TABLE is built). A table lookup instead of a chain of compares
/// keeps the key dispatch free of branches that mispredict when key order varies.
const KEY_HASH: u64 = 0x90c1_92cf_d3ac_94af;

#[derive(Clone, Copy)]
struct KeyEntry {
    word: u64,
    len: usize,
    slot: usize,
}

static KEY_TABLE: [KeyEntry; 16] = {
    let mut table = [KeyEntry { word: 0, len: 0, slot: 0 }; 16];
    let mut slot = 0;
    while slot < COLUMNS.len() {
        let name = COLUMNS[slot].as_bytes();
        let Some(word) = key_word(name) else { panic!("column names are 4..=9 bytes") };
        let h = (word.wrapping_mul(KEY_HASH) >> 60) as usize;
        assert!(table[h].len == 0, "KEY_HASH must separate the columns");
        table[h] = KeyEntry { word, len: name.len(), slot };
        slot += 1;
    }
    table
};

/// Which field slot a (decoded) key fills, if it is one of the ten columns.
#[inline]
pub(crate) fn key_slot(key: &[u8]) -> Option<usize> {
    let word = key_word(key)?;
    let entry = &KEY_TABLE[(word.wrapping_mul(KEY_HASH) >> 60) as usize];
    let first_ok = key.len() != 9 || key.first() == Some(&b'r');
    (entry.word == word && entry.len == key.len() && first_ok).then_some(entry.slot)
}

/// Parse a known key's value at `i` into `field`; returns the index after it.
///
/// Writes the slot in place rather than returning a `Field`: returning the enum made the
/// caller copy it through the stack with wide loads right after narrow stores, a
/// store-forwarding stall that cost about a third of the run time.
#[inline(always)]
fn field_value(s: &[u8], i: usize, field: &mut Field) -> Scan<usize> {
    match at(s, i) {
        b'"' => {
            let (end, escaped) = scan_string(s, i + 1)?;
            *field = Field::Str { start: i + 1, end, escaped };
            Ok(end + 1)
        }
        b'-' | b'0'..=b'9' => {
            let (end, int) = scan_number(s, i)?;
            *field = match int {
                Some(negative) => Field::Int { negative, start: i + negative as usize, end },
                None => Field::Other,
            };
            Ok(end)
        }
        b'n' => {
            let end = literal(s, i, b"null")?;
            *field = Field::Missing;
            Ok(end)
        }
        _ => {
            let end = skip_value(s, i, 1)?;
            *field = Field::Other;
            Ok(end)
        }
    }
}

/// Parse one line, any line: validate all of it as JSON and, when it is an object, fill
/// `fields` with its known keys' values (the last of duplicates wins, like a Python dict).
/// `key_buf` is scratch space for keys written with escapes. ([`crate::fast::parse_line`]
/// tries its fast path first.)
pub(crate) fn parse_record(s: &[u8], fields: &mut [Field; 10], key_buf: &mut Vec<u8>) -> Parsed {
    *fields = [Field::Missing; 10];
    let i = skip_ws(s, 0);
    if at(s, i) != b'{' {
        return match skip_value(s, i, 0) {
            Ok(end) if skip_ws(s, end) == s.len() => Parsed::NotObject,
            _ => Parsed::Invalid,
        };
    }
    match parse_members(s, i + 1, fields, key_buf) {
        Ok(end) if skip_ws(s, end) == s.len() => Parsed::Object,
        _ => Parsed::Invalid,
    }
}

/// The members of the top-level object; `i` is just after its `{`.
fn parse_members(s: &[u8], i: usize, fields: &mut [Field; 10], key_buf: &mut Vec<u8>) -> Scan<usize> {
    let mut i = skip_ws(s, i);
    if at(s, i) == b'}' {
        return Ok(i + 1);
    }
    loop {
        if at(s, i) != b'"' {
            return Err(Invalid);
        }
        let (end, escaped) = scan_string(s, i + 1)?;
        let slot = if escaped {
            key_buf.clear();
            decode_string(&s[i + 1..end], key_buf);
            key_slot(key_buf)
        } else {
            key_slot(&s[i + 1..end])
        };
        i = skip_ws(s, end + 1);
        if at(s, i) != b':' {
            return Err(Invalid);
        }
        i = skip_ws(s, i + 1);
        match slot {
            Some(slot) => i = field_value(s, i, &mut fields[slot])?,
            None => i = skip_value(s, i, 1)?,
        }
        i = skip_ws(s, i);
        match at(s, i) {
            b',' => i = skip_ws(s, i + 1),
            b'}' => return Ok(i + 1),
            _ => return Err(Invalid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(text: &[u8]) -> bool {
        let mut fields = [Field::Missing; 10];
        parse_record(text, &mut fields, &mut Vec::new()) != Parsed::Invalid
    }

    fn decoded(body: &[u8]) -> Option<Vec<u8>> {
        let (end, _) = scan_string(body, 0).ok()?;
        assert_eq!(end, body.len() - 1, "closing quote");
        let mut out = Vec::new();
        decode_string(&body[..end], &mut out);
        Some(out)
    }

    #[test]
    fn string_unescape() {
        assert_eq!(decoded(b"plain\"").unwrap(), b"plain");
        assert_eq!(decoded(br#"a\"b\\c\/d\b\f\n\r\t""#).unwrap(), b"a\"b\\c/d\x08\x0c\n\r\t");
        assert_eq!(decoded(br#"d\u0061te\u00e9\u20AC""#).unwrap(), "date\u{e9}\u{20ac}".as_bytes());
        assert_eq!(decoded(br#"\ud83d\ude00\udbff\udfff""#).unwrap(), "\u{1F600}\u{10FFFF}".as_bytes());
        assert_eq!(decoded(br#"\u0000""#).unwrap(), b"\0");
        assert_eq!(decoded("é\u{10000}\"".as_bytes()).unwrap(), "é\u{10000}".as_bytes());
    }

    #[test]
    fn string_rejects_bad_escapes_and_surrogates() {
        for bad in [
            &br#"\x""#[..],
            br#"\U0041""#,
            br#"\u12""#,
            br#"\u12G4""#,
            br#"\ud800""#,
            br#"\udc00""#,
            br#"\ud800\u0041""#,
            br#"\ud800\ud800""#,
            br#"\ud800x""#,
            br#"\ud800\""#,
            b"\\",
            b"abc",
            b"tab\there\"",
            b"nul\0\"",
            b"\x1f\"",
        ] {
            assert!(scan_string(bad, 0).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(scan_string(b"del\x7f\"", 0).is_ok());
    }

    #[test]
    fn string_utf8_is_validated_strictly() {
        for good in
            ["é\"", "€ and 😀 and \u{10FFFF}\"", "mixed ascii é ascii 中文字符串 long enough to pass several words\""]
        {
            assert!(scan_string(good.as_bytes(), 0).is_ok(), "{good}");
        }
        for bad in [
            &b"\xff\""[..],
            b"\x80\"",
            b"\xc0\x80\"",
            b"\xc3\"",
            b"\xe2\x82\"",
            b"\xed\xa0\x80\"",
            b"\xf4\x90\x80\x80\"",
            b"\xf8\x88\x80\x80\x80\"",
            b"0123456789abcdef\xe2\x82",
            b"ok \xc3\xa9 then \xc3\"",
        ] {
            assert!(scan_string(bad, 0).is_err(), "{:?}", bad);
        }
        // Outside strings non-ASCII is never JSON.
        assert!(!valid("{\"a\":1}\u{a0}".as_bytes()));
    }

    /// `Some(int)` when all of `text` is a number: `int` as [`scan_number`] gives it.
    fn number(text: &[u8]) -> Option<Option<bool>> {
        match scan_number(text, 0) {
            Ok((end, int)) if end == text.len() => Some(int),
            _ => None,
        }
    }

    const FLOAT: Option<Option<bool>> = Some(None);

    #[test]
    fn integer_range_follows_orjson() {
        for (text, negative) in [
            (&b"0"[..], false),
            (b"-0", true),
            (b"695181", false),
            (b"18446744073709551615", false),
            (b"9999999999999999999", false),
            (b"-9223372036854775808", true),
            (b"-999999999999999999", true),
        ] {
            assert_eq!(number(text), Some(Some(negative)), "{:?}", String::from_utf8_lossy(text));
        }
        for float in [
            &b"18446744073709551616"[..],
            b"18446744073709551620",
            b"99999999999999999999",
            b"100000000000000000000",
            b"-9223372036854775809",
            b"-9999999999999999999",
            b"-10000000000000000000",
            b"1.0",
            b"1e2",
            b"1E-0",
            b"-0.0",
        ] {
            assert_eq!(number(float), FLOAT, "{:?}", String::from_utf8_lossy(float));
        }
    }

    #[test]
    fn number_grammar_and_infinity() {
        for bad in [&b"01"[..], b"-01", b"1.", b".5", b"+1", b"-", b"1e", b"1e+", b"1.e5", b"-a"] {
            assert_eq!(number(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(scan_number(b"1e400", 0).is_err());
        assert!(scan_number(b"-1.7976931348623159e308", 0).is_err());
        assert!(scan_number(b"0.1e310", 0).is_err());
        assert_eq!(number(b"1.7976931348623158e308"), FLOAT);
        assert_eq!(number(b"1e-400"), FLOAT);
        assert_eq!(number(b"0e99999999999999999999"), FLOAT);
        let big = [b'9'; 400];
        assert!(scan_number(&big, 0).is_err());
        assert_eq!(number(&[b'9'; 308]), FLOAT);
        let mut e308 = vec![b'1'];
        e308.extend([b'0'; 308]);
        assert_eq!(number(&e308), FLOAT);
        e308.push(b'0');
        assert!(scan_number(&e308, 0).is_err());
    }

    fn nested(open: &[u8], close: &[u8], levels: usize) -> Vec<u8> {
        let mut text = open.repeat(levels);
        text.push(b'1');
        text.extend(close.repeat(levels));
        text
    }

    #[test]
    fn depth_limit_is_1024() {
        assert!(valid(&nested(b"[", b"]", 1024)));
        assert!(!valid(&nested(b"[", b"]", 1025)));
        assert!(valid(&nested(b"{\"a\":", b"}", 1024)));
        assert!(!valid(&nested(b"{\"a\":", b"}", 1025)));
        // The record object is depth 1: 1023 more levels inside it are fine, 1024 are not.
        let inside = |levels| [&b"{\"date\":"[..], &nested(b"[", b"]", levels), b"}"].concat();
        assert!(valid(&inside(1023)));
        assert!(!valid(&inside(1024)));
        let unknown = |levels| [&b"{\"x\":"[..], &nested(b"[", b"]", levels), b"}"].concat();
        assert!(valid(&unknown(1023)));
        assert!(!valid(&unknown(1024)));
        assert!(valid(&[&b"{\"x\":["[..], &b"[],".repeat(5000), b"[]]}"].concat()[..]));
    }

    #[test]
    fn grammar() {
        for good in [
            &b"{}"[..],
            b" {} \t\r",
            b"[]",
            b"[1,[2,{}],{\"a\":[null,true,false]}]",
            b"\"s\"",
            b"-0.5e-3",
            b"{\"a\":{\"b\":{}},\"c\":[]}",
            b"{\"a\" : 1 , \"b\" :2}",
            b"{\"\":1}",
        ] {
            assert!(valid(good), "{:?}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b"{"[..],
            b"}",
            b"[1,]",
            b"{\"a\":1,}",
            b"{,}",
            b"[,1]",
            b"{\"a\" 1}",
            b"{1:2}",
            b"{} x",
            b"{}\x0c",
            b"\x0c{}",
            b"NaN",
            b"Infinity",
            b"tru",
            b"nul",
            b"{\"a\":tRue}",
            b"[]]",
            b"{\"a\":}",
            b"{\"a\":1 \"b\":2}",
            b"{}\0",
            b"",
            b"  ",
            b"[1 2]",
            b"{\"a\":1,,\"b\":2}",
            b"{\"a\":[1}",
            b"{\"a\":{]}",
            b"'a'",
        ] {
            assert!(!valid(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn known_fields_last_wins_and_escaped_keys() {
        let mut fields = [Field::Missing; 10];
        let line = br#"{"date":1,"d\u0061te":"x","size":-0,"ip_id":null,"r_os":[1],"zzz":{"date":2}}"#;
        assert_eq!(parse_record(line, &mut fields, &mut Vec::new()), Parsed::Object);
        assert!(matches!(fields[0], Field::Str { escaped: false, .. }));
        assert_eq!(fields[2], Field::Int { negative: true, start: 34, end: 35 });
        assert_eq!(&line[33..35], b"-0");
        assert_eq!(fields[9], Field::Missing);
        assert_eq!(fields[5], Field::Other);
        assert_eq!(fields[1], Field::Missing);
        assert_eq!(parse_record(b"[1]", &mut fields, &mut Vec::new()), Parsed::NotObject);
        assert_eq!(parse_record(b"null", &mut fields, &mut Vec::new()), Parsed::NotObject);
    }

    #[test]
    fn key_slots() {
        for (slot, name) in COLUMNS.iter().enumerate() {
            assert_eq!(key_slot(name.as_bytes()), Some(slot));
        }
        for other in [
            &b""[..],
            b"dat",
            b"datE",
            b"tame",
            b"r_ver5ion",
            b"R_version",
            b"x_version",
            b"r_archh",
            b"ip_ie",
            b"countrz",
            b"countr",
            b"r_os\0",
            b"pack\0age",
            b"version_",
            b"r_version\0",
        ] {
            assert_eq!(key_slot(other), None);
        }
    }
}
