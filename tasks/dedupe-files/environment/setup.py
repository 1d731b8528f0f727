import os, random
random.seed(7)
base = "/app/photos"
blobs = [bytes(random.getrandbits(8) for _ in range(200 + 37 * i)) for i in range(8)]
layout = {
    "2023/beach/IMG_0001.jpg": 0, "2023/beach/IMG_0002.jpg": 1, "2023/beach/IMG_0002 (copy).jpg": 1,
    "2023/city/DSC_100.jpg": 2, "2024/export/beach_best.jpg": 0, "2024/export/city.jpg": 2,
    "2024/export/city_final.jpg": 2, "2024/raw/r1.raw": 3, "2024/raw/r2.raw": 4,
    "backup/IMG_0001.jpg": 0, "backup/r2.raw": 4, "misc/notes.txt": 5, "misc/unique.png": 6,
    "misc/another.png": 7, "a_first/zz.jpg": 1,
}
for rel, b in layout.items():
    p = os.path.join(base, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    open(p, "wb").write(blobs[b])
