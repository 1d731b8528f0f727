"""The README stays short, and every relative link in the project's markdown leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "bench").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def anchors(md: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped but '-' and '_', spaces as '-'."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", md.read_text(), flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_readme_fits_a_few_screens():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 420


def test_every_relative_link_and_anchor_exists():
    bad = []
    for md in DOCS:
        for target in LINK.findall(md.read_text()):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                bad.append(f"{md.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{md.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, bad
