"""The README's literal run, read from README.md: its fenced command blocks as steps, and a runner.

The README's contract with this module (README, "A first run, step by step"):

- every fenced block whose info string is ``sh`` holds shell commands, one per line; a line
  ending in ``\\`` goes on on the next; a line ``#> text`` shows what the command above it
  prints (``...`` stands for any text, across lines too); other ``#`` lines are comments;
- every fenced block whose info string is ``r`` is R code, run whole with Rscript; its
  ``#> `` lines are, in order, all it prints;
- the blocks run in the README's order, as a newcomer pastes them: the commands before
  ``make run`` in one shell, the server started by ``make run``, and every command after it
  in a second shell, where one command's variables reach the next.

Nothing of the README is copied here: a block added, changed or removed there is run, changed or
gone here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

README_PORT = 8000  # the port the README's commands name: http://127.0.0.1:8000
_FENCE = re.compile(r"^```(\w*)\s*$")
_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+) with (\d+) worker")
_READY = " ready (codec "  # a worker's line once it serves (tiny.worker)


@dataclass
class Step:
    """One command (``kind`` "sh") or one R block (``kind`` "r") of the README, and what it printed."""

    kind: str
    line: int  # where it starts in README.md, 1-based
    text: str
    expected: list[str] = field(default_factory=list)
    status: int | None = None  # None: not run
    out: str = ""
    err: str = ""

    def words(self) -> list[str]:
        """The command's words as the shell splits them (comments dropped)."""
        return shlex.split(self.text, comments=True)

    def is_server(self) -> bool:
        return self.kind == "sh" and self.words()[:2] == ["make", "run"]

    def needs_r(self) -> bool:
        return self.kind == "r" or (self.kind == "sh" and self.words()[:1] in (["R"], ["Rscript"]))

    def where(self) -> str:
        return f"README.md:{self.line}: {self.text}"


def steps(readme: str) -> list[Step]:
    """The README's fenced ``sh`` and ``r`` blocks as steps, in order."""
    found: list[Step] = []
    lang: str | None = None
    start = 0
    block: list[str] = []
    for number, line in enumerate(readme.splitlines(), 1):
        fence = _FENCE.match(line)
        if fence and lang is None:
            lang, start, block = fence.group(1), number + 1, []
        elif fence and not fence.group(1):
            if lang == "sh":
                found += _shell_steps(block, start)
            elif lang == "r":
                found.append(_r_step(block, start))
            lang = None
        elif lang is not None:
            block.append(line)
    assert lang is None, f"README.md: the block opened at line {start - 1} is never closed"
    return found


def _expected(line: str) -> str | None:
    """The shown output of a ``#>`` line, or None for any other line."""
    if line == "#>" or line.startswith("#> "):
        return line[3:]
    return None


def _shell_steps(lines: list[str], first: int) -> list[Step]:
    found: list[Step] = []
    pending: list[str] = []
    for offset, line in enumerate(lines):
        shown = _expected(line)
        if shown is not None:
            assert found and not pending, f"README.md:{first + offset}: output shown with no command above it"
            found[-1].expected.append(shown)
        elif pending or (line.strip() and not line.lstrip().startswith("#")):
            if not pending:
                start = first + offset
            pending.append(line)
            if not line.endswith("\\"):
                found.append(Step("sh", start, "\n".join(pending)))
                pending = []
    assert not pending, f"README.md:{first}: a command ends in a continuation"
    return found


def _r_step(lines: list[str], first: int) -> Step:
    shown = [text for text in map(_expected, lines) if text is not None]
    return Step("r", first, "\n".join(lines) + "\n", shown)


def matches(expected: list[str], printed: str) -> bool:
    """Whether ``printed`` is what ``expected`` shows: line ends and the last newline aside,
    each ``...`` standing for any text."""
    text = "\n".join(line.rstrip() for line in printed.replace("\r\n", "\n").rstrip("\n").split("\n"))
    pattern = ".*?".join(re.escape(part) for part in "\n".join(expected).split("..."))
    return re.fullmatch(pattern, text, re.DOTALL) is not None


def server_args(step: Step) -> list[str]:
    """The flags of ``make run ARGS="..."``: what the Makefile's run target gives app.py."""
    assigned = [word.partition("=")[2] for word in step.words()[2:] if word.startswith("ARGS=")]
    return shlex.split(assigned[0]) if assigned else []


def copy_checkout(root: Path, dest: Path) -> None:
    """What a clone of ``root`` holds once `make run` has built it, into ``dest``: the files git
    tracks, as they are in the work tree (so uncommitted edits count, and files a reader's own run
    left there, `token` or `batch.ndjson`, do not), and the codec built in ``root``
    (tiny/_codec*.so, which `make run` builds in place)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached"], cwd=root, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = root / name
        if not source.is_file():  # deleted in the work tree, not yet committed
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / name)
    for built in (root / "tiny").glob("_codec*.so"):
        shutil.copy2(built, dest / "tiny" / built.name)


class Walkthrough:
    """The README's steps run in a checkout at ``home``: see the module's docstring.

    ``env`` is the shells' environment; ``server_env`` the server's. The server is
    ``python`` ``app.py`` with the README's flags and ``--port 0``; the second shell's commands
    name the port it printed in place of 8000.
    """

    def __init__(self, home: Path, python: str, env: dict[str, str], server_env: dict[str, str]) -> None:
        self.home = home
        self.python = python
        self.env = env
        self.server_env = server_env
        self.server: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.server_log = home / "build" / "readme-server.log"
        self.server_status: int | None = None
        self._shells = 0

    def run(self, all_steps: list[Step], with_r: bool, seconds: float) -> None:
        """Run ``all_steps`` in order (R's only ``with_r``), stopping at the first that fails."""
        servers = [n for n, step in enumerate(all_steps) if step.is_server()]
        assert len(servers) == 1, "the README starts the server with one `make run`"
        before, after = all_steps[: servers[0]], all_steps[servers[0] + 1 :]
        deadline = time.monotonic() + seconds
        if self._shell(before, with_r, deadline) and self._start(all_steps[servers[0]], deadline):
            all_steps[servers[0]].status = 0
            self._shell(after, with_r, deadline)

    def stop(self, sig: signal.Signals = signal.SIGINT, seconds: float = 20.0) -> int | None:
        """Stop the server as Ctrl-C does (``sig`` to its process group); its exit status."""
        if self.server is None:
            return None
        try:
            os.killpg(self.server.pid, sig)
            self.server_status = self.server.wait(seconds)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            self.server_status = None
        finally:
            with_group_gone(self.server.pid)
        return self.server_status

    def _start(self, step: Step, deadline: float) -> bool:
        self.server_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.server_log, "wb") as log:
            self.server = subprocess.Popen(
                [self.python, "app.py", *server_args(step), "--port", "0"],  # the last --port wins
                cwd=self.home,
                env=self.server_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        while time.monotonic() < deadline and self.server.poll() is None:
            text = self.server_log.read_text(errors="replace")
            listening = _LISTENING.search(text)
            if listening and text.count(_READY) >= int(listening.group(2)) and self._healthy(int(listening.group(1))):
                self.port = int(listening.group(1))
                return True
            time.sleep(0.05)
        step.status, step.err = -1, self.server_log.read_text(errors="replace")
        return False

    @staticmethod
    def _healthy(port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def _shell(self, chosen: list[Step], with_r: bool, deadline: float) -> bool:
        """``chosen`` in one bash, each command's output and status in files of its own."""
        runs = [s for s in chosen if with_r or not s.needs_r()]
        self._shells += 1
        work = self.home / "build" / f"readme-shell-{self._shells}"
        work.mkdir(parents=True)
        script = ["set +e"]
        for n, step in enumerate(runs):
            command = self._command(step, work / f"{n}.R")
            script += [
                f"{{ {command}",
                f'}} >"{work}/{n}.out" 2>"{work}/{n}.err"; echo $? >"{work}/{n}.status"',
                f'[ "$(cat "{work}/{n}.status")" = 0 ] || exit 0',
            ]
        (work / "script.sh").write_text("\n".join(script) + "\n")
        shell = subprocess.Popen(["bash", str(work / "script.sh")], cwd=self.home, env=self.env, start_new_session=True)
        try:
            shell.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            with_group_gone(shell.pid)
        for n, step in enumerate(runs):
            if (work / f"{n}.status").exists():
                step.status = int((work / f"{n}.status").read_text())
                step.out = (work / f"{n}.out").read_text(errors="replace")
                step.err = (work / f"{n}.err").read_text(errors="replace")
        return all(step.status == 0 for step in runs)

    def _command(self, step: Step, r_file: Path) -> str:
        """The step as the shell runs it: R code through Rscript, 8000 as the server's port."""
        port = f"127.0.0.1:{self.port}" if self.port else f"127.0.0.1:{README_PORT}"
        text = step.text.replace(f"127.0.0.1:{README_PORT}", port)
        if step.kind == "r":
            r_file.write_text(text)
            return f"Rscript {shlex.quote(str(r_file))}"
        return text


def with_group_gone(pid: int) -> None:
    """Nothing of the process group ``pid`` leads is left running."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
