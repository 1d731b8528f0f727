import random, subprocess, sys
from collections import OrderedDict
sys.path.insert(0, "/app/cache")
fails = []

class Ref:
    def __init__(self, cap, ttl=None, clock=None):
        self.cap, self.ttl, self.clock = cap, ttl, clock
        self.d = OrderedDict(); self.h = self.m = self.e = 0
    def exp(self, t): return self.ttl is not None and self.clock() - t >= self.ttl
    def put(self, k, v):
        if k not in self.d and len(self.d) >= self.cap:
            self.d.popitem(last=False); self.e += 1
        self.d[k] = (v, self.clock()); self.d.move_to_end(k)
    def get(self, k, default=None):
        if k not in self.d: self.m += 1; return default
        v, t = self.d[k]
        if self.exp(t): del self.d[k]; self.m += 1; return default
        self.d.move_to_end(k); self.h += 1; return v
    def contains(self, k): return k in self.d and not self.exp(self.d[k][1])
    def stats(self): return {"hits": self.h, "misses": self.m, "evictions": self.e}

try:
    from lru import LRUCache
    for seed in range(30):
        rnd = random.Random(seed)
        now = [0.0]
        cap = rnd.randint(1, 5); ttl = rnd.choice([None, 3, 5.5])
        a = LRUCache(cap, ttl=ttl, clock=lambda: now[0]); b = Ref(cap, ttl, lambda: now[0])
        for step in range(200):
            op = rnd.random(); k = rnd.randint(0, 7)
            if op < 0.4:
                v = rnd.random(); a.put(k, v); b.put(k, v); res = (None, None)
            elif op < 0.8:
                res = (a.get(k, "D"), b.get(k, "D"))
            elif op < 0.9:
                res = (k in a, b.contains(k))
            else:
                now[0] += rnd.choice([0.5, 1, 2, 3]); res = (None, None)
            if res[0] != res[1] or len(a) != len(b.d) or a.stats() != b.stats():
                fails.append(f"seed {seed} step {step}: got {res[0]!r} len={len(a)} stats={a.stats()}; want {res[1]!r} len={len(b.d)} stats={b.stats()}")
                break
except Exception as e:
    fails.append(f"error: {type(e).__name__}: {e}")
want = "False False C2 None E 2\nNone dflt 1\n{'hits': 3, 'misses': 3, 'evictions': 2}\n"
try:
    got = open("/app/demo_output.txt").read()
    if got != want:
        fails.append(f"demo_output.txt = {got!r}, want {want!r}")
except Exception as e:
    fails.append(f"demo_output.txt: {e}")
for f in fails[:10]:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
