"""The compiled codec says what it is: its limits, columns and reasons held equal to tiny.codec's
at import, and the build id of the sources it came from, compared with the checkout's at start."""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import pytest

from tiny import codec, layout, limits

compiled = pytest.importorskip("tiny._codec", reason="no compiled codec here (`make codec` builds it)")
CRATE = Path(codec.__file__).resolve().parent.parent / "rust" / "tiny_codec"


def test_the_compiled_codec_exports_the_limits_columns_and_reasons_of_the_python_side() -> None:
    assert (compiled.MAX_DAYS, compiled.MAX_REJECTS, compiled.MAX_STRING) == (
        limits.MAX_DAYS,
        limits.MAX_REJECTS,
        limits.MAX_STRING,
    )
    assert tuple(compiled.COLUMNS) == layout.COLUMNS
    assert tuple(compiled.REASONS) == codec.REASONS


def test_a_compiled_codec_that_disagrees_is_refused_at_import() -> None:
    other = types.SimpleNamespace(**{name: getattr(compiled, name) for name in dir(compiled)})
    other.MAX_DAYS = limits.MAX_DAYS + 1
    with pytest.raises(ImportError, match="make codec"):
        codec._check_agrees(other)
    other.MAX_DAYS, other.REASONS = limits.MAX_DAYS, [*compiled.REASONS[:-1], "date: another reason"]
    with pytest.raises(ImportError):
        codec._check_agrees(other)


def test_the_build_id_is_the_hash_of_the_checkouts_sources(tmp_path: Path) -> None:
    """make codec built this module from this checkout: the same id; one byte changed in a
    source file: another id, which a server refuses to start with (tiny.prefork)."""
    assert codec.source_hash(CRATE) == compiled.BUILD_ID
    assert codec.stale_build() is None
    shutil.copytree(CRATE / "src", tmp_path / "src")
    shutil.copy(CRATE / "Cargo.toml", tmp_path / "Cargo.toml")
    batch = tmp_path / "src" / "batch.rs"
    batch.write_text(batch.read_text() + "\n")
    assert codec.source_hash(tmp_path) not in (None, compiled.BUILD_ID)
    assert codec.source_hash(tmp_path / "nowhere") is None  # an installed package: nothing to compare
