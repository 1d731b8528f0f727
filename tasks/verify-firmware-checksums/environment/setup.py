import hashlib, os, random
random.seed(99)
F, M = "/app/firmware", "/app/mirror"
os.makedirs(F, exist_ok=True); os.makedirs(M, exist_ok=True)
names = ["board-a.bin", "board-b.bin", "board-c.bin", "modem-v2.bin", "sensor-x1.bin", "sensor-x2.bin"]
good = {n: bytes(random.getrandbits(8) for _ in range(4096 + 512 * i)) for i, n in enumerate(names)}
with open(f"{F}/SHA256SUMS", "w") as f:
    for n in names:
        f.write(f"{hashlib.sha256(good[n]).hexdigest()}  {n}\n")
def flip(b, i):
    b = bytearray(b); b[i] ^= 0x40; return bytes(b)
disk = dict(good)
disk["board-b.bin"] = flip(good["board-b.bin"], 100)
disk["modem-v2.bin"] = good["modem-v2.bin"][:-7]
disk["sensor-x2.bin"] = flip(good["sensor-x2.bin"], 4000)
for n, b in disk.items():
    open(f"{F}/{n}", "wb").write(b)
mirror = dict(good)
mirror["sensor-x2.bin"] = flip(good["sensor-x2.bin"], 17)   # mirror copy bad too
mirror["board-a.bin"] = flip(good["board-a.bin"], 5)        # bad mirror of a good image (must not be used)
for n, b in mirror.items():
    open(f"{M}/{n}", "wb").write(b)
