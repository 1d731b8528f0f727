#!/bin/bash
set -euo pipefail

# step: evict the least recently used entry (front of the OrderedDict), and expire at age >= ttl
sed -i 's/self._data.popitem(last=True)/self._data.popitem(last=False)/; s/self.clock() - stored_at > self.ttl/self.clock() - stored_at >= self.ttl/' /app/cache/lru.py

# step: on put of an existing key, reset its timestamp and move it to most-recent
python3 - <<'PY'
p = "/app/cache/lru.py"; s = open(p).read()
s = s.replace("""        if key in self._data:
            old_value, stored_at = self._data[key]
            self._data[key] = (value, stored_at)
        else:
            self._data[key] = (value, self.clock())
""", """        self._data[key] = (value, self.clock())
        self._data.move_to_end(key)
""")
open(p, "w").write(s)
PY

# step: get() must drop expired entries and refresh recency on hits; `in` ignores expired keys
python3 - <<'PY'
p = "/app/cache/lru.py"; s = open(p).read()
s = s.replace("""        if self._expired(stored_at):
            self.misses += 1
            return default
        self.hits += 1
        return value
""", """        if self._expired(stored_at):
            del self._data[key]
            self.misses += 1
            return default
        self._data.move_to_end(key)
        self.hits += 1
        return value
""")
s = s.replace("""    def __contains__(self, key):
        return key in self._data
""", """    def __contains__(self, key):
        return key in self._data and not self._expired(self._data[key][1])
""")
open(p, "w").write(s)
PY
cat /app/cache/lru.py

# step: run the demo and save its output
python3 /app/cache/demo.py > /app/demo_output.txt
cat /app/demo_output.txt
