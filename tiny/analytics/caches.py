"""Every analytics cache of a process under one byte budget (``--analytics-cache-bytes``).

A :class:`Budget` is one LRU of the entries of every :class:`Cache` made from it: putting an
entry that takes the budget past its limit drops the least recently used entries of any of
its caches, until the rest fits. Each entry is counted at the weight its cache gives it (the
bytes of an answer, an estimate for Python objects); one heavier than the whole budget is not
kept. A cache may also bound its own entry count.

How ``--analytics-cache-bytes`` is shared (:class:`Shares`): a worker keeps a quarter of it
(the answers it sends: tiny.live's, and the row queries' results, tiny.analytics.service);
the processes of its pool's answers lane another quarter (the day aggregates and line counts,
tiny.analytics.answers); those of its rows lane the half left (one whale's rows,
tiny.analytics.rows: a big whale's rows weigh megabytes, and the queries of one day version
share them), in equal parts within a lane. So the flag bounds every analytics cache of a
worker and its pool together.

Not thread-safe: each process uses its caches from one thread (a worker's event loop, a
pool process's job).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tiny import limits

V = TypeVar("V")


class _Missing:
    """What :meth:`Cache.get` answers for a key it does not hold."""


MISSING = _Missing()


class Budget:
    """At most ``limit`` bytes of entries across every cache made from it (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"a cache budget cannot be negative: {limit}")
        self.limit = limit
        self.used = 0
        # (its cache, its key) -> its weight, least recently used first
        self._order: OrderedDict[tuple[Cache[Any], Hashable], int] = OrderedDict()
        self._caches: dict[str, Cache[Any]] = {}

    def cache(self, name: str, max_entries: int | None = None) -> Cache[Any]:
        """The cache of this budget called ``name`` (what it holds), made on first use: at most
        ``max_entries`` entries."""
        found = self._caches.get(name)
        if found is None:
            found = self._caches[name] = Cache(self, name, max_entries)
        return found

    def caches(self) -> list[Cache[Any]]:
        """Its caches, in the order they were made."""
        return list(self._caches.values())

    def _fit(self) -> None:
        """Drop the least recently used entries until the rest fits."""
        while self.used > self.limit:
            cache, key = next(iter(self._order))
            cache.pop(key)


class Cache(Generic[V]):
    """One kind of entries under a :class:`Budget`, LRU with the budget's other caches."""

    def __init__(self, budget: Budget, name: str, max_entries: int | None) -> None:
        self.budget = budget
        self.name = name
        self.max_entries = max_entries
        self._values: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()  # key -> (value, weight), LRU first

    def __repr__(self) -> str:
        return f"<Cache {self.name}: {len(self._values)} entries>"

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: Hashable) -> V | _Missing:
        """The value kept under ``key`` (now the most recently used), or MISSING."""
        found = self._values.get(key)
        if found is None:
            return MISSING
        self._values.move_to_end(key)
        self.budget._order.move_to_end((self, key))
        return found[0]

    def put(self, key: Hashable, value: V, weight: int) -> None:
        """Keep ``value`` under ``key``, weighing ``weight`` bytes; entries least recently used
        are dropped until the budget (and this cache's entry count) fits. A value heavier
        than the whole budget is not kept."""
        self.pop(key)
        budget = self.budget
        if weight > budget.limit:
            return
        self._values[key] = (value, weight)
        budget._order[(self, key)] = weight
        budget.used += weight
        if self.max_entries is not None and len(self._values) > self.max_entries:
            self.pop(next(iter(self._values)))
        budget._fit()

    def pop(self, key: Hashable) -> None:
        """Forget ``key`` (nothing if it is not kept)."""
        found = self._values.pop(key, None)
        if found is not None:
            del self.budget._order[(self, key)]
            self.budget.used -= found[1]

    def weight(self) -> int:
        """The bytes its entries weigh together."""
        return sum(weight for _, weight in self._values.values())


_process: list[Budget] = []  # this process's budget, once set or first asked for


def set_process_budget(limit: int) -> None:
    """Make the budget of this process's module-level caches ``limit`` bytes (a pool process's
    share, at its start: tiny.analytics.pool_process.pool_init); their entries are dropped."""
    _process[:] = [Budget(limit)]


def process_budget() -> Budget:
    """The budget of this process's module-level caches (a pool process's share of the default
    ``--analytics-cache-bytes`` until :func:`set_process_budget`)."""
    if not _process:
        _process.append(Budget(Shares.of(limits.ANALYTICS_CACHE_BYTES, 1).rows_process))
    return _process[0]


@dataclass(frozen=True)
class Shares:
    """The budgets of a worker and of each of its pool processes, by lane (see the module docstring)."""

    worker: int
    answers_process: int
    rows_process: int

    @classmethod
    def of(cls, total: int, processes: int) -> Shares:
        """The shares of ``total`` bytes (``--analytics-cache-bytes``) for a worker whose pool
        runs ``processes`` processes in each lane."""
        each = max(processes, 1)
        return cls(total // 4, total // 4 // each, total // 2 // each)


def report() -> tuple[int, int, dict[str, int]]:
    """This process's module-level budget: its limit, the bytes used, and each cache's weight
    (a pool job: what a test or an operator reads of a pool process)."""
    budget = process_budget()
    return budget.limit, budget.used, {cache.name: cache.weight() for cache in budget.caches()}
