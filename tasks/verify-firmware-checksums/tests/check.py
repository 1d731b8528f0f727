import hashlib, os, random, sys
fails = []
# regenerate the pristine images exactly as the environment's setup did
random.seed(99)
names = ["board-a.bin", "board-b.bin", "board-c.bin", "modem-v2.bin", "sensor-x1.bin", "sensor-x2.bin"]
good = {n: bytes(random.getrandbits(8) for _ in range(4096 + 512 * i)) for i, n in enumerate(names)}
try:
    if open("/app/corrupted.txt").read().split() != ["board-b.bin", "modem-v2.bin", "sensor-x2.bin"]:
        fails.append("corrupted.txt wrong: " + open("/app/corrupted.txt").read().replace("\n", " "))
except FileNotFoundError:
    fails.append("corrupted.txt missing")
try:
    if open("/app/unrepairable.txt").read().split() != ["sensor-x2.bin"]:
        fails.append("unrepairable.txt wrong")
except FileNotFoundError:
    fails.append("unrepairable.txt missing")
for n, b in good.items():
    p = f"/app/firmware/{n}"
    data = open(p, "rb").read() if os.path.exists(p) else None
    if n == "sensor-x2.bin":
        if data == good[n] or data is None: fails.append("sensor-x2.bin should remain (unrepairable) as found")
    elif data != b:
        fails.append(f"{n} not correct")
want_sums = "".join(f"{hashlib.sha256(good[n]).hexdigest()}  {n}\n" for n in good)
if open("/app/firmware/SHA256SUMS").read() != want_sums: fails.append("SHA256SUMS modified")
try:
    log = open("/app/verify.log").read()
    for n in good:
        exp = f"{n}: FAILED" if n == "sensor-x2.bin" else f"{n}: OK"
        if exp not in log.splitlines(): fails.append(f"verify.log lacks '{exp}'")
except FileNotFoundError:
    fails.append("verify.log missing")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
