"""The follower's shared status: one writer, readers in other processes, whole readings, what /healthz says."""

from __future__ import annotations

import os
import time

from tiny.follower_status import NOT_RUNNING_AFTER, REPORTED_AFTER, FollowerStatus


def test_a_forked_writer_is_read_in_the_parent() -> None:
    status = FollowerStatus()
    pid = os.fork()
    if pid == 0:  # the follower's side
        status.publish(41, 45, "")
        status.beat(0.0)
        os._exit(0)
    os.waitpid(pid, 0)
    progress = status.progress()
    assert (progress.applied, progress.head, progress.lag()) == (41, 45, 4)
    assert progress.behind_since > 0


def test_readings_are_whole_while_a_writer_writes_without_pause() -> None:
    status = FollowerStatus()
    pid = os.fork()
    if pid == 0:  # publishes (n, n, "error n" for odd n) for a second
        end = time.monotonic() + 1.0
        n = 0
        while time.monotonic() < end:
            n += 1
            status.publish(n, n, f"error {n}" if n % 2 else "")
        os._exit(0)
    torn, readings = [], 0
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        progress = status.progress()
        readings += 1
        expected = f"error {progress.applied}" if progress.applied % 2 else ""
        if progress.applied > 0 and (progress.head != progress.applied or progress.error != expected):
            torn.append(progress)
    os.waitpid(pid, 0)
    assert readings > 1000 and not torn, torn[:3]


def test_a_follower_that_has_not_opened_the_data_dir_is_trouble() -> None:
    status = FollowerStatus()
    status.reset()
    assert status.trouble(30.0) == "the follower has not opened the data dir yet"
    status.publish(0, 0)
    assert status.trouble(30.0) is None


def test_no_beat_for_two_seconds_is_a_follower_not_running() -> None:
    status = FollowerStatus()
    status.publish(3, 3)
    status.beat(0.0)
    later = time.monotonic() + NOT_RUNNING_AFTER + 0.1
    assert "not running" in str(status.trouble(30.0, now=later))


def test_an_operation_past_its_bound_is_a_stuck_follower() -> None:
    status = FollowerStatus()
    status.publish(3, 3)
    status.beat(time.monotonic() - 31)
    assert "in one operation for 3" in str(status.trouble(30.0))


def test_an_error_is_reported_once_it_has_lasted_a_second_and_keeps_its_start() -> None:
    status = FollowerStatus()
    status.beat(0.0)
    status.publish(3, 5, "no PostgreSQL primary answers")
    assert status.trouble(30.0) is None  # a blip is not reported
    since = status.progress().error_since
    status.publish(3, 5, "no PostgreSQL primary answers")
    assert status.progress().error_since == since
    later = since + REPORTED_AFTER
    status.beat(0.0)
    assert status.trouble(30.0, now=later) == "the follower cannot follow the log: no PostgreSQL primary answers"


def test_a_restart_keeps_the_position_the_files_hold() -> None:
    status = FollowerStatus()
    status.publish(12, 12)
    status.reset()
    assert status.applied() == 12
