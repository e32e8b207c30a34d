"""tiny.cluster.session without a cluster: what a connect that reaches no primary says."""

from __future__ import annotations

import time

import pytest

from tiny.cluster.errors import Unavailable
from tiny.cluster.session import Timeouts, Watchdog, connect
from tiny.testing import free_port


def test_no_primary_reachable_is_one_line_within_the_bound() -> None:
    """libpq puts each host's failure on a line of its own; the message goes to the log, to
    /healthz and into a 503's JSON, each of which reads one line."""
    ports = [free_port(), free_port()]
    dsn = f"host=127.0.0.1,127.0.0.1 port={ports[0]},{ports[1]} dbname=x user=x"
    watchdog = Watchdog()
    began = time.monotonic()
    try:
        with pytest.raises(Unavailable) as refused:
            connect(dsn, Timeouts(), watchdog)
    finally:
        watchdog.close()
    message = str(refused.value)
    assert time.monotonic() - began < 2 * Timeouts().connect + 1
    assert "\n" not in message and str(ports[0]) in message and str(ports[1]) in message
