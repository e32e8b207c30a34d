//! Counting the rows of a day file: what tiny/aggregate_count.py's `Sums.add` adds per row,
//! for the usual row the sink writes, over a whole block of lines at once.
//!
//! The contract: for every line of the block, either it is counted here exactly as
//! `_Sums.add` would count it, or its range is handed back in `deferred` and the caller
//! counts it with `_Sums.add` (the rule book). A line is counted here only when it is ASCII,
//! splits on commas into exactly ten fields, holds no doubled quote, its time field starts
//! with a quote and two digits of an hour below 24, its size and ip_id are plain decimal
//! digits fitting 64 bits (ip_id at least 1), and its package and country fields are each a
//! quoted string or a bare `NA`. Every other line (a string with a comma, a quote or a
//! non-ASCII character, anything edited by hand) is deferred, so the rule book decides it.
//!
//! Pure Rust, so it runs with the GIL released. The maps use the standard library's
//! randomly keyed hasher: the keys come from clients' records, and a fixed hash would let a
//! client make a fold quadratic with colliding package names.

use std::collections::HashMap;

/// What one block adds, borrowing its strings from the block.
#[derive(Debug, Default)]
pub struct Tally<'a> {
    pub rows: u64,
    pub bytes: u128,
    pub packages: HashMap<&'a [u8], u64>,
    pub hours: [u64; 24],
    /// ip_id -> (downloads, bytes)
    pub ips: HashMap<u64, (u64, u128)>,
    pub ip_hours: HashMap<(u64, u8), u64>,
    pub ip_countries: HashMap<(u64, &'a [u8]), u64>,
    /// `start..end` (without the LF) of each line left to the rule book, in block order.
    pub deferred: Vec<(usize, usize)>,
}

/// A row's fields that the counts use.
struct Row<'a> {
    hour: u8,
    size: u64,
    package: Option<&'a [u8]>,
    country: Option<&'a [u8]>,
    ip: u64,
}

/// Count the lines of `block[start..end]`; `end` is just past an LF or equals `start`
/// (a partial last line, if any, is left out by the caller).
pub fn tally(block: &[u8], start: usize, end: usize) -> Tally<'_> {
    let mut out = Tally::default();
    let text = &block[start..end];
    let mut pos = 0;
    while pos < text.len() {
        let stop = memchr::memchr(b'\n', &text[pos..]).map_or(text.len(), |k| pos + k);
        match row(&text[pos..stop]) {
            Some(r) => out.add(r),
            None => out.deferred.push((start + pos, start + stop)),
        }
        pos = stop + 1;
    }
    out
}

impl<'a> Tally<'a> {
    fn add(&mut self, r: Row<'a>) {
        self.rows += 1;
        self.bytes += u128::from(r.size);
        if let Some(package) = r.package {
            *self.packages.entry(package).or_insert(0) += 1;
        }
        self.hours[usize::from(r.hour)] += 1;
        let totals = self.ips.entry(r.ip).or_insert((0, 0));
        totals.0 += 1;
        totals.1 += u128::from(r.size);
        *self.ip_hours.entry((r.ip, r.hour)).or_insert(0) += 1;
        if let Some(country) = r.country {
            *self.ip_countries.entry((r.ip, country)).or_insert(0) += 1;
        }
    }
}

/// The usual row, or None: the line goes to the rule book.
fn row(line: &[u8]) -> Option<Row<'_>> {
    if !line.is_ascii() || memchr::memmem::find(line, b"\"\"").is_some() {
        return None;
    }
    let mut fields: [&[u8]; 10] = [&[]; 10];
    let mut count = 0;
    for field in line.split(|&b| b == b',') {
        *fields.get_mut(count)? = field;
        count += 1;
    }
    if count != 10 {
        return None;
    }
    let time = fields[1];
    if time.len() < 3 || time[0] != b'"' || !time[1].is_ascii_digit() || !time[2].is_ascii_digit() {
        return None;
    }
    let hour = (time[1] - b'0') * 10 + (time[2] - b'0');
    if hour >= 24 {
        return None;
    }
    let ip = digits(fields[9])?;
    if ip == 0 {
        return None;
    }
    Some(Row { hour, size: digits(fields[2])?, package: string(fields[6])?, country: string(fields[8])?, ip })
}

/// Plain decimal digits that fit 64 bits.
fn digits(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    field.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// `Some(Some(text))` for a quoted string, `Some(None)` for a bare NA, None otherwise.
fn string(field: &[u8]) -> Option<Option<&[u8]>> {
    match field {
        [b'"', inner @ .., b'"'] => Some(Some(inner)),
        b"NA" => Some(None),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW: &[u8] =
        b"\"2014-05-04\",\"13:05:01\",1234,\"3.1.0\",\"x86_64\",\"linux-gnu\",\"Rcpp\",\"0.11.1\",\"DE\",7\n";

    #[test]
    fn counts_the_usual_row() {
        let t = tally(ROW, 0, ROW.len());
        assert_eq!((t.rows, t.bytes, t.deferred.len()), (1, 1234, 0));
        assert_eq!(t.packages[&b"Rcpp"[..]], 1);
        assert_eq!(t.hours[13], 1);
        assert_eq!(t.ips[&7], (1, 1234));
        assert_eq!(t.ip_hours[&(7, 13)], 1);
        assert_eq!(t.ip_countries[&(7, &b"DE"[..])], 1);
    }

    #[test]
    fn bare_na_is_missing() {
        let line = b"\"2014-05-04\",\"00:00:00\",1,NA,NA,NA,NA,NA,NA,2\n";
        let t = tally(line, 0, line.len());
        assert_eq!((t.rows, t.packages.len(), t.ip_countries.len(), t.deferred.len()), (1, 0, 0, 0));
    }

    #[test]
    fn defers_what_the_rule_book_decides() {
        let lines: [&[u8]; 9] = [
            b"\"2014-05-04\",\"13:05:01\",1,\"a,b\",NA,NA,\"p\",NA,NA,1", // a comma in a string
            b"\"2014-05-04\",\"13:05:01\",1,\"a\"\"b\",NA,NA,\"p\",NA,NA,1", // a doubled quote
            b"\"2014-05-04\",\"24:05:01\",1,NA,NA,NA,\"p\",NA,NA,1",      // hour 24
            b"\"2014-05-04\",\"13:05:01\",18446744073709551616,NA,NA,NA,\"p\",NA,NA,1", // 2^64
            b"\"2014-05-04\",\"13:05:01\",1,NA,NA,NA,\"p\",NA,NA,0",      // ip_id 0
            b"\"2014-05-04\",\"13:05:01\",1,NA,NA,NA,p,NA,NA,1",          // a bare word
            "\"2014-05-04\",\"13:05:01\",1,NA,NA,NA,\"pé\",NA,NA,1".as_bytes(), // not ASCII
            b"\"2014-05-04\",\"13:05:01\",1,NA,NA,NA,\"p\",NA,NA,1\r",    // a CR
            b"",                                                          // an empty line
        ];
        for line in lines {
            let mut block = line.to_vec();
            block.push(b'\n');
            let t = tally(&block, 0, block.len());
            assert_eq!((t.rows, t.deferred.clone()), (0, vec![(0, line.len())]), "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn sums_bytes_past_64_bits_and_keeps_ranges_in_block_offsets() {
        let big = b"\"2014-05-04\",\"01:00:00\",18446744073709551615,NA,NA,NA,\"p\",NA,NA,18446744073709551615\n";
        let mut block = b"header\n".to_vec();
        block.extend_from_slice(big);
        block.extend_from_slice(big);
        block.extend_from_slice(b"odd\n");
        let t = tally(&block, 7, block.len());
        assert_eq!(t.bytes, 2 * u128::from(u64::MAX));
        assert_eq!(t.ips[&u64::MAX], (2, 2 * u128::from(u64::MAX)));
        let odd = 7 + 2 * big.len();
        assert_eq!(t.deferred, vec![(odd, odd + 3)]);
    }
}
