"""Configuration: flags over TINY_* environment variables over defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny import config


def test_defaults_match_the_documented_interface() -> None:
    options = config.parse([], {})
    assert (options.port, options.address, options.processes) == (8000, "127.0.0.1", 0)
    assert (options.data_dir, options.durability, options.max_body, options.token) == (
        Path("data"),
        "write",
        64 * 1024**2,
        None,
    )


def test_environment_sets_every_flag() -> None:
    env = {
        "TINY_PORT": "9001",
        "TINY_ADDRESS": "0.0.0.0",
        "TINY_PROCESSES": "3",
        "TINY_DATA_DIR": "/x",
        "TINY_DURABILITY": "fsync",
        "TINY_MAX_BODY": "1MiB",
        "TINY_TOKEN": "t",
    }
    options = config.parse([], env)
    assert (options.port, options.address, options.processes, options.data_dir) == (9001, "0.0.0.0", 3, Path("/x"))
    assert (options.durability, options.max_body, options.token) == ("fsync", 1024**2, "t")


def test_flags_override_the_environment() -> None:
    assert config.parse(["--port", "9002"], {"TINY_PORT": "9001"}).port == 9002


@pytest.mark.parametrize("text,size", [("100", 100), ("64MiB", 64 * 1024**2), ("512k", 512 * 1024), ("1g", 1024**3)])
def test_sizes_take_binary_units(text: str, size: int) -> None:
    assert config.parse_size(text) == size


@pytest.mark.parametrize("env", [{"TINY_PORT": "http"}, {"TINY_DURABILITY": "never"}, {"TINY_MAX_BODY": "0"}])
def test_bad_values_stop_at_start_up(env: dict[str, str]) -> None:
    with pytest.raises(SystemExit):
        config.parse([], env)


@pytest.mark.parametrize(
    "env, flag",
    [
        ({"TINY_ANALYTICS_PROCESSES": "0"}, "--analytics-processes"),
        ({"TINY_ANALYTICS_NICE": "fast"}, "--analytics-nice"),
        ({"TINY_ANALYTICS_MAX_QUEUED": "-1"}, "--analytics-max-queued"),
    ],
)
def test_bad_analytics_settings_stop_at_start_up_naming_the_flag(
    env: dict[str, str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        config.parse([], env)
    assert flag in capsys.readouterr().err


def test_analytics_settings_are_flags_and_environment() -> None:
    env = {"TINY_ANALYTICS_PROCESSES": "2", "TINY_ANALYTICS_MAX_QUEUED": "4"}
    options = config.parse(["--analytics-nice", "10"], env)
    assert (options.analytics_processes, options.analytics_max_queued) == (2, 4)
    assert options.analytics_nice == "10" and config.parse([], {}).analytics_nice == "idle"
    assert "TINY_ANALYTICS_NICE" in config.build_parser({}).format_help()


def test_zero_processes_means_the_usable_cores() -> None:
    assert config.parse([], {}).worker_count() == config.usable_cpus() >= 1


def test_a_cgroup_cpu_quota_caps_the_cores(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert config.usable_cpus(tmp_path / "cpu.max") == min(2, config.usable_cpus())


@pytest.mark.hardening("around 7: the token leaked through argv and --help")
def test_help_never_prints_the_token() -> None:
    text = config.build_parser({"TINY_TOKEN": "hunter2-secret"}).format_help()
    assert "hunter2-secret" not in text and "set, not shown" in text


@pytest.mark.hardening("around 7: the token leaked through argv and --help")
def test_the_token_can_come_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-a-secret\n")
    options = config.parse([], {"TINY_TOKEN_FILE": str(tmp_path / "token")})
    assert (options.token, options.token_source) == ("from-a-secret", "file")
    assert config.parse(["--token-file", str(tmp_path / "token")], {}).token == "from-a-secret"
    assert config.parse([], {"TINY_TOKEN": "t"}).token_source == "environment"
    assert config.parse(["--token", "t"], {}).token_source == "command line"


@pytest.mark.hardening("around 7: the token leaked through argv and --help")
@pytest.mark.parametrize("content", [None, "", " \n"])
def test_a_missing_or_empty_token_file_stops_at_start_up(
    tmp_path: Path, content: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit):
        config.parse(["--token-file", str(path)], {})
    assert "--token-file" in capsys.readouterr().err


def test_a_token_given_twice_stops_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("a")
    with pytest.raises(SystemExit):
        config.parse(["--token-file", str(tmp_path / "token")], {"TINY_TOKEN": "b"})


@pytest.mark.hardening("exactly once 12: --idempotency-max-keys 1 was accepted")
def test_max_keys_below_the_keys_of_one_flush_stop_at_start_up(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config.parse(["--idempotency-max-keys", "1"], {})
    assert "--idempotency-max-keys: must be at least 256" in capsys.readouterr().err
    assert config.parse(["--idempotency-max-keys", "256"], {}).idempotency_max_keys == 256


def test_boolean_flags_take_a_bare_flag_or_a_value() -> None:
    assert config.parse(["--new-journal"], {}).new_journal is True
    assert config.parse([], {"TINY_NEW_JOURNAL": "1"}).new_journal is True
    assert config.parse(["--new-journal", "no"], {"TINY_NEW_JOURNAL": "1"}).new_journal is False
    assert config.parse([], {}).new_journal is False


def test_no_fork_needs_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config.parse(["--no-fork", "--processes", "2"], {})
    assert config.parse(["--no-fork", "--processes", "1"], {}).no_fork is True


def test_every_flag_is_in_the_readmes_table() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for name, _, help_text in config._FLAGS:
        if help_text is None:
            continue  # hidden (fault injection, benchmarks)
        flag, env = "--" + name.replace("_", "-"), "TINY_" + name.upper()
        assert f"| `{flag}` | `{env}` |" in readme, f"{flag} is not in README's configuration table"
