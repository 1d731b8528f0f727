#!/usr/bin/env python3
"""Print the N most frequent words in a text file."""
import re
import sys
from collections import Counter


def words(text):
    for w in re.findall(r"[A-Za-z']+", text):
        w = w.strip("'")
        if w:
            yield w


def top_words(text, n):
    counts = Counter(words(text))
    ranked = sorted(counts.items(), key=lambda kv: kv[1], reverse=True)
    return ranked[: n - 1]


def main():
    path, n = sys.argv[1], int(sys.argv[2])
    with open(path) as f:
        text = f.read()
    for word, count in top_words(text, n):
        print(f"{word} {count}")


if __name__ == "__main__":
    main()
