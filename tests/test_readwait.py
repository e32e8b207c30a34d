"""Cluster mode's reads: the position a read waits for, how long, and what it says when its host is behind.

The follower's status is the real shared memory, written here as a follower writes it; the
log's head, where a test needs one that cannot be read, comes from a HeadReader pointed at a
port where nothing listens (a cluster with no primary).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tiny.follower_status import FollowerStatus
from tiny.readwait import Behind, HeadReader, ReadWait, asked_position
from tiny.testing import free_port


@pytest.mark.parametrize("text", ["0", "1", " 42 ", "9223372036854775807"])
def test_a_wait_position_is_ascii_digits(text: str) -> None:
    assert asked_position(text) == int(text)


@pytest.mark.parametrize("text", ["", " ", "-1", "+1", "1.0", "1e3", "0x10", "\u0661", "1,2", "1" * 20, "abc"])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="Tiny-Wait-Position must be a position"):
        asked_position(text)


def test_no_header_is_no_position() -> None:
    assert asked_position(None) is None


def nowhere() -> HeadReader:
    """The head of a cluster none of whose nodes answers."""
    return HeadReader(f"host=127.0.0.1 port={free_port()} dbname=x user=x connect_timeout=2")


def waiting(status: FollowerStatus, bound: float = 2.0) -> ReadWait:
    status.beat(0.0)
    return ReadWait(status, nowhere(), bound, busy_bound=30.0)


def test_a_position_already_applied_is_answered_at_once() -> None:
    status = FollowerStatus()
    status.publish(7, 7)
    reads = waiting(status)
    began = time.monotonic()
    assert asyncio.run(reads.wait(5, time.monotonic())) == 5
    assert time.monotonic() - began < 0.1
    reads.close()


def test_position_zero_never_waits_even_before_the_follower_opened() -> None:
    reads = waiting(FollowerStatus())
    assert asyncio.run(reads.wait(0, time.monotonic())) == 0
    reads.close()


def test_a_read_waits_until_the_follower_publishes_its_position() -> None:
    status = FollowerStatus()
    status.publish(3, 3)
    reads = waiting(status, bound=5.0)
    later = threading.Timer(0.5, lambda: status.publish(9, 9))
    later.start()
    began = time.monotonic()
    try:
        assert asyncio.run(reads.wait(9, time.monotonic())) == 9
    finally:
        later.cancel()
        reads.close()
    assert 0.4 < time.monotonic() - began < 2.0


def test_a_read_past_its_bound_says_how_far_behind_and_when_to_retry() -> None:
    status = FollowerStatus()
    status.publish(3, 10)
    reads = waiting(status, bound=0.5)
    began = time.monotonic()
    with pytest.raises(Behind) as behind:
        asyncio.run(reads.wait(10, began))
    reads.close()
    assert 0.5 <= time.monotonic() - began < 2.5  # the bound (the head, not readable, waits no longer)
    assert "has applied position 3 of the log, the read needs 10 (7 behind" in str(behind.value)
    assert behind.value.retry_after >= 1


def test_many_reads_that_gave_up_leave_nothing_behind() -> None:
    status = FollowerStatus()
    status.publish(0, 0)
    reads = waiting(status, bound=0.2)

    async def many() -> None:
        arrived = time.monotonic()
        results = await asyncio.gather(*(reads.wait(5, arrived) for _ in range(200)), return_exceptions=True)
        assert all(isinstance(result, Behind) for result in results)

    asyncio.run(many())
    assert len(reads._waiting) <= 64  # compacted once most gave up
    reads.close()


def test_without_a_position_a_head_that_cannot_be_read_is_503_naming_the_way_out() -> None:
    status = FollowerStatus()
    status.publish(4, 4)
    reads = waiting(status)
    with pytest.raises(Behind) as behind:
        asyncio.run(reads.wait(None, time.monotonic()))
    reads.close()
    assert "the log's head could not be read" in str(behind.value)
    assert "Tiny-Wait-Position: 0" in str(behind.value) and "(position 4)" in str(behind.value)


def test_a_follower_that_is_not_running_fails_the_read_at_once() -> None:
    status = FollowerStatus()
    status.publish(1, 1)
    reads = ReadWait(status, nowhere(), 5.0, busy_bound=30.0)  # it never beat
    began = time.monotonic()
    with pytest.raises(Behind, match="the follower is not running"):
        asyncio.run(reads.wait(3, time.monotonic()))
    reads.close()
    assert time.monotonic() - began < 0.5
