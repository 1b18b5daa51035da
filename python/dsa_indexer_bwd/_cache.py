"""The plan cache: a bounded, thread-safe least-recently-used map (torch-free,
so the CI tests without torch cover it)."""

import threading
from collections import OrderedDict

PLAN_CACHE_CAPACITY = 64
"""Plans kept at most (sparse and dense together). A plan costs microseconds
to build once its context holds the kernel module (the module is loaded once
per device and shared by every plan), so a packed variable-length loop whose
length changes every step rebuilds evicted plans cheaply; the bound keeps
such a loop from growing the cache (and the device memory dense plans hold)
without limit."""


class PlanCache:
    """Plans by key, at most ``capacity`` of them; the least recently used
    goes first."""

    def __init__(self, capacity=PLAN_CACHE_CAPACITY):
        if capacity < 1:
            raise ValueError(f"plan cache capacity: expected at least 1, got {capacity}")
        self.capacity = capacity
        self._plans = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, build):
        """The plan for ``key``, built by ``build()`` when absent. ``build``
        runs outside the lock (it may load the kernel module); when two
        threads build the same key at once, the first stored plan wins."""
        return self.get_built(key, build)[0]

    def get_built(self, key, build):
        """``(plan, built)``: :meth:`get`'s plan, and whether this call built
        it (``False`` when it was cached)."""
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                return plan, False
        plan = build()
        with self._lock:
            plan = self._plans.setdefault(key, plan)
            self._plans.move_to_end(key)
            while len(self._plans) > self.capacity:
                self._plans.popitem(last=False)
        return plan, True

    def clear(self):
        """Drops every plan."""
        with self._lock:
            self._plans.clear()

    def __len__(self):
        with self._lock:
            return len(self._plans)
