"""Every server on a data dir keeps Idempotency-Keys alike: the journal pins the window and bound."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.support import ROOT, Server, record
from tiny import config
from tiny.commit import Refused
from tiny.commit.local import LocalCommit


def _server_journal(data: Path, *flags: str) -> LocalCommit:
    return LocalCommit.from_config(config.parse(["--data-dir", str(data), *flags], {}))


def _admin(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiny.admin", *command], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_the_first_server_records_its_window_and_bound(tmp_path: Path) -> None:
    journal = _server_journal(tmp_path, "--idempotency-window", "600", "--idempotency-max-keys", "5000")
    journal.open(keys=False)
    assert journal.keys.meta("key_bounds") == b"600.0 5000"
    journal.close()


def test_a_journal_made_by_an_operators_command_takes_the_first_servers_bounds(tmp_path: Path) -> None:
    LocalCommit(tmp_path).open(keys=False)  # as tiny-admin, or a server of the earlier format, made it
    journal = _server_journal(tmp_path, "--idempotency-window", "60")
    journal.open(keys=False)
    assert journal.keys.meta("key_bounds") == b"60.0 10000000"
    journal.close()


def test_servers_with_the_same_bounds_share_the_data_dir(tmp_path: Path) -> None:
    first, second = (
        _server_journal(tmp_path, "--idempotency-window", "60"),
        _server_journal(tmp_path, "--idempotency-window", "60.0"),
    )
    first.open()
    second.open()
    assert first.is_open and second.is_open
    first.close()
    second.close()


@pytest.mark.parametrize("flags", [("--idempotency-window", "3600"), ("--idempotency-max-keys", "1000")])
def test_a_server_that_would_keep_keys_otherwise_is_refused_naming_the_change(
    tmp_path: Path, flags: tuple[str, str]
) -> None:
    _server_journal(tmp_path).open(keys=False)
    other = _server_journal(tmp_path, *flags)
    with pytest.raises(Refused, match="must keep keys alike") as refused:
        other.open(keys=False)
    assert f"tiny-admin set-key-bounds {tmp_path}" in str(refused.value) and not other.is_open


def test_a_real_server_with_another_window_does_not_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Server(data) as server:
        assert server.ingest(orjson.dumps(record()) + b"\n", {"Idempotency-Key": "k1"}).status == 200
    again = Server(data, "--idempotency-window", "60")
    with pytest.raises(RuntimeError, match="did not start") as refused:
        again.start()
    assert "keeps Idempotency-Keys for 86400 s and at most 10,000,000" in str(refused.value)
    assert again.proc is not None and again.proc.returncode == 1


def test_set_key_bounds_moves_every_server_to_the_new_ones_and_keeps_the_keys(tmp_path: Path) -> None:
    data = tmp_path / "data"
    body = orjson.dumps(record()) + b"\n"
    with Server(data) as server:
        assert server.ingest(body, {"Idempotency-Key": "k1"}).status == 200
    done = _admin("set-key-bounds", str(data), "3600", "1000")
    assert done.returncode == 0, done.stderr
    assert "were kept for 86400 s and at most 10,000,000 keys, now for 3600 s and at most 1,000" in done.stdout
    with Server(data, "--idempotency-window", "3600", "--idempotency-max-keys", "1000") as server:
        replay = server.ingest(body, {"Idempotency-Key": "k1"})
        assert replay.status == 200 and replay.headers.get("idempotent-replayed") == "true"
    with pytest.raises(RuntimeError, match="did not start") as refused:
        Server(data).start()  # the old default is now the odd one out
    assert "keeps Idempotency-Keys for 3600 s and at most 1,000" in str(refused.value)


def test_the_refusal_names_a_command_that_records_exactly_this_servers_window(tmp_path: Path) -> None:
    first = _server_journal(tmp_path)  # a server that ran, and stopped
    first.open(keys=False)
    first.close()
    odd = _server_journal(tmp_path, "--idempotency-window", "1234567.5")
    with pytest.raises(Refused) as refused:
        odd.open(keys=False)
    command = str(refused.value).rsplit("run: ", 1)[1].split()
    assert command[:2] == ["tiny-admin", "set-key-bounds"]
    assert _admin(*command[1:]).returncode == 0
    odd.open(keys=False)
    assert odd.is_open
    odd.close()


def test_a_damaged_record_of_the_bounds_is_refused_with_the_way_out(tmp_path: Path) -> None:
    journal = LocalCommit(tmp_path)
    journal.open(keys=False)
    journal.keys.set_meta("key_bounds", b"garbage")
    journal.close()
    with pytest.raises(Refused, match="not a window and a bound.*tiny-admin set-key-bounds"):
        _server_journal(tmp_path).open(keys=False)


def test_set_key_bounds_checks_its_numbers_as_the_server_does(tmp_path: Path) -> None:
    assert _admin("set-key-bounds", str(tmp_path), "nan", "1000").returncode == 2
    assert _admin("set-key-bounds", str(tmp_path), "60", "10").returncode == 2  # below one flush's keys


def test_set_key_bounds_is_refused_while_a_server_runs_on_the_data_dir(tmp_path: Path) -> None:
    """It said it was done, and the next worker to restart was refused (a partial outage):
    with a server's processes holding the journal open, it changes nothing."""
    data = tmp_path / "data"
    with Server(data, processes=2) as server:
        done = _admin("set-key-bounds", str(data), "3600", "1000")
        assert done.returncode == 1 and "stop every server first" in done.stderr, done.stderr
        assert all(str(pid) in done.stderr for pid in server.worker_pids())
    done = _admin("set-key-bounds", str(data), "3600", "1000")  # stopped: now it is done
    assert done.returncode == 0 and "were kept for 86400 s and at most 10,000,000 keys" in done.stdout, done.stderr
