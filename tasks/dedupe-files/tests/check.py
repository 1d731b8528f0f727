import hashlib, json, os, random, sys
random.seed(7)
blobs = [bytes(random.getrandbits(8) for _ in range(200 + 37 * i)) for i in range(8)]
layout = {
    "2023/beach/IMG_0001.jpg": 0, "2023/beach/IMG_0002.jpg": 1, "2023/beach/IMG_0002 (copy).jpg": 1,
    "2023/city/DSC_100.jpg": 2, "2024/export/beach_best.jpg": 0, "2024/export/city.jpg": 2,
    "2024/export/city_final.jpg": 2, "2024/raw/r1.raw": 3, "2024/raw/r2.raw": 4,
    "backup/IMG_0001.jpg": 0, "backup/r2.raw": 4, "misc/notes.txt": 5, "misc/unique.png": 6,
    "misc/another.png": 7, "a_first/zz.jpg": 1,
}
B = "/app/photos/"
fails = []
by = {}
for rel, b in layout.items():
    by.setdefault(b, []).append(B + rel)
groups = []
for b, ps in by.items():
    ps.sort(key=lambda s: s.encode())
    if len(ps) > 1:
        groups.append({"kept": ps[0], "removed": ps[1:]})
groups.sort(key=lambda g: g["kept"].encode())
saved = sum(len(blobs[layout[p[len(B):]]]) for g in groups for p in g["removed"])
try:
    got = json.load(open("/app/dupes.json"))
    if got != groups:
        fails.append(f"dupes.json wrong: {got}")
except Exception as e:
    fails.append(f"dupes.json unreadable: {e}")
try:
    if open("/app/bytes_saved.txt").read().strip() != str(saved):
        fails.append("bytes_saved.txt wrong")
except Exception as e:
    fails.append(f"bytes_saved.txt: {e}")
removed = {p: g["kept"] for g in groups for p in g["removed"]}
for rel, b in layout.items():
    p = B + rel
    if p in removed:
        if not os.path.islink(p):
            fails.append(f"{p} should be a symlink")
        elif os.readlink(p) != removed[p]:
            fails.append(f"{p} -> {os.readlink(p)} (want {removed[p]})")
    else:
        if os.path.islink(p) or not os.path.isfile(p):
            fails.append(f"{p} should be a regular file")
    if not os.path.exists(p) or open(p, "rb").read() != blobs[b]:
        fails.append(f"{p} content wrong or unreadable")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
