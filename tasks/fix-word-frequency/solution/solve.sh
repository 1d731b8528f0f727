#!/bin/bash
set -euo pipefail

# step: lower-case the text before extracting words
python3 - <<'PY'
p = "/app/wordfreq.py"; s = open(p).read()
s = s.replace('re.findall(r"[A-Za-z\']+", text)', 're.findall(r"[A-Za-z\']+", text.lower())')
open(p, "w").write(s)
PY

# step: break count ties alphabetically
sed -i 's/key=lambda kv: kv\[1\], reverse=True)/key=lambda kv: (-kv[1], kv[0]))/' /app/wordfreq.py

# step: return N words, not N-1
sed -i 's/return ranked\[: n - 1\]/return ranked[:n]/' /app/wordfreq.py
cat /app/wordfreq.py

# step: produce /app/top10.txt from the corpus
python3 /app/wordfreq.py /app/corpus.txt 10 > /app/top10.txt
cat /app/top10.txt
