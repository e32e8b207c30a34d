//! `tiny_codec`: the compiled codec of Tiny Data Server, built as the Python extension
//! module `tiny._codec` of the `tiny-data-server` package (the top-level pyproject.toml).
//!
//! `tiny._codec.encode(body, max_days=16, max_rejects=1000) -> (days, rejects, valid, invalid,
//! omitted)` returns exactly what `tiny.codec.encode_reference(body, max_days, max_rejects)`
//! returns (as a plain tuple; tiny/codec.py wraps it in `Batch`), for any input bytes, and
//! never raises for bytes input.
//!
//! - [`json`]: a strict JSON scanner, accepting what orjson accepts, specialised for one
//!   flat record object per line with ten known keys;
//! - [`fast`]: its fast path for the usual line (compact, no escapes, ASCII);
//! - [`record`]: the field rules and the CSV row;
//! - [`batch`]: the body loop (lines, blanks, UTF-8, grouping per day);
//! - [`runs`]: the scanner's inner loops, 16 bytes at a time;
//! - [`tally`]: the other way: counting the rows of a day file for the aggregate store
//!   (`tiny._codec.tally`, tiny/aggregate_count.py);
//! - [`lines`]: counting a day file's lines (`tiny._codec.count_lines`, the dashboard's day list);
//! - [`keys`]: the key log's records taken into the key table at a start
//!   (`tiny._codec.take_keys`, tiny/keyload.py) and the table's hash (`tiny._codec.key_hash`).
//!
//! The Python binding (feature `python`, on in wheels built by maturin) releases the GIL
//! for all of the scanning and only builds Python objects at the end.

pub mod batch;
mod fast;
mod json;
pub mod keys;
pub mod lines;
mod record;
mod runs;
pub mod tally;

#[cfg(feature = "python")]
mod python {
    use pyo3::exceptions::PyValueError;
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

    /// encode(body: bytes, max_days: int = 16, max_rejects: int = 1000) -> tuple[dict[str, bytes],
    ///     list[tuple[int, str, bytes]], int, int, tuple[int, int] | None]
    ///
    /// The NDJSON body as CSV rows per day, the first max_rejects rejects (line number,
    /// reason, raw line), the valid and invalid counts, and the line range of the rejects
    /// left out: the same values as tiny.codec.encode_reference.
    #[pyfunction]
    #[pyo3(signature = (body, max_days = 16, max_rejects = 1000))]
    fn encode<'py>(py: Python<'py>, body: &[u8], max_days: usize, max_rejects: usize) -> PyResult<Bound<'py, PyTuple>> {
        let limits = crate::batch::Limits { max_days, max_rejects };
        let encoded = py.detach(|| crate::batch::encode(body, limits));
        let days = PyDict::new(py);
        for (day, rows) in &encoded.days {
            let key = PyString::new(py, &String::from_utf8_lossy(day));
            days.set_item(key, PyBytes::new(py, rows))?;
        }
        let rejects = PyList::new(
            py,
            encoded.rejects.iter().map(|r| (r.line, r.reason, PyBytes::new(py, &body[r.start..r.end]))),
        )?;
        (days, rejects, encoded.valid, encoded.invalid, encoded.omitted).into_pyobject(py)
    }

    /// tally(block: bytes, start: int, end: int) -> tuple[int, int, dict[str, int], list[int],
    ///     dict[int, list[int]], dict[tuple[int, int], int], dict[tuple[int, str], int],
    ///     list[tuple[int, int]]]
    ///
    /// The counts of the day-file lines in block[start:end] (end just past an LF): rows,
    /// bytes, downloads per package, per hour (24), [downloads, bytes] per ip_id, downloads
    /// per (ip_id, hour) and per (ip_id, country), and the (start, end) of each line left to
    /// the caller's rules (crate::tally says which). ValueError for a range outside the block.
    #[pyfunction]
    fn tally<'py>(py: Python<'py>, block: &[u8], start: usize, end: usize) -> PyResult<Bound<'py, PyTuple>> {
        if start > end || end > block.len() {
            return Err(pyo3::exceptions::PyValueError::new_err("tally: start..end outside the block"));
        }
        let t = py.detach(|| crate::tally::tally(block, start, end));
        let text = |bytes: &[u8]| PyString::new(py, &String::from_utf8_lossy(bytes));
        let packages = PyDict::new(py);
        for (package, count) in &t.packages {
            packages.set_item(text(package), count)?;
        }
        let ips = PyDict::new(py);
        for (ip, (count, bytes)) in &t.ips {
            ips.set_item(
                ip,
                PyList::new(py, [count.into_pyobject(py)?.into_any(), bytes.into_pyobject(py)?.into_any()])?,
            )?;
        }
        let ip_hours = PyDict::new(py);
        for (key, count) in &t.ip_hours {
            ip_hours.set_item(key, count)?;
        }
        let ip_countries = PyDict::new(py);
        for ((ip, country), count) in &t.ip_countries {
            ip_countries.set_item((ip, text(country)), count)?;
        }
        let hours = PyList::new(py, t.hours)?;
        let deferred = PyList::new(py, &t.deferred)?;
        (t.rows, t.bytes, packages, hours, ips, ip_hours, ip_countries, deferred).into_pyobject(py)
    }

    /// count_lines(fd: int, start: int, end: int, tail: int = 256) -> tuple[int, int, bytes]
    ///
    /// The LFs among bytes start..end of the open file fd (pread, the GIL released), how many
    /// bytes were read (fewer at the end of the file) and the last `tail` of them (crate::lines).
    /// The caller keeps fd open; OSError when a read fails.
    #[pyfunction]
    #[pyo3(signature = (fd, start, end, tail = 256))]
    fn count_lines<'py>(
        py: Python<'py>,
        fd: i32,
        start: u64,
        end: u64,
        tail: usize,
    ) -> PyResult<(u64, u64, Bound<'py, PyBytes>)> {
        use std::os::fd::FromRawFd;
        // Borrowed, never closed: ManuallyDrop keeps File's drop from closing the caller's fd.
        let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
        let counted = py
            .detach(|| crate::lines::count_lines(&file, start, end, tail))
            .map_err(|e| pyo3::exceptions::PyOSError::new_err((e.raw_os_error().unwrap_or(0), e.to_string())))?;
        Ok((counted.lines, counted.read, PyBytes::new(py, &counted.tail)))
    }

    /// key_hash(key: bytes) -> int
    ///
    /// The key table's hash of a key (crate::keys::key_hash): never 0, the same within a
    /// process, drawn anew in each.
    #[pyfunction]
    fn key_hash(key: &[u8]) -> i64 {
        crate::keys::key_hash(key)
    }

    /// take_keys's answer: stop, where to go on, newest, flush_first, size, last, taken, record, hash.
    type Taken = (u8, usize, u64, u64, usize, i64, u64, usize, i64);

    /// Two tables' memory, for the loop that runs without the GIL.
    struct Slots(*mut i64, *mut i64, usize);
    // SAFETY: the pointers are used by one thread at a time, while their buffers stay exported.
    unsafe impl Send for Slots {}

    fn slots_of(table: &Bound<'_, PyAny>) -> PyResult<pyo3::buffer::PyBuffer<i64>> {
        let buffer = pyo3::buffer::PyBuffer::<i64>::get(table)?;
        if buffer.readonly() || !buffer.is_c_contiguous() {
            return Err(PyValueError::new_err("take_keys: a table must be a writable, contiguous array('q')"));
        }
        Ok(buffer)
    }

    /// take_keys(buf: bytes, start: int, base: int, hashes: array, places: array, newest: int,
    ///     flush_first: int, size: int, cutoff: float, floor: int, limit: float)
    ///     -> tuple[int, int, int, int, int, int, int, int, int]
    ///
    /// The whole records of buf from start taken into the key table (crate::keys::take, the GIL
    /// released): (stop: 0 at the end of the whole records, 1 past the limit, 2 at a slot of the
    /// same hash; where to go on; newest; flush_first; size; the offset of the last newer record
    /// or -1; the newer records read; for stop 2, the record's offset and its hash). ValueError
    /// for tables that are not two distinct arrays('q') of one power-of-two length.
    #[pyfunction]
    #[allow(clippy::too_many_arguments)]
    fn take_keys<'py>(
        py: Python<'py>,
        buf: &[u8],
        start: usize,
        base: i64,
        hashes: &Bound<'py, PyAny>,
        places: &Bound<'py, PyAny>,
        newest: u64,
        flush_first: u64,
        size: usize,
        cutoff: f64,
        floor: u64,
        limit: f64,
    ) -> PyResult<Taken> {
        use crate::keys::{take, Keep, Read, Stop};
        let hashes = slots_of(hashes)?;
        let places = slots_of(places)?;
        let slots = Slots(hashes.buf_ptr().cast(), places.buf_ptr().cast(), hashes.item_count());
        let (a, b, n) = (slots.0 as usize, slots.1 as usize, slots.2 * 8);
        let apart = a + n <= b || b + n <= a; // two &mut slices must not overlap
        let fits = hashes.item_count() == places.item_count() && slots.2.is_power_of_two() && apart;
        let taken = (fits && start <= buf.len()).then(|| {
            py.detach(move || {
                // The whole struct, not its fields, into the closure (its fields are not Send).
                let slots = slots;
                // SAFETY: two buffers of `slots.2` i64s each that do not overlap, exported (so
                // never resized) until `hashes` and `places` drop below; nothing else touches
                // them meanwhile (the key table belongs to the thread that called).
                let (h, p) = unsafe {
                    (std::slice::from_raw_parts_mut(slots.0, slots.2), std::slice::from_raw_parts_mut(slots.1, slots.2))
                };
                take(buf, start, base, h, p, Read { newest, flush_first, size }, Keep { cutoff, floor, limit })
            })
        });
        drop((hashes, places)); // the exports released
        let taken = taken.ok_or_else(|| {
            PyValueError::new_err("take_keys: two distinct tables of one power-of-two length, and start within buf")
        })?;
        let (stop, record, hash) = match taken.stop {
            Stop::End => (0, 0, 0),
            Stop::Grow => (1, 0, 0),
            Stop::Same { record, hash } => (2, record, hash),
        };
        let last = taken.last.map_or(-1, |at| at as i64);
        let read = taken.read;
        Ok((stop, taken.at, read.newest, read.flush_first, read.size, last, taken.taken, record, hash))
    }

    /// `tiny._codec`: maturin names the shared library after the last part of the
    /// module-name in pyproject.toml, and Python looks for `PyInit__codec` in it. Besides
    /// `encode`, it says what it is: its version, the hash of the sources it was built from
    /// (`BUILD_ID`, build.rs: tiny.codec compares it with the checkout's), and its limits,
    /// columns and reasons, which tiny.codec holds equal to its own at import.
    #[pymodule]
    #[pyo3(name = "_codec")]
    fn codec_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_function(wrap_pyfunction!(encode, m)?)?;
        m.add_function(wrap_pyfunction!(tally, m)?)?;
        m.add_function(wrap_pyfunction!(count_lines, m)?)?;
        m.add_function(wrap_pyfunction!(key_hash, m)?)?;
        m.add_function(wrap_pyfunction!(take_keys, m)?)?;
        let limits = crate::batch::Limits::default();
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("BUILD_ID", env!("TINY_CODEC_SOURCE_HASH"))?;
        m.add("MAX_DAYS", limits.max_days)?;
        m.add("MAX_REJECTS", limits.max_rejects)?;
        m.add("MAX_STRING", crate::record::MAX_STRING)?;
        m.add("COLUMNS", crate::json::COLUMNS.to_vec())?;
        m.add("REASONS", crate::batch::REASONS.to_vec())?;
        Ok(())
    }
}
