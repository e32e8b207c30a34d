"""One change, measured: the server of another tree (a commit, or a directory) against this one's,
side by side, in interleaved rounds.

Usage:
    python bench/ab.py OLD [--body 1] [--keys] [--rounds 8] [--seconds 3] [--concurrency 8]
    python bench/ab.py 9a57242 --body 100 --keys      # this tree against commit 9a57242
    python bench/ab.py main --body 1 --key-cost       # what a fresh key costs, in each tree
    python bench/ab.py . --old-args "--cpu-affinity none" --new-args "--cpu-affinity 0"   # one flag, one tree

OLD is a commit (checked out into a temporary git worktree, removed afterwards) or the directory
of another tree. Its compiled codec is this tree's when the two trees' codec sources are the same,
else built there (maturin, into that tree only). Then:

1. both servers start (``app.py --processes 1``, or ``--processes N``, and each side's
   ``--old-args``/``--new-args``; a fresh data dir each, free ports on 127.0.0.1)
   and are warmed up;
2. each round measures one, then the other (old-new, then new-old next round, so a drift or the
   second place in a round hits both alike), each a point as bench/run.py measures it
   (bench/harness/runner.py: ab ``-c C -k`` sized to about SECONDS, or with ``--keys``
   bench/post_load.py with a fresh Idempotency-Key per request; the servers' CPU from /proc
   before and after; the day files removed after it, the journal kept);
3. prints each round's new/old ratios of CPU per request and of requests/s, their medians, and
   the CPU ratios pooled (their geometric mean with a 95% interval).

With ``--key-cost`` each round measures four points instead, each tree without a key and with a
fresh key per request (bench/post_load.py for both, so the load is the same but for the
header; the four in a rotating order), and prints each tree's keyed/unkeyed ratio of CPU per
request per round and its median: what a key costs in the old tree and in this one, side by side.

These machines are noisy (two shared cores; a point's CPU per request moves 15-20% between rounds
on its own): a median of ratios over 6-10 rounds resolves about 5%. A server compared with itself
(``python bench/ab.py HEAD``) shows what the noise is that day.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
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
    parser.add_argument(
        "--key-cost", action="store_true", help="keyed / unkeyed CPU per request in each tree (4 points a round)"
    )
    parser.add_argument("--processes", type=int, default=1, help="worker processes of each server (default 1)")
    parser.add_argument("--old-args", default="", help="more flags for OLD's server, e.g. '--cpu-affinity none'")
    parser.add_argument("--new-args", default="", help="more flags for this tree's server, e.g. '--cpu-affinity 0'")
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
    runner: Runner, server: LocalServer, body: Body, args: argparse.Namespace, number: int, keys: bool | None = None
) -> tuple[float, float]:
    """Load ``server`` once, as bench/run.py measures a point: (its CPU-seconds per request, requests/s).
    ``keys`` (--key-cost): bench/post_load.py with (True) or without (False) a key per request."""
    driver = "post" if args.keys or keys is not None else "ab"
    keyed = bool(args.keys or keys)
    spec = PointSpec(server.name, body, args.concurrency, True, driver, keyed, "ab", number)
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
                flags = shlex.split(args.old_args if name == "old" else args.new_args)
                server = LocalServer(name, str(script), args.processes, data, flags, logs=work / "logs")
                server.tree = tree if name == "old" else None
                stack.callback(server.stop)
                servers[name] = server.start()
            runner = Runner(args.seconds, 50, 10_000_000, work / "raw")
            for name, server in servers.items():
                runner.warm_up(name, server, body)
            if args.key_cost:
                return key_cost(runner, servers, body, args)
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
    print(f"    {pooled(cpu_ratios)}")
    print(f"  requests/s:      {', '.join(f'{r:.3f}' for r in rps_ratios)}; median {statistics.median(rps_ratios):.3f}")
    return 0


def pooled(ratios: Sequence[float]) -> str:
    """The ratios pooled: their geometric mean and its 95% interval (the mean of the logs, plus or
    minus 1.96 standard errors; a t-interval would be a little wider under 10 rounds). With 30
    rounds it resolves a few percent where a median of 8 resolves about 5."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return f"geometric mean {math.exp(mean):.3f}"
    half = 1.96 * statistics.stdev(logs) / math.sqrt(len(logs))
    return f"geometric mean {math.exp(mean):.3f} (95% interval {math.exp(mean - half):.3f}-{math.exp(mean + half):.3f})"


def key_cost(runner: Runner, servers: dict[str, LocalServer], body: Body, args: argparse.Namespace) -> int:
    """--key-cost: each round, each tree without and with a key, in a rotating order."""
    arms = [("old", False), ("old", True), ("new", False), ("new", True)]
    cpu: dict[tuple[str, bool], list[float]] = {arm: [] for arm in arms}
    for number in range(args.rounds):
        shift = number % len(arms)
        for name, keyed in arms[shift:] + arms[:shift]:
            cpu[name, keyed].append(one_round(runner, servers[name], body, args, number + 1, keys=keyed)[0])
        print(
            f"round {number + 1}: CPU per request (us) "
            + ", ".join(
                f"{name} {'key' if keyed else 'no key'} {cpu[name, keyed][-1] * 1e6:.0f}" for name, keyed in arms
            ),
            flush=True,
        )
    print(
        f"keyed / unkeyed CPU per request, body {body.name}, c={args.concurrency} -k, "
        f"{args.rounds} rounds of {args.seconds:g} s:"
    )
    for name, where in (("old", args.old), ("new", ROOT)):
        ratios = [k / u for k, u in zip(cpu[name, True], cpu[name, False], strict=True)]
        print(f"  {name} ({where}): {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")
        print(f"    {pooled(ratios)}")
    for keyed in (False, True):
        ratios = [n / o for n, o in zip(cpu["new", keyed], cpu["old", keyed], strict=True)]
        print(
            f"  new / old, {'keyed' if keyed else 'unkeyed'}: {', '.join(f'{r:.3f}' for r in ratios)}; "
            f"median {statistics.median(ratios):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
