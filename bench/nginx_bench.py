"""nginx's share at 1,600 records over a keyed Tiny: its settings, one change at a time.

One Tiny server (``--processes 1``) and, in front of it, one nginx per variant, all running at
once (an idle nginx costs nothing). Each round measures Tiny alone, driven by bench/post_load.py
with a fresh Idempotency-Key per request, and each nginx variant, driven by post_load without a
key (nginx keys every POST with its ``$request_id``, nginx/proxy.conf), in a rotating order.
Prints, per variant and round, the server CPU per record through nginx (nginx and Tiny together)
over Tiny's alone with its own keys, the median, and nginx's own CPU per record.

The variants, each one change from the base (nginx/proxy.conf inside bench/harness/services.py's
nginx.conf: request buffering on, 1 MiB body buffer, 32 idle upstream connections kept, one
worker per core):

- ``base``;
- ``workers-1``: ``worker_processes 1``;
- ``no-keepalive``: no idle upstream connections kept (a new connection to Tiny per request);
- ``single-buffer``: ``client_body_in_single_buffer on``;
- ``buffer-16k``: ``client_body_buffer_size 16k`` (a bigger body goes through a temp file);
- ``nobuf``: ``proxy_request_buffering off`` (a reference only: nginx could no longer pass a POST
  that failed on one instance on to the next).

Usage:
    python bench/nginx_bench.py [--rounds 6] [--seconds 3] [--concurrency 8] [--variants base,workers-1]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import RESULTS  # noqa: E402
from bench.harness.bodies import make_bodies  # noqa: E402
from bench.harness.runner import PointSpec, Runner  # noqa: E402
from bench.harness.services import LocalServer, Service, healthz, nginx_config  # noqa: E402
from tiny.testing import free_port, server_env  # noqa: E402


def _sub(pattern: str, repl: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        changed, count = re.subn(pattern, repl, text, flags=re.MULTILINE)
        assert count == 1, f"no {pattern!r} to change"
        return changed

    return edit


# variant -> (an edit of the generated nginx.conf, an edit of its copy of nginx/proxy.conf)
VARIANTS: dict[str, tuple[Callable[[str], str], Callable[[str], str]]] = {
    "base": (str, str),
    "workers-1": (_sub(r"^worker_processes \d+;", "worker_processes 1;"), str),
    "no-keepalive": (_sub(r"^\s*keepalive 32;\n", ""), str),
    "single-buffer": (str, _sub(r"^(client_body_buffer_size 1m;)", r"\1\nclient_body_in_single_buffer on;")),
    "buffer-16k": (str, _sub(r"^client_body_buffer_size 1m;", "client_body_buffer_size 16k;")),
    "nobuf": (str, _sub(r"^(\s*proxy_request_buffering\s+)on;", r"\1off;")),
}


class _Nginx(Service):
    """One nginx variant in front of ``app`` (both measured: roles nginx and app)."""

    def __init__(self, name: str, app: LocalServer, scratch: Path, workers: int) -> None:
        self.name, self.app = name, app
        self.data_dir = app.data_dir
        self.prefix = Path(tempfile.mkdtemp(prefix=f"nginx-{name}-", dir=scratch))
        self.process: subprocess.Popen[bytes] | None = None
        self.info = {}
        port = free_port()
        upstream = int(app.url.split(":")[2].split("/")[0])
        conf_edit, proxy_edit = VARIANTS[name]
        conf = conf_edit(nginx_config(self.prefix, port, [upstream], workers, True))
        proxy = self.prefix / "proxy.conf"
        proxy.write_text(proxy_edit(proxy.read_text()))
        (self.prefix / "nginx.conf").write_text(conf)
        argv = [
            "nginx",
            "-p",
            str(self.prefix),
            "-c",
            str(self.prefix / "nginx.conf"),
            "-e",
            str(self.prefix / "e.log"),
        ]
        self.process = subprocess.Popen(argv, cwd=ROOT, env=server_env(), start_new_session=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if healthz(port)[0] == 200:
                    break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"nginx {name} did not start")
        self.url = f"http://127.0.0.1:{port}/ingest"

    def roles(self) -> dict[str, list[int]]:
        return {"nginx": [self.process.pid] if self.process else [], "app": self.app.roles()["app"]}

    def roots(self) -> list[int]:
        return [pid for pids in self.roles().values() for pid in pids]

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.prefix, ignore_errors=True)


def _per_record(point: dict[str, Any], role: str | None = None) -> float:
    records = (point["complete"] - point["failed"] - point["non2xx"]) * 1600
    if point.get("failed") or point.get("non2xx") or records <= 0:
        raise RuntimeError(f"{point['config']}: the driver failed: {point}")
    cpu = point["server_cpu_s"] if role is None else point["cpu_by_role"][role]
    return cpu / records * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="nginx workers of the base (cores)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    names = [name for name in args.variants.split(",") if name]
    body = make_bodies(RESULTS / "bodies")["1600"]
    with tempfile.TemporaryDirectory(prefix="tiny-nginx-") as scratch, contextlib.ExitStack() as stack:
        work = Path(scratch)
        (work / "data").mkdir()
        app = LocalServer("tiny", "app.py", 1, work / "data", logs=work / "logs")
        stack.callback(app.stop)
        app.start()
        fronts: dict[str, _Nginx] = {}
        for name in names:
            fronts[name] = _Nginx(name, app, work, args.workers)
            stack.callback(fronts[name].stop)
        runner = Runner(args.seconds, 20, 10_000_000, work / "raw")
        runner.warm_up("tiny", app, body)
        for name, front in fronts.items():
            runner.warm_up(name, front, body)
        arms = ["tiny", *names]
        alone: list[float] = []
        through: dict[str, list[float]] = {name: [] for name in names}
        own: dict[str, list[float]] = {name: [] for name in names}
        for number in range(args.rounds):
            shift = number % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                if arm == "tiny":
                    spec = PointSpec("tiny-keys", body, args.concurrency, True, "post", True, "nginx", number + 1)
                    alone.append(_per_record(runner.point(spec, app)))
                else:
                    spec = PointSpec(arm, body, args.concurrency, True, "post", False, "nginx", number + 1)
                    point = runner.point(spec, fronts[arm])
                    through[arm].append(_per_record(point))
                    own[arm].append(_per_record(point, "nginx"))
            print(
                f"round {number + 1}: CPU per record (us) tiny alone {alone[-1]:.3f}, "
                + ", ".join(f"{name} {through[name][-1]:.3f} (nginx {own[name][-1]:.3f})" for name in names),
                flush=True,
            )
    print(f"through nginx / tiny alone with its own keys, CPU per record, 1,600 records, c={args.concurrency} -k:")
    for name in names:
        ratios = [t / a for t, a in zip(through[name], alone, strict=True)]
        print(
            f"  {name:14} {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}; "
            f"nginx's own {statistics.median(own[name]):.3f} us/record"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
