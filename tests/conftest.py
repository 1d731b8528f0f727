"""Shared fixtures: a real Docker engine (bootstrapped if we can), tiny task folders."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import common as C  # noqa: E402


@pytest.fixture(scope="session")
def docker_ready() -> None:
    """Engine up + base image present. Without one, docker tests skip with the reason —
    except under CI=true, where a missing engine is a failure."""
    try:
        C.docker_up(log=lambda s: None)
        C.docker_client()
    except Exception as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs a Docker engine: {e}")
        pytest.skip(f"no Docker engine: {e}")


def write_task(root: Path, name: str, *, solve: str = "echo ok > /app/out.txt",
               test: str | None = None, toml: str | None = None, dockerfile: str | None = None,
               instruction: str = "Write ok to /app/out.txt.") -> Path:
    """A minimal Harbor task folder (FROM the base image, no apt layer: builds in ~1 s)."""
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "instruction.md").write_text(instruction + "\n")
    (d / "task.toml").write_text(toml if toml is not None else textwrap.dedent("""\
        version = "1.0"
        [metadata]
        category = "file-operations"
        difficulty = "easy"
        [agent]
        timeout_sec = 60.0
        [verifier]
        timeout_sec = 30.0
        [environment]
        cpus = 1
        memory = "512M"
        allow_internet = false
        """))
    (d / "environment" / "Dockerfile").write_text(
        dockerfile or f"FROM {C.BASE_IMAGE}\nWORKDIR /app\n")
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\nset -e\n{solve}\n")
    (d / "tests" / "test.sh").write_text(test if test is not None else textwrap.dedent("""\
        mkdir -p /logs/verifier
        r=0; [ "$(cat /app/out.txt 2>/dev/null)" = ok ] && r=1
        echo $r > /logs/verifier/reward.txt
        """))
    return d


@pytest.fixture
def make_task(tmp_path: Path):
    return lambda name="t", **kw: write_task(tmp_path / "tasks", name, **kw)
