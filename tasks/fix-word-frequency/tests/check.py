import re, subprocess, sys, tempfile
from collections import Counter
fails = []
def ref(text, n):
    c = Counter(w for w in (x.strip("'") for x in re.findall(r"[a-z']+", text.lower())) if w)
    return "".join(f"{w} {k}\n" for w, k in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:n])
def run(text, n):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    r = subprocess.run([sys.executable, "/app/wordfreq.py", f.name, str(n)], capture_output=True, text=True, timeout=20)
    return r.stdout
cases = [
    ("Hello, hello! HELLO world.", 5),
    ("b a c b a c d", 3),
    ("one two two three three three", 2),
    ("'tis the season, 'tis. Don't don't DON'T stop '' ", 10),
    ("x", 1),
    ("Zeta alpha Alpha zeta beta gamma gamma", 4),
]
for text, n in cases:
    got, want = run(text, n), ref(text, n)
    if got != want:
        fails.append(f"input {text!r} N={n}: got {got!r} want {want!r}")
corpus = open("/tests/corpus.txt").read()
try:
    if open("/app/top10.txt").read() != ref(corpus, 10):
        fails.append("top10.txt does not match the expected top-10 of corpus.txt")
except Exception as e:
    fails.append(f"top10.txt: {e}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
