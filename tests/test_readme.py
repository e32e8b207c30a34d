"""README.md followed literally: its commands run as written, its flags and install list are the code's.

The first-run test runs every fenced command block of the README (tests/readme_run.py reads
them from README.md; nothing is copied here), in order, in a fresh copy of the repository's
files with no data dir, beside a ``shared`` link to this workspace's ../shared (where the README's
sample day and R client are): what a clone in this workspace is once `make run` has built it.
Where it departs from a person at a terminal, and why:

- `make run ARGS="..."` runs as `.venv/bin/python app.py ...`, the command of the Makefile's run
  target (test_make_run_serves_with_app_py_and_the_args_given checks it), since make would also
  rebuild .venv and the codec, which `make test` has just done. `--port 0` is added (the last
  --port wins) so that no two tests fight over port 8000, and the later commands name the port
  the server printed instead of 8000.
- The server's analytics pool runs at normal priority without a CPU quota (TINY_ANALYTICS_NICE=0
  and TINY_ANALYTICS_CPU=0 in its environment; the README's flags set neither): at idle priority,
  on two cores busy with the rest of the suite, counting the sample day can take longer than a
  query waits (10 s), and the README's answers would be 503 "counting".
- The shells find a `curl` that adds `--fail-with-body` first in PATH, so that an HTTP error fails
  its command as it fails the reader; and an `xdg-open` that fetches the page it is given
  instead of opening a browser.
- R's steps run where Rscript is installed (`make sysdeps` installs it); without it the test
  checks the rest and then says it skipped them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests import readme_run
from tests.readme_run import Step, Walkthrough
from tiny import config
from tiny.testing import ROOT, SAMPLE_DAY, server_env

README = ROOT / "README.md"
BENCHMARKS = ROOT / "BENCHMARKS.md"
MAKEFILE = ROOT / "Makefile"
RSCRIPT = shutil.which("Rscript")
CURL = shutil.which("curl")
RUN_SECONDS = 150.0  # the whole first run; it takes about 15 s on an idle 2-core machine


def readme_steps() -> list[Step]:
    return readme_run.steps(README.read_text())


# -- the first run, literally --------------------------------------------------------------------


@pytest.mark.skipif(CURL is None, reason="the README's commands use curl")
@pytest.mark.timeout(240)
def test_a_newcomer_following_the_readme_literally_succeeds(tmp_path: Path) -> None:
    steps = readme_steps()
    home = tmp_path / "tiny-data-server"
    home.mkdir()
    (tmp_path / "shared").symlink_to(ROOT.parent / "shared")
    readme_run.copy_checkout(ROOT, home)
    (home / ".venv").symlink_to(Path(sys.prefix))
    assert (home / ".venv" / "bin" / "python").exists() and not (home / "data").exists()
    assert (home / "../shared/data/cran-logs/2014-05-04.csv.gz").resolve() == SAMPLE_DAY.resolve()
    page = tmp_path / "opened.html"
    walk = Walkthrough(
        home,
        str(home / ".venv" / "bin" / "python"),
        _shell_env(tmp_path / "bin", page),
        server_env({"TINY_ANALYTICS_NICE": "0", "TINY_ANALYTICS_CPU": "0", "TMPDIR": str(tmp_path)}),
    )
    try:
        walk.run(steps, with_r=RSCRIPT is not None, seconds=RUN_SECONDS)
        _assert_every_step_succeeded(steps, walk)
        _assert_every_shown_output_printed(steps)
        assert "CRAN whales" in page.read_text(), "xdg-open's address is not the dashboard"
        assert _post_status(walk.port) == 401, "the server the README starts took a POST without its token"
    finally:
        status = walk.stop()
    assert status == 0, "Ctrl-C did not stop the server with status 0:\n" + walk.server_log.read_text()
    if RSCRIPT is None:
        pytest.skip("every shell step passed; the R steps were not run: Rscript is not installed (make sysdeps)")


def _shell_env(bin_dir: Path, page: Path) -> dict[str, str]:
    """Our environment without TINY_* settings, with the `curl` and `xdg-open` of the module's docstring."""
    assert CURL is not None
    bin_dir.mkdir()
    # --fail-with-body (curl 7.76) prints the error's JSON too; an older curl fails without it
    with_body = subprocess.run([CURL, "--fail-with-body", "--version"], capture_output=True).returncode == 0
    fail = "--fail-with-body" if with_body else "--fail"
    (bin_dir / "curl").write_text(f'#!/bin/sh\nexec {shlex.quote(CURL)} {fail} "$@"\n')
    (bin_dir / "xdg-open").write_text(
        f'#!/bin/sh\nexec {shlex.quote(CURL)} {fail} -sS -o {shlex.quote(str(page))} "$1"\n'
    )
    for tool in ("curl", "xdg-open"):
        (bin_dir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINY_")}
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"}


def _assert_every_step_succeeded(steps: list[Step], walk: Walkthrough) -> None:
    for step in steps:
        if step.needs_r() and RSCRIPT is None:
            assert step.status is None
            continue
        assert step.status is not None, f"never ran (a step before it failed?): {step.where()}"
        assert step.status == 0, (
            f"exit status {step.status}: {step.where()}\nstdout:\n{step.out}\nstderr:\n{step.err}\n"
            f"server log:\n{walk.server_log.read_text(errors='replace') if walk.server_log.exists() else ''}"
        )


def _assert_every_shown_output_printed(steps: list[Step]) -> None:
    for step in steps:
        if step.expected and step.status is not None:
            assert readme_run.matches(step.expected, step.out), (
                f"{step.where()}\nthe README shows:\n" + "\n".join(step.expected) + f"\nit printed:\n{step.out}"
            )


def _post_status(port: int) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/ingest", data=b"{}\n", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def test_the_first_run_shows_every_feature_a_newcomer_tries() -> None:
    """The literal run covers what a newcomer tries first: a keyed batch sent twice, gzip, the
    token, health and metrics, the backfill of the sample day, the dashboard, the downloads API
    and its R client, each shown with what it prints."""
    steps = readme_steps()
    commands = "\n".join(step.text for step in steps if step.kind == "sh")
    posts = [step.text for step in steps if "--data-binary" in step.text]
    assert posts and all("Idempotency-Key: " in post for post in posts), "a batch is posted without a key"
    assert len(posts) != len(set(posts)), "no batch is sent again with its key"
    for needed in (
        "make run ARGS=",
        "--token-file token",
        'Authorization: Bearer $(cat token)"',
        "Content-Encoding: gzip",
        "rejects/",
        "/healthz",
        "/metrics",
        "-m tiny.replay ../shared/data/cran-logs/2014-05-04.csv.gz",
        "xdg-open http://127.0.0.1:8000/",
        "/api/days",
        "/downloads/total/",
        "/downloads/daily/",
        "/top/",
        "/badges/",
        "R CMD INSTALL",
    ):
        assert needed in commands, f"the README's first run leaves out {needed!r}"
    assert any(step.kind == "r" and "cran_downloads(" in step.text for step in steps)
    shown = [step for step in steps if step.expected]
    assert len(shown) >= 15, "most commands of the first run show what they print"


def test_make_run_serves_with_app_py_and_the_args_given() -> None:
    """What the first-run test runs in place of `make run`: the run target's command."""
    recipe = re.search(r"^run:.*\n((?:\t.*\n)+)", MAKEFILE.read_text(), re.MULTILINE)
    assert recipe, "the Makefile has no run target"
    assert re.search(r"^\t@?\$\(BIN\)/python app\.py \$\(ARGS\)( |$)", recipe.group(1), re.MULTILINE)


# -- the parts of the harness a wrong README must trip ----------------------------------------------


def test_a_shown_output_matches_only_what_was_printed() -> None:
    assert readme_run.matches(['{"a":1}'], '{"a":1}')
    assert readme_run.matches(["x", "y"], "x\r\ny  \n")
    assert readme_run.matches(['{"received":"...","line":2}'], '{"received":"2026-11-27T19:19:31Z","line":2}')
    assert readme_run.matches(["first", "..."], "first\nsecond\nthird")
    assert not readme_run.matches(['{"a":1}'], '{"a":2}')
    assert not readme_run.matches(["x"], "x\ny")
    assert not readme_run.matches(["a...c"], "abd")


def test_the_readme_is_read_as_commands_with_their_shown_output() -> None:
    text = "\n".join(
        [
            "```sh",
            "# a comment",
            "printf '%s\\n' \\",
            "  one > f",
            "cat f",
            "#> one",
            "```",
            "    indented: never run",
            "```r",
            "1 + 1",
            "#> [1] 2",
            "```",
            "```text",
            "not run",
            "```",
        ]
    )
    found = readme_run.steps(text)
    assert [(s.kind, s.line, s.text, s.expected) for s in found] == [
        ("sh", 3, "printf '%s\\n' \\\n  one > f", []),
        ("sh", 5, "cat f", ["one"]),
        ("r", 10, "1 + 1\n#> [1] 2\n", ["[1] 2"]),
    ]


# -- the README against the code ------------------------------------------------------------------

_ROW = re.compile(r"^\| `--([a-z-]+)` \| `(TINY_[A-Z_]+)` \| ([^|]+) \|", re.MULTILINE)
# Defaults the table names in words, and the values they stand for in Config.
_NO_VALUE: dict[str, tuple[object, ...]] = {"unset": (None, ""), "off": (False,), "the hostname": ("",)}


def test_the_configuration_table_lists_exactly_the_servers_flags_with_their_defaults() -> None:
    rows = {flag: (env, default.strip()) for flag, env, default in _ROW.findall(README.read_text())}
    flags = {name.replace("_", "-"): name for name, _, help_text in config._FLAGS if help_text is not None}
    assert set(rows) == set(flags), "README's configuration table and tiny/config.py name different flags"
    defaults = config.Config()
    for flag, name in flags.items():
        env, shown = rows[flag]
        assert env == config.env_name(name)
        if shown in _NO_VALUE:
            assert getattr(defaults, name) in _NO_VALUE[shown], f"README gives --{flag} the default {shown!r}"
            continue
        value = getattr(config.parse([f"--{flag}", shown], {}), name)
        assert value == getattr(defaults, name), f"README gives --{flag} the default {shown!r}"


def test_make_test_installs_what_the_readme_lists() -> None:
    """Every package `make sysdeps` installs is named in README's "Tests" section."""
    sysdeps = re.search(r"^sysdeps:.*\n((?:\t.*\n)+)", MAKEFILE.read_text(), re.MULTILINE)
    assert sysdeps
    installs = re.findall(r"install -y -qq --no-install-recommends \\?\s*((?:[\w.+-]+[ \t\\\n]+)+)", sysdeps.group(1))
    packages = {word for group in installs for word in group.split() if word not in {"\\", "&&"}}
    assert {"nginx", "chromium", "r-base-core", "postgresql-15"} <= packages
    section = README.read_text().split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    assert not [p for p in packages if p not in section], "README's Tests section leaves out a package"


_DATED = re.compile(r"\b(?:sessions? \d+|issue \d+|rounds? \d+ of work)\b", re.IGNORECASE)


@pytest.mark.parametrize("document", [README, BENCHMARKS], ids=lambda path: path.name)
def test_the_user_documents_are_not_dated_by_rounds_of_work(document: Path) -> None:
    """What holds and why, not when: git keeps the history of sessions and issues."""
    assert not _DATED.findall(document.read_text())


def test_every_metric_the_server_exports_is_named_in_the_readme() -> None:
    """The /metrics row lists what tiny/metrics.py registers (counters with their ``_total``)."""
    source = (ROOT / "tiny" / "metrics.py").read_text()
    registered = re.findall(r'(Counter|Gauge|Histogram)\(\s*"(tiny_\w+)"', source)
    registered += [("Gauge", name) for name in re.findall(r'gauge\(\s*"(tiny_\w+)"', source)]
    assert len(registered) >= 15, registered  # the pattern still finds the registrations
    readme = (ROOT / "README.md").read_text()
    missing = [
        name + ("_total" if kind == "Counter" else "")
        for kind, name in registered
        if f"`{name}{'_total' if kind == 'Counter' else ''}" not in readme
    ]
    assert not missing, f"README's /metrics row does not name {missing}"


_TIMES = re.compile(r"^\| (tests/test_\w+\.py) \| ([\d,]+) \|$", re.MULTILINE)
_TIMES_TOTAL = re.compile(r"^\| every file, [\d,]+ tests \| ([\d,]+) ", re.MULTILINE)


def test_the_per_file_test_times_name_files_of_the_suite_slowest_first_within_their_total() -> None:
    text = README.read_text()
    rows = [(name, int(seconds.replace(",", ""))) for name, seconds in _TIMES.findall(text)]
    total = _TIMES_TOTAL.search(text)
    assert rows and total, "README's Tests section has no per-file times"
    assert all((ROOT / name).is_file() for name, _ in rows), [name for name, _ in rows if not (ROOT / name).is_file()]
    assert [seconds for _, seconds in rows] == sorted((seconds for _, seconds in rows), reverse=True)
    assert sum(seconds for _, seconds in rows) <= int(total.group(1).replace(",", ""))


def test_how_it_works_names_every_module_of_the_package() -> None:
    """The README's module list is the map a newcomer reads the tree by: a module missing from it
    is one nobody finds, a name it keeps after a module went is one that misleads."""
    section = README.read_text().split("## How it works", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\btiny/[a-z_/]+\.py\b", section))
    modules = {
        path.relative_to(ROOT).as_posix() for path in (ROOT / "tiny").rglob("*.py") if path.name != "__init__.py"
    }
    assert sorted(modules - named) == [], "modules the README does not name"
    assert sorted(name for name in named - modules if not name.endswith("__init__.py")) == [], "names of no module"
