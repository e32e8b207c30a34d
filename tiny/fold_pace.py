"""How big a step of a fold of the aggregate store is: sized to keep a fold's deadline.

A fold with a deadline (tiny.aggregates.Aggregates.fold) keeps to it within a step: each step
(one transaction) is sized from how long the last ones took in this process, wall clock, to take
about FOLD_STEP_SECONDS (at most FOLD_MAX_STEP bytes, which bounds memory), and no smaller than
FOLD_MIN_STEP (tiny.limits); at the deadline the fold stops and raises
tiny.aggregate_errors.Behind.
"""

from __future__ import annotations

import time

from tiny import limits


class Pace:
    """How long a fold step takes in this process, wall clock, per byte: the size of the next."""

    def __init__(self) -> None:
        self.seconds_per_byte = 0.0

    def step(self, deadline: float | None) -> int:
        """The bytes of the next step: FOLD_FIRST_STEP before any was timed, else what takes about
        FOLD_STEP_SECONDS (or FOLD_MARGIN of the time left before ``deadline``, time.monotonic()),
        between FOLD_MIN_STEP and FOLD_MAX_STEP."""
        if not self.seconds_per_byte:
            return limits.FOLD_FIRST_STEP
        budget = limits.FOLD_STEP_SECONDS
        if deadline is not None:
            budget = min(budget, limits.FOLD_MARGIN * (deadline - time.monotonic()))
        return int(min(limits.FOLD_MAX_STEP, max(limits.FOLD_MIN_STEP, budget / self.seconds_per_byte)))

    def took(self, nbytes: int, seconds: float) -> None:
        """Note that a step of ``nbytes`` took ``seconds`` (steps below FOLD_MIN_STEP are not noted)."""
        if nbytes >= limits.FOLD_MIN_STEP:  # (a last short step would say more about its fixed costs than the bytes')
            rate = seconds / nbytes
            self.seconds_per_byte = (self.seconds_per_byte + rate) / 2 if self.seconds_per_byte else rate
