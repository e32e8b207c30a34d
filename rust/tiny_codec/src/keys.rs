//! The key log's records taken into the key table, the loop a server's start runs once per key
//! (tiny/keyload.py `_take`, which keeps the same loop in Python for the reference codec), and
//! the table's hash of a key (tiny/keylog.py `key_hash`).
//!
//! A record (tiny/keylog.py has the layout): length (4, big-endian) | CRC-32 of the rest (4) |
//! seq (8) | stored (8, a big-endian double) | flags (1) | key length (1) | digest length (1) |
//! key | digest | answer. The table is two arrays of the same power-of-two length, hashes and
//! places, open addressing with linear probing; a hash of 0 marks an empty slot.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::OnceLock;

/// The bytes before a record's key: its length, CRC-32, seq, stored, flags and two lengths.
pub const FIXED: usize = 27;
/// The flag of a flush's first record.
pub const FIRST: u8 = 1;

/// The table's hash of `key`: SipHash-1-3 (std's `RandomState`) under keys drawn once per
/// process, so that no client can aim its keys at one run of slots; never 0 (an empty slot).
pub fn key_hash(key: &[u8]) -> i64 {
    static STATE: OnceLock<RandomState> = OnceLock::new();
    match STATE.get_or_init(RandomState::new).hash_one(key) as i64 {
        0 => 1,
        h => h,
    }
}

/// Where [`take`] stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop {
    /// At the first record that does not read whole (torn, or the end of the bytes).
    End,
    /// Past the table's limit: the caller grows it and goes on from `Taken::at`.
    Grow,
    /// At a slot of the same hash for the record at `record`: whether it holds the same key
    /// takes a read of that slot's record, which the caller makes (it puts the record itself),
    /// then goes on from `Taken::at`.
    Same { record: usize, hash: i64 },
}

/// What the log has been read up to: the caller's state, given to [`take`] and given back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Read {
    /// The newest seq read; a record at or below it was read before (it is passed over).
    pub newest: u64,
    /// The seq of the newest flush's first record.
    pub flush_first: u64,
    /// The slots in use.
    pub size: usize,
}

/// The result of [`take`].
#[derive(Debug, PartialEq)]
pub struct Taken {
    pub stop: Stop,
    /// Where the caller goes on (after the last record taken).
    pub at: usize,
    pub read: Read,
    /// The offset of the last record that was newer than everything before it, if any.
    pub last: Option<usize>,
    /// The records newer than `newest` read (taken into the table or not).
    pub taken: u64,
}

/// The window and bound a record must be within to be taken into the table.
#[derive(Debug, Clone, Copy)]
pub struct Keep {
    /// Records stored before this UNIX time are out of the window.
    pub cutoff: f64,
    /// Records of this seq or older can never count again.
    pub floor: u64,
    /// The table grows past this many slots in use.
    pub limit: f64,
}

fn be32(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

fn be64(buf: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

/// Take the whole records of `buf` from `start` into the table (`hashes` and `places`, of one
/// power-of-two length), each record newer than `read.newest` at place `base + its offset`:
/// a key within `keep` gets a new slot. Stops at the first record that does not read whole,
/// past the table's limit, or at a slot of the same hash ([`Stop`]).
pub fn take(
    buf: &[u8],
    start: usize,
    base: i64,
    hashes: &mut [i64],
    places: &mut [i64],
    mut read: Read,
    keep: Keep,
) -> Taken {
    assert!(hashes.len() == places.len() && hashes.len().is_power_of_two(), "two tables of one power-of-two length");
    let mask = hashes.len() - 1;
    let (end, mut at, mut last, mut taken) = (buf.len(), start, None, 0);
    while at + FIXED <= end {
        let length = be32(buf, at) as usize;
        let stop = at + length;
        if length < FIXED || stop > end || crc32fast::hash(&buf[at + 8..stop]) != be32(buf, at + 4) {
            break;
        }
        let seq = be64(buf, at + 8);
        let stored = f64::from_bits(be64(buf, at + 16));
        let (flags, key_length, digest_length) = (buf[at + 24], buf[at + 25] as usize, buf[at + 26] as usize);
        if FIXED + key_length + digest_length > length {
            break; // cannot be: its CRC held
        }
        if seq > read.newest {
            read.newest = seq;
            last = Some(at);
            taken += 1;
            if flags & FIRST != 0 {
                read.flush_first = seq;
            }
            if stored >= keep.cutoff && seq > keep.floor {
                let h = key_hash(&buf[at + FIXED..at + FIXED + key_length]);
                let mut i = h as usize & mask;
                loop {
                    match hashes[i] {
                        0 => {
                            hashes[i] = h;
                            places[i] = base + at as i64;
                            read.size += 1;
                            if read.size as f64 > keep.limit {
                                return Taken { stop: Stop::Grow, at: stop, read, last, taken };
                            }
                            break;
                        }
                        found if found == h => {
                            return Taken { stop: Stop::Same { record: at, hash: h }, at: stop, read, last, taken };
                        }
                        _ => i = (i + 1) & mask,
                    }
                }
            }
        }
        at = stop;
    }
    Taken { stop: Stop::End, at, read, last, taken }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, stored: f64, flags: u8, key: &[u8]) -> Vec<u8> {
        let mut rest = Vec::new();
        rest.extend_from_slice(&seq.to_be_bytes());
        rest.extend_from_slice(&stored.to_bits().to_be_bytes());
        rest.extend_from_slice(&[flags, key.len() as u8, 2]);
        rest.extend_from_slice(key);
        rest.extend_from_slice(b"dgANSWER");
        let mut out = ((8 + rest.len()) as u32).to_be_bytes().to_vec();
        out.extend_from_slice(&crc32fast::hash(&rest).to_be_bytes());
        out.extend_from_slice(&rest);
        out
    }

    const KEEP: Keep = Keep { cutoff: 100.0, floor: 0, limit: 11.0 };
    const FRESH: Read = Read { newest: 0, flush_first: 0, size: 0 };

    fn slots_of(hashes: &[i64], places: &[i64]) -> Vec<(i64, i64)> {
        let mut found: Vec<_> = hashes.iter().zip(places).filter(|(h, _)| **h != 0).map(|(h, p)| (*h, *p)).collect();
        found.sort();
        found
    }

    #[test]
    fn a_hash_is_the_same_for_the_same_key_and_never_zero() {
        assert_eq!(key_hash(b"abc"), key_hash(b"abc"));
        assert_ne!(key_hash(b"abc"), key_hash(b"abd"));
        assert_ne!(key_hash(b""), 0);
    }

    #[test]
    fn whole_records_are_taken_at_their_places_up_to_a_torn_one() {
        let mut buf = [record(1, 200.0, FIRST, b"a"), record(2, 200.0, 0, b"b")].concat();
        let whole = buf.len();
        buf.extend_from_slice(&record(3, 200.0, FIRST, b"c")[..20]);
        let (mut hashes, mut places) = (vec![0; 16], vec![0; 16]);
        let taken = take(&buf, 0, 1 << 40, &mut hashes, &mut places, FRESH, KEEP);
        assert_eq!(taken.stop, Stop::End);
        assert_eq!((taken.at, taken.taken, taken.last), (whole, 2, Some(whole - record(2, 200.0, 0, b"b").len())));
        assert_eq!(taken.read, Read { newest: 2, flush_first: 1, size: 2 });
        let mut expected =
            vec![(key_hash(b"a"), 1 << 40), (key_hash(b"b"), (1 << 40) + record(1, 200.0, FIRST, b"a").len() as i64)];
        expected.sort();
        assert_eq!(slots_of(&hashes, &places), expected);
    }

    #[test]
    fn a_record_failing_its_crc_stops_the_reading() {
        let mut buf = [record(1, 200.0, FIRST, b"a"), record(2, 200.0, 0, b"b")].concat();
        let second = record(1, 200.0, FIRST, b"a").len();
        buf[second + 30] ^= 1;
        let (mut hashes, mut places) = (vec![0; 16], vec![0; 16]);
        let taken = take(&buf, 0, 0, &mut hashes, &mut places, FRESH, KEEP);
        assert_eq!((taken.stop, taken.at, taken.read.size), (Stop::End, second, 1));
    }

    #[test]
    fn records_read_before_or_out_of_the_window_or_bound_take_no_slot() {
        let buf = [
            record(1, 200.0, FIRST, b"a"),
            record(2, 50.0, 0, b"b"),
            record(3, f64::NAN, 0, b"c"),
            record(4, 200.0, 0, b"d"),
        ]
        .concat();
        let (mut hashes, mut places) = (vec![0; 16], vec![0; 16]);
        let read = Read { newest: 1, flush_first: 1, size: 0 };
        let taken = take(&buf, 0, 0, &mut hashes, &mut places, read, Keep { floor: 3, ..KEEP });
        assert_eq!((taken.taken, taken.read.newest, taken.read.size), (3, 4, 1));
        assert_eq!(slots_of(&hashes, &places).len(), 1);
        assert_eq!(slots_of(&hashes, &places)[0].0, key_hash(b"d"));
    }

    #[test]
    fn past_the_limit_it_stops_after_the_record_that_passed_it() {
        let records: Vec<Vec<u8>> = (1..=13).map(|n| record(n, 200.0, 0, format!("k{n}").as_bytes())).collect();
        let buf = records.concat();
        let (mut hashes, mut places) = (vec![0; 16], vec![0; 16]);
        let taken = take(&buf, 0, 0, &mut hashes, &mut places, FRESH, KEEP);
        assert_eq!((taken.stop, taken.read.size), (Stop::Grow, 12));
        assert_eq!(taken.at, records[..12].concat().len());
    }

    #[test]
    fn a_slot_of_the_same_hash_is_left_to_the_caller_with_the_record_read() {
        let buf = [record(1, 200.0, FIRST, b"a"), record(2, 200.0, FIRST, b"a")].concat();
        let first = record(1, 200.0, FIRST, b"a").len();
        let (mut hashes, mut places) = (vec![0; 16], vec![0; 16]);
        let taken = take(&buf, 0, 0, &mut hashes, &mut places, FRESH, KEEP);
        assert_eq!(taken.stop, Stop::Same { record: first, hash: key_hash(b"a") });
        assert_eq!((taken.at, taken.read.newest, taken.read.flush_first, taken.last), (buf.len(), 2, 2, Some(first)));
        assert_eq!(taken.read.size, 1);
    }
}
