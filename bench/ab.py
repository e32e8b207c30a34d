"""One change, measured: the server of another tree (a commit, or a directory) against this one's,
side by side, in interleaved rounds.

Usage:
    python bench/ab.py OLD [--body 1] [--keys] [--rounds 8] [--seconds 3] [--concurrency 8]
    python bench/ab.py 9a57242 --body 100 --keys      # this tree against commit 9a57242

OLD is a commit (checked out into a temporary git worktree, removed afterwards) or the directory
of another tree. Its compiled codec is this tree's when the two trees' codec sources are the same,
else built there (maturin, into that tree only). Then:

1. both servers start (``app.py --processes 1``, a fresh data dir each, free ports on 127.0.0.1)
   and are warmed up;
2. each round measures one, then the other (old-new, then new-old next round, so a drift or the
   second place in a round hits both alike), each a point as bench/run.py measures it
   (bench/harness/runner.py: ab ``-c C -k`` sized to about SECONDS, or with ``--keys``
   bench/post_load.py with a fresh Idempotency-Key per request; the servers' CPU from /proc
   before and after; the day files removed after it, the journal kept);
3. prints each round's new/old ratios of CPU per request and of requests/s, and their medians.

These machines are noisy (two shared cores; a point's CPU per request moves 15-20% between rounds
on its own): a median of ratios over 6-10 rounds resolves about 5%. A server compared with itself
(``python bench/ab.py HEAD``) shows what the noise is that day.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import RESULTS  # noqa: E402
from bench.harness.bodies import Body, make_bodies  # noqa: E402
from bench.harness.runner import PointSpec, Runner  # noqa: E402
from bench.harness.services import LocalServer  # noqa: E402
from tiny.codec import source_hash  # noqa: E402


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("old", help="a commit, or the directory of another tree")
    parser.add_argument(
        "--body", default="1", help="a body of bench/harness/bodies.py: 1, 100, 1600-gzip... (default 1)"
    )
    parser.add_argument("--keys", action="store_true", help="a fresh Idempotency-Key per request (bench/post_load.py)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds, each old then new or new then old (default 8)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of load per server per round (default 3)")
    parser.add_argument("--concurrency", type=int, default=8, help="connections (default 8)")
    return parser.parse_args(argv)


@contextlib.contextmanager
def other_tree(old: str, work: Path) -> Iterator[Path]:
    """The tree to compare with: ``old`` itself when it is a directory, else a worktree of that commit."""
    if Path(old).is_dir():
        yield Path(old).resolve()
        return
    tree = work / "old-tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), old], check=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


def with_codec(tree: Path) -> None:
    """Give ``tree`` a compiled codec built from its own sources: this tree's when they are the
    same (tiny.codec checks the build id at import), else one built there."""
    if list(tree.glob("tiny/_codec*.so")):
        return
    crate = tree / "rust" / "tiny_codec"
    if source_hash(crate) == source_hash(ROOT / "rust" / "tiny_codec"):
        for built in ROOT.glob("tiny/_codec*.so"):
            shutil.copy2(built, tree / "tiny" / built.name)
        return
    maturin = Path(sys.executable).with_name("maturin")
    subprocess.run(
        [
            str(maturin),
            "develop",
            "--release",
            "--locked",
            "--skip-install",
            "--target-dir",
            str(tree / "rust" / "target"),
        ],
        cwd=tree,
        check=True,
        env={**os.environ, "VIRTUAL_ENV": str(Path(sys.executable).parents[1])},
    )


def one_round(
    runner: Runner, server: LocalServer, body: Body, args: argparse.Namespace, number: int
) -> tuple[float, float]:
    """Load ``server`` once, as bench/run.py measures a point: (its CPU-seconds per request, requests/s)."""
    driver = "post" if args.keys else "ab"
    spec = PointSpec(server.name, body, args.concurrency, True, driver, args.keys, "ab", number)
    point = runner.point(spec, server)
    answered = point["complete"] - point["failed"] - point["non2xx"]
    if "error" in point or answered <= 0 or point["failed"] or point["non2xx"]:
        raise RuntimeError(f"{server.name}: the driver failed: {point.get('error') or point}")
    return point["server_cpu_s"] / answered, point["rps"]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    bodies = make_bodies(RESULTS / "bodies")
    if args.body not in bodies:
        sys.exit(f"unknown body {args.body!r}: one of {', '.join(bodies)}")
    body = bodies[args.body]
    with tempfile.TemporaryDirectory(prefix="tiny-ab-") as scratch:
        work = Path(scratch)
        with other_tree(args.old, work) as tree, contextlib.ExitStack() as stack:
            with_codec(tree)
            servers: dict[str, LocalServer] = {}
            for name, script in (("old", tree / "app.py"), ("new", ROOT / "app.py")):
                data = work / f"{name}-data"
                data.mkdir()
                server = LocalServer(name, str(script), 1, data, logs=work / "logs")
                stack.callback(server.stop)
                servers[name] = server.start()
            runner = Runner(args.seconds, 50, 10_000_000, work / "raw")
            for name, server in servers.items():
                runner.warm_up(name, server, body)
            cpu: dict[str, list[float]] = {"old": [], "new": []}
            rps: dict[str, list[float]] = {"old": [], "new": []}
            for number in range(args.rounds):
                for name in ("old", "new") if number % 2 == 0 else ("new", "old"):
                    per_request, rate = one_round(runner, servers[name], body, args, number + 1)
                    cpu[name].append(per_request)
                    rps[name].append(rate)
                print(
                    f"round {number + 1}: CPU per request old {cpu['old'][-1] * 1e6:.0f} us, new "
                    f"{cpu['new'][-1] * 1e6:.0f} us; requests/s old {rps['old'][-1]:.0f}, new {rps['new'][-1]:.0f}",
                    flush=True,
                )
    cpu_ratios = [new / old for new, old in zip(cpu["new"], cpu["old"], strict=True)]
    rps_ratios = [new / old for new, old in zip(rps["new"], rps["old"], strict=True)]
    what = f"body {body.name}, c={args.concurrency} -k, {'post_load with keys' if args.keys else 'ab'}"
    print(f"new ({ROOT}) / old ({args.old}), {what}, {args.rounds} rounds of {args.seconds:g} s:")
    print(f"  CPU per request: {', '.join(f'{r:.3f}' for r in cpu_ratios)}; median {statistics.median(cpu_ratios):.3f}")
    print(f"  requests/s:      {', '.join(f'{r:.3f}' for r in rps_ratios)}; median {statistics.median(rps_ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
