"""The suite itself: outside CI, a machine without Docker or root is told up front how many tests
will skip and why, and that count is the number that then skips."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT


def test_a_machine_without_docker_or_root_is_told_up_front_how_many_tests_skip(tmp_path):
    (tmp_path / "notroot.py").write_text("import os\nos.geteuid = lambda: 1000  # a user, not root\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env |= {"PYTHONPATH": str(tmp_path), "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "notroot", "-p", "no:cacheprovider",
                        "tests/test_env.py", "tests/test_readme.py"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    lines = r.stdout.splitlines()
    notes = [i for i, ln in enumerate(lines) if ln.startswith("NOTE:")]
    assert len(notes) == 1, r.stdout[-3000:]
    note = re.fullmatch(r"NOTE: (\d+) of (\d+) tests will skip: no Docker engine answers and this is not "
                        r"root on Debian \(start dockerd or set DOCKER_HOST\)\. CI=true makes them fail\.",
                        lines[notes[0]])
    assert note, lines[notes[0]]
    assert not any(re.match(r"^[.sF]+\s", ln) for ln in lines[: notes[0]])  # before any test ran
    summary = re.search(r"(\d+) passed, (\d+) skipped", r.stdout)
    assert r.returncode == 0 and summary, r.stdout[-3000:]
    passed, skipped = map(int, summary.groups())
    assert (int(note[1]), int(note[2])) == (skipped, passed + skipped) and skipped > 0
