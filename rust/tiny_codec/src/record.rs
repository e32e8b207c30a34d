//! The record rules of tiny/codec.py's `record_row`, and the CSV row they produce.
//!
//! Fields are checked in column order and the first failure is the reason; the row is
//! written while checking and cut back by the caller's `out.truncate` on failure.

use crate::json::Field;

/// Strings longer than this many characters (code points) are refused.
pub(crate) const MAX_STRING: usize = 1024;

/// The reasons of the six string fields, in column order: not a string, too long, control.
macro_rules! string_reasons {
    ($($name:literal),*) => {
        [$([
            concat!($name, ": not a string or null"),
            concat!($name, ": longer than 1024 characters"),
            concat!($name, ": control character"),
        ]),*]
    };
}
const STRING_REASONS: [[&str; 3]; 6] = string_reasons!("r_version", "r_arch", "r_os", "package", "version", "country");

/// `[0-9]{4}-[0-9]{2}-[0-9]{2}` naming a real Gregorian date in years 1..=9999 (Python's
/// `datetime.date` rules). Returns it as the number YYYYMMDD (a cheap key for grouping).
pub(crate) fn check_date(text: &[u8]) -> Option<u32> {
    let d: &[u8; 10] = text.try_into().ok()?;
    let digit = |k: usize| if d[k].is_ascii_digit() { Some((d[k] - b'0') as u32) } else { None };
    if d[4] != b'-' || d[7] != b'-' {
        return None;
    }
    let year = digit(0)? * 1000 + digit(1)? * 100 + digit(2)? * 10 + digit(3)?;
    let month = digit(5)? * 10 + digit(6)?;
    let day = digit(8)? * 10 + digit(9)?;
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    (year >= 1 && day >= 1 && day <= days_in_month).then_some(year * 10000 + month * 100 + day)
}

/// The `YYYY-MM-DD` text of a [`check_date`] number.
pub(crate) fn day_text(yyyymmdd: u32) -> [u8; 10] {
    let digit = |value: u32| b'0' + (value % 10) as u8;
    let (y, m, d) = (yyyymmdd / 10000, yyyymmdd / 100 % 100, yyyymmdd % 100);
    [
        digit(y / 1000),
        digit(y / 100),
        digit(y / 10),
        digit(y),
        b'-',
        digit(m / 10),
        digit(m),
        b'-',
        digit(d / 10),
        digit(d),
    ]
}

/// `([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]`, nothing more.
pub(crate) fn check_time(text: &[u8]) -> bool {
    let Ok(t) = <[u8; 8]>::try_from(text) else { return false };
    let hour_ok = match t[0] {
        b'0' | b'1' => t[1].is_ascii_digit(),
        b'2' => (b'0'..=b'3').contains(&t[1]),
        _ => false,
    };
    hour_ok
        && t[2] == b':'
        && (b'0'..=b'5').contains(&t[3])
        && t[4].is_ascii_digit()
        && t[5] == b':'
        && (b'0'..=b'5').contains(&t[6])
        && t[7].is_ascii_digit()
}

/// Number of Unicode code points in valid UTF-8: every byte that is not a continuation.
#[inline]
pub(crate) fn code_points(text: &[u8]) -> usize {
    text.iter().filter(|&&b| b & 0xC0 != 0x80).count()
}

/// The decoded text of a string field: the raw bytes when unescaped, else decoded into `scratch`.
#[inline]
fn text<'a>(line: &'a [u8], start: usize, end: usize, escaped: bool, scratch: &'a mut Vec<u8>) -> &'a [u8] {
    let raw = line.get(start..end).unwrap_or_default();
    if escaped {
        scratch.clear();
        crate::json::decode_string(raw, scratch);
        scratch
    } else {
        raw
    }
}

/// The CSV rows of a body, written back to back.
///
/// Speed: the buffer is kept zero-filled beyond `len`, and each row first makes sure it has
/// room for the longest row its line could give ([`row_bound`]). Writes are then plain
/// indexed stores, and short strings are copied as one fixed 16-byte block (the bytes past
/// the string are overwritten by what follows) instead of a `memcpy` call per field.
#[derive(Debug, Default)]
pub(crate) struct Rows {
    buf: Vec<u8>,
    len: usize,
}

/// Longest row (plus the 16-byte over-copy) a line of `line_len` bytes can give: quotes,
/// commas, two 20-digit integers and the date and time take under 100 bytes, and each
/// string's text is at most its raw JSON length, at most doubled by quote doubling.
#[inline]
pub(crate) fn row_bound(line_len: usize) -> usize {
    2 * line_len + 128
}

impl Rows {
    pub fn with_capacity(capacity: usize) -> Rows {
        Rows { buf: vec![0; capacity], len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Drop a partly written row.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    pub fn into_vec(mut self) -> Vec<u8> {
        self.buf.truncate(self.len);
        self.buf
    }

    /// Room for `bound` more bytes (amortised doubling, so each byte is zeroed once).
    #[inline]
    fn reserve(&mut self, bound: usize) {
        if self.len + bound > self.buf.len() {
            let size = (self.len + bound).max(2 * self.buf.len());
            self.buf.resize(size, 0);
        }
    }

    #[inline(always)]
    fn put(&mut self, byte: u8) {
        self.buf[self.len] = byte;
        self.len += 1;
    }

    #[inline(always)]
    fn put_slice(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    /// Copy `src[start..end]`, as one 16-byte block when it is that short and `src` has 16
    /// bytes from `start` (`src` may go on past the line: see [`encode_fields`]).
    #[inline(always)]
    fn put_text(&mut self, src: &[u8], start: usize, end: usize) {
        let n = end.saturating_sub(start);
        if n <= 16 {
            if let (Some(src), Some(dst)) = (src.get(start..start + 16), self.buf.get_mut(self.len..self.len + 16)) {
                dst.copy_from_slice(src);
                self.len += n;
                return;
            }
        }
        self.put_slice(src.get(start..end).unwrap_or_default());
    }
}

/// Check `size` or `ip_id` and write it (its JSON digits, which are Python's `str(int)`).
#[inline(always)]
fn integer(
    line: &[u8],
    src: &[u8],
    field: Field,
    minimum: u8,
    reasons: [&'static str; 3],
    out: &mut Rows,
) -> Result<(), &'static str> {
    match field {
        Field::Missing => Err(reasons[0]),
        Field::Int { negative, start, end } => {
            // No leading zeros in JSON: the value is zero exactly when its digits are "0".
            let zero = line.get(start..end) == Some(b"0");
            if (negative && !zero) || (zero && minimum > 0) {
                Err(reasons[2])
            } else {
                out.put_text(src, start, end);
                Ok(())
            }
        }
        _ => Err(reasons[1]),
    }
}

/// Validate the fields of one JSON object and append its CSV row (LF-terminated) to `out`.
/// Returns the record's date as YYYYMMDD, or the reason for refusing it; on refusal `out`
/// may hold a partial row, which the caller truncates.
///
/// `src` is `line` followed by whatever follows it in the body (the next lines): field
/// offsets index both, and short unescaped texts are copied from `src` as 16-byte blocks,
/// which then works for the fields at the end of a line too.
pub(crate) fn encode_fields(
    line: &[u8],
    src: &[u8],
    fields: &[Field; 10],
    out: &mut Rows,
    scratch: &mut Vec<u8>,
) -> Result<u32, &'static str> {
    out.reserve(row_bound(line.len()));
    // date
    let day = match fields[0] {
        Field::Missing => return Err("date: missing"),
        Field::Str { start, end, escaped } => {
            let date = text(line, start, end, escaped, scratch);
            let day = check_date(date).ok_or("date: not a calendar date YYYY-MM-DD")?;
            out.put(b'"');
            if escaped {
                out.put_slice(date);
            } else {
                out.put_text(src, start, end);
            }
            day
        }
        _ => return Err("date: not a string"),
    };
    out.put_slice(b"\",\"");
    // time
    match fields[1] {
        Field::Missing => return Err("time: missing"),
        Field::Str { start, end, escaped } => {
            let time = text(line, start, end, escaped, scratch);
            if !check_time(time) {
                return Err("time: not a time of day HH:MM:SS");
            }
            if escaped {
                out.put_slice(time);
            } else {
                out.put_text(src, start, end);
            }
        }
        _ => return Err("time: not a string"),
    }
    out.put_slice(b"\",");
    integer(line, src, fields[2], 0, ["size: missing", "size: not an integer", "size: less than 0"], out)?;
    // the six strings: quoted with " doubled, or a bare NA for null/absent
    for (field, reasons) in fields[3..9].iter().zip(STRING_REASONS) {
        match *field {
            Field::Missing => out.put_slice(b",NA"),
            Field::Str { start, end, escaped: false } => {
                // Unescaped JSON text has no quotes or control characters, and its byte
                // length bounds its code points, so usually only a copy is needed.
                if end - start > MAX_STRING && code_points(line.get(start..end).unwrap_or_default()) > MAX_STRING {
                    return Err(reasons[1]);
                }
                out.put_slice(b",\"");
                out.put_text(src, start, end);
                out.put(b'"');
            }
            Field::Str { start, end, escaped: true } => {
                let value = text(line, start, end, true, scratch);
                if value.len() > MAX_STRING && code_points(value) > MAX_STRING {
                    return Err(reasons[1]);
                }
                if value.iter().any(|&b| b < 0x20) {
                    return Err(reasons[2]);
                }
                out.put_slice(b",\"");
                for &b in value.iter() {
                    if b == b'"' {
                        out.put(b'"');
                    }
                    out.put(b);
                }
                out.put(b'"');
            }
            _ => return Err(reasons[0]),
        }
    }
    out.put(b',');
    integer(line, src, fields[9], 1, ["ip_id: missing", "ip_id: not an integer", "ip_id: less than 1"], out)?;
    out.put(b'\n');
    Ok(day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        for good in ["2014-05-04", "0001-01-01", "9999-12-31", "2000-02-29", "2012-02-29", "2014-01-31"] {
            assert!(check_date(good.as_bytes()).is_some(), "{good}");
        }
        for bad in [
            "0000-01-01",
            "2014-02-29",
            "1900-02-29",
            "2014-02-30",
            "2014-04-31",
            "2014-13-01",
            "2014-00-10",
            "2014-01-00",
            "2014-5-04",
            "2014-05-4",
            "2014/05/04",
            "2014-05-04 ",
            " 2014-05-04",
            "20140504",
            "2014-05-0a",
            "２014-05-04",
            "",
            "2014-05-04T00",
        ] {
            assert!(check_date(bad.as_bytes()).is_none(), "{bad}");
        }
    }

    #[test]
    fn date_numbers_and_texts() {
        assert_eq!(check_date(b"2014-05-04"), Some(20140504));
        assert_eq!(check_date(b"0001-01-01"), Some(10101));
        for text in ["2014-05-04", "0001-01-01", "9999-12-31", "0999-10-09"] {
            assert_eq!(day_text(check_date(text.as_bytes()).unwrap()), text.as_bytes());
        }
    }

    #[test]
    fn times() {
        for good in ["00:00:00", "23:59:59", "19:05:09", "09:30:00"] {
            assert!(check_time(good.as_bytes()), "{good}");
        }
        for bad in [
            "24:00:00",
            "23:60:00",
            "23:59:60",
            "3:04:05",
            "03:04:5",
            "03-04-05",
            "03:04:05 ",
            "",
            "0a:00:00",
            "30:00:00",
        ] {
            assert!(!check_time(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn code_point_count() {
        assert_eq!(code_points(b""), 0);
        assert_eq!(code_points("aé€😀".as_bytes()), 4);
    }

    fn encode(line: &str) -> Result<String, &'static str> {
        let mut fields = [Field::Missing; 10];
        let parsed = crate::json::parse_record(line.as_bytes(), &mut fields, &mut Vec::new());
        assert_eq!(parsed, crate::json::Parsed::Object);
        let mut out = Rows::default();
        encode_fields(line.as_bytes(), line.as_bytes(), &fields, &mut out, &mut Vec::new())
            .map(|_| String::from_utf8(out.into_vec()).unwrap())
    }

    #[test]
    fn rows_and_reasons() {
        let base = r#""date":"2014-05-04","time":"00:50:55","size":695181"#;
        assert_eq!(
            encode(&format!(r#"{{{base},"r_version":"3.0.2","package":"a\"b,c","country":"\u00e9","ip_id":1}}"#)),
            Ok("\"2014-05-04\",\"00:50:55\",695181,\"3.0.2\",NA,NA,\"a\"\"b,c\",NA,\"é\",1\n".into())
        );
        assert_eq!(encode(r#"{"size":-0}"#), Err("date: missing"));
        assert_eq!(encode(r#"{"date":null}"#), Err("date: missing"));
        assert_eq!(encode(r#"{"date":true}"#), Err("date: not a string"));
        assert_eq!(encode(r#"{"date":"2014-02-30"}"#), Err("date: not a calendar date YYYY-MM-DD"));
        assert_eq!(encode(r#"{"date":"2014-02-28","time":"24:00:00"}"#), Err("time: not a time of day HH:MM:SS"));
        assert_eq!(encode(&format!(r#"{{{base},"size":1.0}}"#)), Err("size: not an integer"));
        assert_eq!(encode(&format!(r#"{{{base},"size":-1}}"#)), Err("size: less than 0"));
        assert_eq!(encode(&format!(r#"{{{base},"r_os":1}}"#)), Err("r_os: not a string or null"));
        assert_eq!(encode(&format!(r#"{{{base},"country":"\u001f"}}"#)), Err("country: control character"));
        let long = "x".repeat(1025);
        assert_eq!(encode(&format!(r#"{{{base},"package":"{long}\n"}}"#)), Err("package: longer than 1024 characters"));
        assert_eq!(encode(&format!(r#"{{{base},"ip_id":0}}"#)), Err("ip_id: less than 1"));
        assert_eq!(encode(&format!(r#"{{{base},"ip_id":-0}}"#)), Err("ip_id: less than 1"));
        assert_eq!(encode(&format!(r#"{{{base}}}"#)), Err("ip_id: missing"));
        let ok =
            encode(&format!(r#"{{{base},"size":-0,"version":"{}","ip_id":18446744073709551615}}"#, "é".repeat(1024)));
        let ok = ok.unwrap();
        assert!(ok.starts_with("\"2014-05-04\",\"00:50:55\",0,NA,"), "-0 is written as 0: {ok}");
        assert!(ok.ends_with(",18446744073709551615\n"));
    }
}
