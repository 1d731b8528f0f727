import time
from collections import OrderedDict


class LRUCache:
    def __init__(self, capacity, ttl=None, clock=time.monotonic):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.ttl = ttl
        self.clock = clock
        self._data = OrderedDict()  # key -> (value, stored_at); last = most recent
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def _expired(self, stored_at):
        return self.ttl is not None and self.clock() - stored_at > self.ttl

    def put(self, key, value):
        if key not in self._data and len(self._data) >= self.capacity:
            self._data.popitem(last=True)
            self.evictions += 1
        if key in self._data:
            old_value, stored_at = self._data[key]
            self._data[key] = (value, stored_at)
        else:
            self._data[key] = (value, self.clock())

    def get(self, key, default=None):
        if key not in self._data:
            self.misses += 1
            return default
        value, stored_at = self._data[key]
        if self._expired(stored_at):
            self.misses += 1
            return default
        self.hits += 1
        return value

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)

    def stats(self):
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions}
