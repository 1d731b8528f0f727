"""The suite itself: outside CI, a machine without Docker or root is told up front how many tests
will skip and why, and that count is the number that then skips; a test that needs vLLM fails without it
under CI=true."""

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


def test_a_test_that_needs_vllm_fails_under_ci_and_skips_outside_it_when_vllm_is_missing(tmp_path):
    """A real vLLM test, run where `import vllm` fails (a plugin puts None in sys.modules)."""
    (tmp_path / "novllm.py").write_text("import sys\nsys.modules['vllm'] = None  # import vllm fails\n")
    test = "tests/test_model.py::test_vllm_engine_qwen3"
    for ci, outcome in (("true", "1 error"), (None, "1 skipped")):  # error: failed in set-up
        env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONPATH": str(tmp_path)}
        env |= {"CI": ci} if ci else {}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "novllm", "-p",
                            "no:cacheprovider", test], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
        assert re.search(rf"\b{outcome}\b", r.stdout), r.stdout[-3000:]
        assert ("CI needs vLLM" if ci else "no vLLM") in r.stdout, r.stdout[-3000:]
        assert r.returncode == (1 if ci else 0), r.stdout[-3000:]
