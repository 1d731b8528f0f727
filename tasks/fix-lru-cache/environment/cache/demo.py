import sys
sys.path.insert(0, "/app/cache")
from lru import LRUCache

now = [0.0]
c = LRUCache(3, ttl=10, clock=lambda: now[0])
for k in "abc":
    c.put(k, k.upper())
c.get("a")
c.put("d", "D")            # evicts b (least recently used)
now[0] = 4
c.put("c", "C2")           # replace: c becomes most recent, expiry reset
now[0] = 5
c.put("e", "E")            # evicts a
now[0] = 12
print("b" in c, "a" in c, c.get("c"), c.get("d"), c.get("e"), len(c))
now[0] = 15
print(c.get("e"), c.get("zzz", "dflt"), len(c))
print(c.stats())
