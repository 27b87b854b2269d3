"""The KV gate of a concurrent pass on a unified pool: the workers' shared queue, first in,
first out, that hands out the next chain only when the pool has room for it
(:func:`batch_invariance.core.kv_budget.admits`), so the server is never asked for more KV
than its pool holds. Without a pool it is a plain queue (a split cache gives every slot its
own ``ctx``)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from batch_invariance.core.kv_budget import admits
from batch_invariance.core.plan import WorkItem

__all__ = ["KvGate", "KvPool", "pass_gate"]

Chain = tuple[WorkItem, ...]


@dataclass(frozen=True)
class KvPool:
    """A unified KV pool a pass must stay within: its size in tokens, the N of the server,
    and the most cells each request can hold, by id
    (:func:`batch_invariance.core.kv_budget.kv_costs`)."""

    tokens: int
    parallel: int
    costs: Mapping[str, int]


class KvGate:
    """Chains handed out in order; with a ``pool``, each waits at the head until the cells
    in flight leave room for its cost (the largest of its items': a chain's turns run one
    after another on one slot)."""

    def __init__(
        self,
        chains: Sequence[Chain],
        cost: Mapping[int, int] | None = None,
        pool: int | None = None,
    ) -> None:
        self._queue: deque[tuple[int, Chain]] = deque(enumerate(chains))
        self._cost = dict(cost or {})
        self._pool = pool
        self._cond = threading.Condition()
        self._in_flight = 0
        self._n_in_flight = 0
        self._closed = False
        #: The most cells the gate ever let be in flight at once (a test reads it).
        self.peak = 0

    def take(self) -> tuple[int, Chain] | None:
        """The next chain (its position and items) once it may go out; ``None`` when the
        queue is empty or the gate was closed. The caller gives it back with :meth:`done`."""
        with self._cond:
            while True:
                if self._closed or not self._queue:
                    return None
                position, chain = self._queue[0]
                cost = self._cost.get(position, 0)
                if self._pool is None or admits(
                    cost, self._in_flight, self._n_in_flight, self._pool
                ):
                    self._queue.popleft()
                    self._in_flight += cost
                    self._n_in_flight += 1
                    self.peak = max(self.peak, self._in_flight)
                    return position, chain
                self._cond.wait()

    def done(self, position: int) -> None:
        """The chain at ``position`` is answered: its cells are free again."""
        with self._cond:
            self._in_flight -= self._cost.get(position, 0)
            self._n_in_flight -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """Hand out nothing more; wake every worker waiting at the head."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def pass_gate(chains: Sequence[Chain], pool: KvPool | None) -> KvGate:
    """A pass's queue: first in, first out, within ``pool`` where there is one."""
    if pool is None:
        return KvGate(chains)
    cost = {k: max(pool.costs.get(i.test_id, 0) for i in c) for k, c in enumerate(chains)}
    return KvGate(chains, cost, pool.tokens)
