"""The descriptor budget: what a worker keeps besides its connections, and a start it cannot keep."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from tests.support import Server
from tiny import codec, config, descriptors, keylog, limits
from tiny.handlers.ingest import answer_of


def test_the_biggest_answer_a_key_keeps_fits_max_answer() -> None:
    longest = max(codec.REASONS, key=len)
    huge = 2**62  # more lines than any body holds; valid + invalid still within orjson's 64 bits
    rejects = [(huge, longest, b"")] * (limits.MAX_ERRORS + 5)
    batch = codec.Batch({}, rejects, huge, huge)
    assert len(answer_of(2**63, batch)) <= limits.MAX_ANSWER


def _config(data: Path, *flags: str) -> config.Config:
    return config.parse(["--data-dir", str(data), *flags], {})


def test_the_key_log_of_the_default_bound_is_budgeted_a_descriptor_per_segment_it_may_span(tmp_path: Path) -> None:
    spans = keylog.segments_for(limits.IDEMPOTENCY_MAX_KEYS)
    assert (spans - 2) * keylog.SEGMENT_BYTES >= limits.IDEMPOTENCY_MAX_KEYS * keylog.MAX_RECORD
    assert descriptors.key_log_files(_config(tmp_path)) == spans == 388
    assert descriptors.key_log_files(_config(tmp_path, "--idempotency-max-keys", "1000")) == 3


def test_a_log_longer_than_its_bound_spans_is_budgeted_as_long_as_it_is(tmp_path: Path) -> None:
    """A bound lowered over a log written under a higher one: every process opens every
    segment at its start, and expiry shortens the log step by step."""
    keys = tmp_path / keylog.KEYS_DIR
    keys.mkdir(parents=True)
    for number in range(1, 41):
        (tmp_path / keylog.segment_name(number)).write_bytes(b"")
    (keys / "notes.txt").write_bytes(b"")  # not a segment
    assert descriptors.key_log_files(_config(tmp_path, "--idempotency-max-keys", "1000")) == 42


def test_cluster_mode_budgets_no_key_log(tmp_path: Path) -> None:
    cluster = _config(tmp_path, "--cluster", "host=127.0.0.1,127.0.0.2 dbname=tiny")
    assert descriptors.key_log_files(cluster) == 0


def test_connections_get_what_the_sink_the_key_log_and_the_reserve_leave(tmp_path: Path) -> None:
    small = _config(tmp_path, "--idempotency-max-keys", "1000")
    assert descriptors.connection_limit(small, 32, 1024) == 1024 - 32 - 3 - descriptors.RESERVED
    assert descriptors.connection_limit(_config(tmp_path), 32, 1024) == 1024 - 32 - 388 - descriptors.RESERVED


def test_a_limit_with_no_room_for_the_key_log_names_its_flag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="388 for the key log \\(--idempotency-max-keys\\)"):
        descriptors.connection_limit(_config(tmp_path), 32, 400)


def test_a_server_under_a_limit_its_key_log_would_exhaust_refuses_to_start(tmp_path: Path) -> None:
    def nofile() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    server = Server(tmp_path / "data", preexec=nofile)
    with pytest.raises(RuntimeError, match="did not start") as refused:
        server.start(timeout=10)
    assert "388 for the key log (--idempotency-max-keys)" in str(refused.value)
    assert server.proc is not None and server.proc.returncode == 2
