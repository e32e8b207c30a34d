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
//! - [`runs`]: the scanner's inner loops, 16 bytes at a time.
//!
//! The Python binding (feature `python`, on in wheels built by maturin) releases the GIL
//! for all of the scanning and only builds Python objects at the end.

pub mod batch;
mod fast;
mod json;
mod record;
mod runs;

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

    /// `tiny._codec`: maturin names the shared library after the last part of the
    /// module-name in pyproject.toml, and Python looks for `PyInit__codec` in it. Besides
    /// `encode`, it says what it is: its version, the hash of the sources it was built from
    /// (`BUILD_ID`, build.rs: tiny.codec compares it with the checkout's), and its limits,
    /// columns and reasons, which tiny.codec holds equal to its own at import.
    #[pymodule]
    #[pyo3(name = "_codec")]
    fn codec_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_function(wrap_pyfunction!(encode, m)?)?;
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
