"""Task loading: the Harbor / TB2 format, legacy fields, and one clear error per bad task."""

from __future__ import annotations

import pytest
from conftest import ROOT

import common as C


def test_bundled_tasks_load_and_cover_the_benchmark():
    tasks = C.load_tasks(ROOT / "tasks")
    assert len(tasks) >= 24
    assert [t.name for t in tasks] == sorted(t.name for t in tasks)
    assert len({t.category for t in tasks}) >= 6
    assert {t.difficulty for t in tasks} >= {"easy", "medium", "hard"}
    first_runs = set()
    for t in tasks:
        lines = (t.env_dir / "Dockerfile").read_text().splitlines()
        assert lines[0] == f"FROM {C.BASE_IMAGE}"
        first_runs.add(next(x for x in lines if x.startswith("RUN")))
        solve = (t.solution_dir / "solve.sh").read_text()
        assert solve.count("# step:") >= 2, f"{t.name}: solve.sh needs >= 2 marked steps"
    assert len(first_runs) == 1, "every bundled Dockerfile shares one first RUN line (layer cache)"


def test_tb2_legacy_fields_defaults_and_unknown_keys(make_task):
    d = make_task(toml="""
version = "2.0"
weird_top = 1
[metadata]
difficulty = "hard"
category = "security"
tags = ["a"]
author_email = "x@y"
[agent]
timeout_sec = 900.0
[verifier]
timeout_sec = 120.0
[environment]
docker_image = "alexgshaw/some-task:20251031"
memory = "2G"
storage = "10G"
cpus = 2
allow_internet = true
""")
    t = C.load_task(d)
    assert (t.memory_mb, t.storage_mb, t.cpus, t.version) == (2048, 10240, 2.0, "2.0")
    assert t.docker_image == "alexgshaw/some-task:20251031" and t.allow_internet
    assert (t.agent_timeout_sec, t.verifier_timeout_sec) == (900.0, 120.0)
    assert t.extra == {"weird_top": 1, "metadata": {"author_email": "x@y"}}
    d2 = make_task("bare", toml="")
    t2 = C.load_task(d2)
    got = (t2.category, t2.memory_mb, t2.agent_timeout_sec, t2.workdir)
    assert got == ("uncategorized", 2048, 600.0, None)
    d3 = make_task("mb", toml="[environment]\nmemory_mb = 4096\n")
    assert C.load_task(d3).memory_mb == 4096


@pytest.mark.parametrize("breakage, message", [
    (lambda d: (d / "instruction.md").unlink(), "instruction.md: missing"),
    (lambda d: (d / "instruction.md").write_text("  \n"), "instruction.md: empty"),
    (lambda d: (d / "task.toml").write_text("[metadata\n"), "task.toml: invalid TOML"),
    (lambda d: (d / "environment" / "Dockerfile").unlink(), "Dockerfile: missing, and task.toml names no"),
    (lambda d: (d / "tests" / "test.sh").unlink(), "test.sh: missing"),
    (lambda d: (d / "task.toml").write_text('[environment]\nmemory = "lots"\n'), "cannot parse size 'lots'"),
])
def test_bad_task_gives_one_clear_error(make_task, breakage, message):
    d = make_task()
    breakage(d)
    with pytest.raises(C.TaskError, match=message) as e:
        C.load_task(d)
    assert str(d) in str(e.value)


def test_compose_tasks_are_refused_clearly(make_task):
    d = make_task()
    (d / "environment" / "Dockerfile").unlink()
    (d / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(C.TaskError, match="multi-container tasks are not supported"):
        C.load_task(d)


def test_load_tasks_reports_every_bad_task(make_task, tmp_path):
    make_task("good")
    (make_task("bad-a") / "instruction.md").unlink()
    (make_task("bad-b") / "tests" / "test.sh").unlink()
    with pytest.raises(C.TaskError) as e:
        C.load_tasks(tmp_path / "tasks")
    msg = str(e.value)
    assert "2 bad task(s)" in msg and "bad-a" in msg and "bad-b" in msg and "good" not in msg
    assert [t.name for t in C.load_tasks(tmp_path / "tasks", filter="^good$")] == ["good"]
    with pytest.raises(C.TaskError, match="does not exist"):
        C.load_tasks(tmp_path / "nope")
