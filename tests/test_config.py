"""Configuration: flags over TINY_* environment variables over defaults."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiny import config
from tiny.testing import APP, ROOT, server_env


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


@pytest.mark.parametrize(("argv", "environ"), [(["--token", ""], {}), ([], {"TINY_TOKEN": ""})])
def test_an_empty_token_stops_at_start_up_rather_than_turning_authentication_off(
    argv: list[str], environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--token "$UNSET"`` or ``TINY_TOKEN=`` is a mistake, not a wish to run open."""
    with pytest.raises(SystemExit):
        config.parse(argv, environ)
    assert "is empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "environ", "content"),
    [
        ([], {"TINY_TOKEN": " s3cret "}, None),
        (["--token", "s3 cret"], {}, None),
        ([], {}, "first\nsecond\n"),
        ([], {}, "s3crét\n"),
    ],
)
def test_a_token_no_authorization_header_can_carry_stops_at_start_up(
    tmp_path: Path, argv: list[str], environ: dict[str, str], content: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whitespace, a line break or a letter outside ASCII in a token: every request (or every
    client that encodes the header another way) would get 401."""
    if content is not None:
        (tmp_path / "token").write_text(content)
        argv = ["--token-file", str(tmp_path / "token")]
    with pytest.raises(SystemExit):
        config.parse(argv, environ)
    assert "whitespace or a control character" in (err := capsys.readouterr().err) or "not ASCII" in err


def test_a_token_given_twice_stops_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("a")
    with pytest.raises(SystemExit):
        config.parse(["--token-file", str(tmp_path / "token")], {"TINY_TOKEN": "b"})


@pytest.mark.hardening("exactly once 12: --idempotency-max-keys 1 was accepted")
def test_max_keys_below_the_keys_of_one_flush_stop_at_start_up(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config.parse(["--idempotency-max-keys", "1"], {})
    assert "--idempotency-max-keys: must be a whole number from 256" in capsys.readouterr().err
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


def test_cluster_mode_takes_a_libpq_string_and_its_flags(tmp_path: Path) -> None:
    passfile = tmp_path / "pgpass"
    passfile.write_text("*:*:*:*:secret\n")
    passfile.chmod(0o600)
    dsn = f"host=a,b,c port=5432,5432,5432 dbname=tiny target_session_attrs=read-write passfile={passfile}"
    options = config.parse(["--cluster", dsn, "--role", "read", "--host-name", "host-2.example"], {})
    assert (options.cluster, options.role, options.host_name) == (dsn, "read", "host-2.example")
    assert config.parse([], {"TINY_CLUSTER": dsn}).follower_name() == socket.gethostname()
    assert config.parse([], {}).cluster == ""


@pytest.mark.parametrize(
    "dsn",
    [
        "host=a password=secret-1",
        "host=a PASSWORD = secret-1",
        "postgresql://tiny:secret-1@a,b/db",
        "postgres://a/db?password=secret-1",
        "postgresql://a/db?sslmode=require&password=secret-1",
    ],
)
def test_a_password_in_the_cluster_string_is_refused_and_never_shown(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, environ in ((["--cluster", dsn], {}), ([], {"TINY_CLUSTER": dsn})):
        with pytest.raises(SystemExit):
            config.parse(argv, environ)
        err = capsys.readouterr().err
        assert "passfile" in err and "secret-1" not in err


@pytest.mark.parametrize(
    ("dsn", "said"),
    [
        ("garbage==", "libpq does not know: 'garbage'"),
        ("host=a 'dbname=x", "libpq can parse"),
        ("postgresql://[::1:secret-1/db", "libpq can parse"),
    ],
)
def test_a_cluster_string_libpq_cannot_parse_stops_at_start_up_without_echoing_it(
    dsn: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, environ in ((["--cluster", dsn], {}), ([], {"TINY_CLUSTER": dsn})):
        with pytest.raises(SystemExit):
            config.parse(argv, environ)
        err = capsys.readouterr().err
        assert said in err and "secret-1" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        (None, "cannot be read: No such file or directory"),
        (0o644, "group or world permissions (passfile=): chmod 600"),
        (0o000, "cannot be read: Permission denied"),
    ],
)
def test_a_password_file_libpq_would_skip_stops_at_start_up(
    tmp_path: Path, mode: int | None, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """libpq says only "no password supplied" at every connect for a file it skips: the server
    would start and answer 503 forever."""
    passfile = tmp_path / "pgpass"
    if mode is not None:
        passfile.write_text("*:*:*:*:secret\n")
        passfile.chmod(mode)
    if mode == 0o000 and os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    with pytest.raises(SystemExit):
        config.parse(["--cluster", f"host=a passfile={passfile}"], {})
    assert said in capsys.readouterr().err


def test_help_never_prints_the_cluster_string() -> None:
    text = config.build_parser({"TINY_CLUSTER": "host=db.internal dbname=tiny"}).format_help()
    assert "db.internal" not in text and "set, not shown" in text


@pytest.mark.parametrize(
    "argv",
    [
        ["--role", "read"],  # a host for reads only follows a cluster
        ["--cluster", "host=a", "--new-journal"],  # cluster mode rebuilds a data dir, never renews its journal
        ["--cluster", "host=a", "--no-fork", "--processes", "1"],  # its follower is a child of the parent
        ["--cluster", "host=a", "--role", "write"],
        ["--cluster", "host=a", "--host-name", "-h"],
        ["--cluster", "host=a", "--host-name", "a/b"],
        ["--cluster", "host=a", "--host-name", "x" * 64],
    ],
)
def test_cluster_flags_that_cannot_hold_stop_at_start_up(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        config.parse(argv, {})


def test_every_flag_is_in_the_readmes_table() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for name, _, help_text in config._FLAGS:
        if help_text is None:
            continue  # hidden (fault injection, benchmarks)
        flag, env = "--" + name.replace("_", "-"), "TINY_" + name.upper()
        assert f"| `{flag}` | `{env}` |" in readme, f"{flag} is not in README's configuration table"


# -- numbers: what every number flag accepts and refuses ---------------------------------------

MiB, TiB = 1024**2, 1024**4
_SIZE = (
    {"1": 1, "64MiB": 64 * MiB, " 512 k ": 512 * 1024, "2G": 2 * 1024**3, "1024g": TiB, "1T": TiB},
    ["0", "0k", "1025g", "1.5M", "1e3", "64 MiB B", "2T", "1P"],
)
_SECONDS = (
    {"0.001": 0.001, "2.5": 2.5, ".5": 0.5, "5.": 5.0, "1e3": 1000.0, " 60 ": 60.0, "1000000000": 1e9},
    ["0", "0.0", "0.0009", "1e-400", "1000000001", "1e10", "+1", "1e", ".", "1.2.3", "5s"],
)
# flag -> ({text: the value it gives}, [texts refused besides NONSENSE])
NUMBERS: dict[str, tuple[dict[str, object], list[str]]] = {
    "port": ({"0": 0, "8001": 8001, " 9 ": 9, "65535": 65535}, ["65536", "+1", "1.0", "1e3", "08001a"]),
    "processes": ({"0": 0, "1": 1, "1024": 1024}, ["1025", "1.5", "two"]),
    "max_body": _SIZE,
    "max_backlog": _SIZE,
    "analytics_cache_bytes": _SIZE,
    "idle_timeout": _SECONDS,
    "body_timeout": _SECONDS,
    "drain_timeout": _SECONDS,
    "idempotency_window": _SECONDS,
    "lock_timeout": _SECONDS,
    "read_wait": _SECONDS,
    "follower_retention": _SECONDS,
    "stall_timeout": ({"1": 1.0, "2": 2.0, "600": 600.0}, ["0.999", "0.25", "0", "1e10"]),
    "max_days": ({"1": 1, "16": 16, "10000": 10_000}, ["0", "10001", "1.0"]),
    "max_rejects": ({"0": 0, "1000": 1000, "1000000000": 10**9}, ["1000000001", "1e3"]),
    "max_connections": ({"0": 0, "100": 100, "1000000000": 10**9}, ["1000000001", "1e3"]),
    "analytics_processes": ({"1": 1, "1024": 1024}, ["0", "1025"]),
    "analytics_max_queued": ({"1": 1, "1000000000": 10**9}, ["0", "1000000001"]),
    "idempotency_max_keys": ({"256": 256, "10000000": 10**7}, ["255", "1", "0", "1000000001"]),
    "analytics_nice": ({"idle": "idle", " IDLE ": "idle", "0": "0", "05": "5", "19": "19"}, ["20", "1.5", "fast"]),
    "cpu_affinity": ({"auto": "auto", " AUTO ": "auto", "none": "none", "0": "0", "07": "7"}, ["12345", "1.5", "all"]),
    "analytics_cpu": ({"0": 0.0, "0.0": 0.0, "0.01": 0.01, "0.25": 0.25, "1024": 1024.0}, ["0.009", "1e-9", "1025"]),
    "read_rate": ({"0": 0.0, "0.001": 0.001, "2.5": 2.5, "1000000": 1e6}, ["1e-320", "0.0009", "1000001"]),
}
# What no number flag takes: float() and int() took most of these, and nan passed every range check.
NONSENSE = ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e309", "-1", "-0", "-0.0", "0x10", "1_0"]
NONSENSE += ["", " ", "\u0663", "\u00b2", "9" * 5000, "1e999999999", "12abc", "1 2", "0b1"]
NOT_NUMBERS = {"address", "data_dir", "durability", "token", "token_file", "journal_mode", "crash_at"}
NOT_NUMBERS |= {"new_journal", "public_downloads", "no_fork", "lean", "cluster", "role", "host_name"}


def _names(name: str) -> tuple[str, str]:
    """The flag and the environment variable of the Config field ``name``."""
    return "--" + name.replace("_", "-"), "TINY_" + name.upper()


def test_every_flag_is_a_number_with_its_checks_listed_here_or_not_a_number() -> None:
    """A flag added later must say here what it accepts and refuses (NUMBERS) or that it
    takes no number (NOT_NUMBERS)."""
    names = {name for name, _, _ in config._FLAGS}
    assert set(NUMBERS) | NOT_NUMBERS == names and not set(NUMBERS) & NOT_NUMBERS


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_a_number_flag_takes_plain_numbers_in_its_range_as_a_flag_and_from_the_environment(name: str) -> None:
    accepted, _ = NUMBERS[name]
    flag, env = _names(name)
    wrong = {}
    for text, value in accepted.items():
        given = (getattr(config.parse([f"{flag}={text}"], {}), name), getattr(config.parse([], {env: text}), name))
        if given != (value, value):
            wrong[text] = given
    assert not wrong, f"{flag}: {wrong}"


@pytest.mark.hardening("third 6: nan was accepted by every seconds flag and its TINY_* variable")
@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_a_number_flag_refuses_nan_infinities_signs_and_nonsense_naming_itself_and_its_variable(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, refused = NUMBERS[name]
    flag, env = _names(name)
    taken = []
    for text in [*refused, *NONSENSE]:
        for argv, environ in (([f"{flag}={text}"], {}), ([], {env: text})):
            try:
                config.parse(argv, environ)
            except SystemExit as exc:
                err = capsys.readouterr().err
                if exc.code != 2 or f"argument {flag}: " not in err or env not in err:
                    taken.append((text, f"exit {exc.code}: {err.splitlines()[-1:]}"))
            else:
                taken.append((text, "accepted"))
    assert not taken, f"{flag}: {taken}"


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_every_default_is_in_its_flags_range(name: str) -> None:
    default = getattr(config.Config(), name)
    assert getattr(config.parse([], {_names(name)[1]: str(default)}), name) == default


@pytest.mark.parametrize(
    "text", ["after-writes", "after-writes:0.5", "after-writes:1:stop-once", "after-writes::kill", "worker-start"]
)
def test_a_crash_point_takes_a_probability_from_0_to_1(text: str) -> None:
    assert config.parse([], {"TINY_CRASH_AT": text}).crash_at == text


@pytest.mark.parametrize("chance", ["nan", "inf", "-0.1", "1.5", "1e309", "0x1", " "])
def test_a_crash_points_probability_refuses_nonsense(chance: str) -> None:
    with pytest.raises(SystemExit):
        config.parse([], {"TINY_CRASH_AT": f"after-writes:{chance}:kill"})


def test_a_value_refused_is_shown_cut_short(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config.parse([], {"TINY_MAX_DAYS": "7" * 5000})
    err = capsys.readouterr().err
    assert "not '7777" in err and len(err.splitlines()[-1]) < 300


@pytest.mark.hardening("third 6: nan was accepted by every seconds flag and its TINY_* variable")
@pytest.mark.parametrize("args, env", [(["--idempotency-window", "nan"], {}), ([], {"TINY_LOCK_TIMEOUT": "nan"})])
def test_the_server_refuses_nan_at_once_with_exit_2(tmp_path: Path, args: list[str], env: dict[str, str]) -> None:
    """The server itself (its entry point, as an operator starts it): no start, no data dir."""
    argv = [sys.executable, str(APP), "--port", "0", "--data-dir", str(tmp_path / "data"), *args]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=30, env=server_env(env))
    assert done.returncode == 2 and time.monotonic() - started < 10
    flag = "--idempotency-window" if args else "--lock-timeout"
    assert f"argument {flag}: must be a number of seconds" in done.stderr and "not 'nan'" in done.stderr
    assert _names(flag[2:].replace("-", "_"))[1] in done.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.hardening("third 6: nan was accepted by every seconds flag and its TINY_* variable")
@pytest.mark.parametrize("content", ["100000 0\n", "0 100000\n", "-100000 100000\n", "nan 100000\n", "1 2 3\n", ""])
def test_a_cgroup_cpu_max_that_is_no_quota_leaves_the_affinity(tmp_path: Path, content: str) -> None:
    """(A period of 0 stopped the start with ZeroDivisionError.)"""
    (tmp_path / "cpu.max").write_text(content)
    assert config.usable_cpus(tmp_path / "cpu.max") == config.usable_cpus(tmp_path / "absent")


@pytest.mark.hardening("third 6: nan was accepted by every seconds flag and its TINY_* variable")
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e309", "0", "ten"])
def test_the_other_commands_seconds_refuse_nan_and_nonsense(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """tiny-admin's --lock-timeout and tiny-replay's --timeout take the server's check of seconds:
    a nan lock timeout waited forever beside a held lock, and a nan socket timeout crashed."""
    from tiny import admin, replay

    for command, argv in (
        (admin.main, ["backup", "data", "dest", "--lock-timeout", value]),
        (admin.main, ["rebuild-aggregates", "data", "--lock-timeout", value]),
        (admin.main, ["forget", "data", "x.csv", "--lock-timeout", value]),
        (replay.parse_args, ["day.csv", "--timeout", value]),
    ):
        with pytest.raises(SystemExit) as exited:
            command(argv)
        assert exited.value.code == 2, argv
        assert "must be a number of seconds" in capsys.readouterr().err, argv


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--cluster", "garbage==", "--host-name", "h3"], "libpq does not know: 'garbage'"),
        (["--cluster", "host=a password=secret-1", "--host-name", "h3"], "passfile"),
        (["--cluster", "", "--host-name", "h3"], "must name the cluster"),
        (["--cluster", "host=a", "--host-name", "a/b"], "--host-name: must be 1-63"),
        (["--cluster", "host=a", "--host-name", ""], "--host-name: must name the host"),
    ],
)
def test_admin_backup_checks_cluster_and_host_name_as_the_server_does(
    tmp_path: Path, flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A string the server would refuse ended tiny-admin backup with psycopg's traceback."""
    from tiny import admin

    with pytest.raises(SystemExit) as exited:
        admin.main(["backup", str(tmp_path / "data"), str(tmp_path / "dest"), *flags])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and said in err and "secret-1" not in err and "Traceback" not in err
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize(("argv", "environ"), [([], {"TINY_DATA_DIR": ""}), (["--address", " "], {})])
def test_an_empty_data_dir_or_address_stops_at_start_up(
    argv: list[str], environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``TINY_DATA_DIR=`` was the current directory: the day files went wherever it was run."""
    with pytest.raises(SystemExit):
        config.parse(argv, environ)
    assert "must not be empty" in capsys.readouterr().err


def test_sizes_take_t_and_read_every_unit_as_binary() -> None:
    """--max-body 1TiB, the bound its own message named, was refused; 64MB is 64 MiB, as README says."""
    assert config.parse(["--max-body", "1TiB"], {}).max_body == 1024**4
    assert config.parse(["--max-body", "64MB"], {}).max_body == 64 * 1024**2


@pytest.mark.hardening("careless operator: --read-rate 1e-400 (0 in a float) turned pacing off")
@pytest.mark.parametrize("flag", ["--read-rate", "--analytics-cpu"])
def test_a_number_that_underflows_to_zero_is_no_zero(flag: str) -> None:
    with pytest.raises(SystemExit):
        config.parse(["--data-dir", "d", flag, "1e-400"], environ={})
    assert getattr(config.parse(["--data-dir", "d", flag, "0.0e5"], environ={}), flag[2:].replace("-", "_")) == 0
