import gzip, os
D = "/var/log/myapp"
os.makedirs(D, exist_ok=True)
def gen(tag, n):
    return "".join(f"2024-06-{10 - n:02d}T{h:02d}:00:00Z {tag} request {h * 7 + n} ok\n" for h in range(24)).encode()
open(f"{D}/app.log", "wb").write(gen("live", 0))
open(f"{D}/app.log.1", "wb").write(gen("gen1", 1))
gzip.open(f"{D}/app.log.2.gz", "wb").write(gen("gen2", 2))
gzip.open(f"{D}/app.log.3.gz", "wb").write(gen("gen3", 3))
open(f"{D}/worker.log", "wb").write(b"worker line\n")
