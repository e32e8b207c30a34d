"""A pool process's start (tiny.analytics.pool_process): Ctrl-C ignored, its caches' budget, its end with its parent."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

from tiny.analytics import caches
from tiny.analytics.pool_process import pool_init
from tiny.testing import ROOT


def _state() -> tuple[bool, int]:
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN, caches.process_budget().limit


def test_a_pool_process_ignores_ctrl_c_and_has_the_budget_it_was_given() -> None:
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn, initializer=pool_init, initargs=(os.getpid(), 12345)) as pool:
        assert pool.submit(_state).result(timeout=60) == (True, 12345)


def test_a_pool_process_whose_parent_is_already_gone_exits_at_once() -> None:
    """Started for a parent that is not its parent (gone before the kernel was asked to tie
    them): it leaves at once, running nothing after its start."""
    probe = "from tiny.analytics.pool_process import pool_init; pool_init(1, 1024); print('ran on')"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "ran on" not in done.stdout, (done.stdout, done.stderr)
