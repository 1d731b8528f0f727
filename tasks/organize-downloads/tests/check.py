import os, sys
base = "/app/downloads"
fails = []
expected = {
    "pdf/report.pdf": b"%PDF-1.4 quarterly report\n",
    "jpg/Photo.JPG": b"JPEGDATA-1\n",
    "jpg/holiday.jpg": b"JPEGDATA-2\n",
    "txt/notes.txt": b"meeting notes\nbuy milk\n",
    "mp3/song.mp3": b"ID3 fake mp3\n",
    "gz/backup.tar.gz": b"tarball bytes\n",
    "csv/data.CSV": b"a,b\n1,2\n",
    "other/README": b"read me first\n",
    "other/.hidden": b"secret settings\n",
    "pdf/Invoice 2024.PDF": b"second pdf\n",
    "ini/settings.ini": b"x=1\n",
}
for rel, data in expected.items():
    p = os.path.join(base, rel)
    if not os.path.isfile(p):
        fails.append(f"missing {rel}")
    elif open(p, "rb").read() != data:
        fails.append(f"content changed: {rel}")
for gone in ["broken.zip", "partial.mp3", "empty"]:
    for root, dirs, files in os.walk(base):
        if gone in files:
            fails.append(f"empty file {gone} still present in {root}")
top = [n for n in os.listdir(base) if os.path.isfile(os.path.join(base, n))]
if sorted(top) != ["manifest.txt"]:
    fails.append(f"unexpected top-level files: {sorted(top)}")
kp = os.path.join(base, "old/keep.txt")
if not os.path.isfile(kp) or open(kp).read() != "stays where it is\n":
    fails.append("old/keep.txt was moved or changed")
mp = os.path.join(base, "manifest.txt")
if not os.path.isfile(mp):
    fails.append("manifest.txt missing")
else:
    want = "".join(l + "\n" for l in sorted(expected, key=lambda s: s.encode()))
    got = open(mp).read()
    if got != want:
        fails.append(f"manifest mismatch:\n{got!r}\nexpected\n{want!r}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
