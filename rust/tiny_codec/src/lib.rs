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
//! - [`lines`]: counting a day file's lines (`tiny._codec.count_lines`, the dashboard's day list).
//!
//! The Python binding (feature `python`, on in wheels built by maturin) releases the GIL
//! for all of the scanning and only builds Python objects at the end.

pub mod batch;
mod fast;
mod json;
pub mod lines;
mod record;
mod runs;
pub mod tally;

#[cfg(feature = "python")]
mod python {
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
