"""Inputs a user (or a crashed run) can hand the stages that must end in one line naming the file
and the problem, never a traceback: each found by a round-3 probe."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, write_task

import common as C

sft = importlib.import_module("02_sft")
grpo = importlib.import_module("04_reterm_grpo")


@pytest.mark.parametrize("flag", [["--timeout-multiplier", "1e9"], ["--timeout-multiplier", "nan"],
                                  ["--concurrency", "-1"], ["--trials", "99999999999"], ["--top-p", "inf"]])
def test_numeric_flags_are_bounded_at_parse_time(tmp_path, flag):
    argv = [sys.executable, "05_eval_tb2.py", "--tasks", "tasks", "--out", str(tmp_path / "o"), *flag]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith(f"05_eval_tb2.py: error: argument {flag[0]}: ")
    assert not (tmp_path / "o").exists()


def test_task_files_that_are_not_what_they_say(tmp_path):
    bad_meta = write_task(tmp_path, "meta", toml="[agent]\ntimeout_sec = 60\n")
    (bad_meta / "task.toml").write_text("metadata = 5\n")
    with pytest.raises(C.TaskError, match=r"task.toml: metadata must be a table"):
        C.load_task(bad_meta)
    latin = write_task(tmp_path, "latin")
    (latin / "task.toml").write_bytes("[metadata]\ncategory = \"caf\xe9\"\n".encode("latin-1"))
    with pytest.raises(C.TaskError, match=r"task.toml: not UTF-8 text"):
        C.load_task(latin)
    (latin / "task.toml").write_text("")
    (latin / "instruction.md").write_bytes(b"caf\xe9\n")
    with pytest.raises(C.TaskError, match=r"instruction.md: not UTF-8 text"):
        C.load_task(latin)
    name = os.fsdecode(b"bad-\xff-name")  # a folder name that is not UTF-8 (a surrogate escape)
    write_task(tmp_path / "corpus", name)
    with pytest.raises(C.TaskError, match="name is not valid UTF-8"):
        C.load_tasks(tmp_path / "corpus")


def test_sft_data_nested_too_deep(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    args = '{"command": "ls", "x": ' + deep + "}"
    call = {"type": "function", "function": {"name": "bash", "arguments": args}}
    row = {"messages": [{"role": "user", "content": "task"}, {"role": "assistant", "content": "",
                                                               "tool_calls": [call]}],
           "train_from_message_index": 1}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(C.DataError, match=r"rows.jsonl:1.*not valid JSON \(maximum recursion depth"):
        sft.load_rows(str(path), False)
    path.write_text(json.dumps({"messages": []}) + "\n" + deep + "\n" + json.dumps({"messages": []}) + "\n")
    with pytest.raises(C.DataError, match=r"rows.jsonl:2: JSON nested too deep"):
        sft.load_rows(str(path), False)


def test_failure_rows_and_scaffolds_that_are_not(tmp_path):
    path = tmp_path / "failures.jsonl"
    row = {"id": "a", "task": "t", "snapshot": "reterm-snap/t:1", "messages": [], "ids": [], "category": "x"}
    torn = {k: v for k, v in row.items() if k != "snapshot"}
    path.write_text(json.dumps(row) + "\n" + json.dumps(torn) + "\n")
    with pytest.raises(C.DataError, match=r"failures.jsonl: row 2 is not a failure record \(no snapshot\)"):
        grpo.load_failures(path)
    model = tmp_path / "m"
    model.mkdir()
    for text, why in (("{not json", "not a scaffold"), ("[1, 2]", "got a list"), ('"x"', "got a str")):
        (model / "scaffold.json").write_text(text)
        with pytest.raises(C.DataError, match=why):
            C.load_scaffold(model, log=lambda s: None)


def test_a_torn_checkpoint_is_a_one_line_error(tmp_path):
    import torch

    model = C.load_model(C.make_tiny_model(tmp_path / "m", arch="qwen3"))
    opt = torch.optim.AdamW(model.parameters())
    C.save_checkpoint(tmp_path / "ckpt", model, opt, {"step": 1})
    meta = tmp_path / "ckpt" / ".metadata"
    meta.write_bytes(meta.read_bytes()[:100])
    with pytest.raises(C.DataError, match=r"ckpt: cannot resume from this checkpoint"):
        C.load_checkpoint(tmp_path / "ckpt", model, opt)


@pytest.mark.usefixtures("docker_ready")
def test_reap_survives_images_that_vanish_and_removes_networks(monkeypatch):
    """Another thread removes a snapshot while reap lists them (docker-py's high-level list fetches
    each image afterwards): reap still removes the run's containers, snapshots and networks."""
    import docker

    client, run = C.docker_client(), "reap-race-test"
    labels = {C.LABEL: "1", "reterm.run": run, "reterm.kind": "snapshot", "reterm.keep": "0"}
    c = client.containers.run(C.BASE_IMAGE, ["true"], labels={C.LABEL: "1", "reterm.run": run},
                              network_mode="none", detach=True)
    c.wait()
    c.commit(repository="reterm-snap/reap-race", tag="1", changes=["LABEL " + " ".join(
        f"{k}={v}" for k, v in labels.items())])
    net = client.networks.create(f"rtn-{run}", driver="bridge", labels={C.LABEL: "1", "reterm.run": run})

    def vanished(*a, **k):
        raise docker.errors.ImageNotFound("removed meanwhile")
    monkeypatch.setattr(docker.models.images.ImageCollection, "get", vanished)
    try:
        C.reap(run)
        assert not client.api.networks(filters={"label": [f"reterm.run={run}"]})
        assert not client.api.images(filters={"label": [f"reterm.run={run}"]})
        assert not client.api.containers(all=True, filters={"label": [f"reterm.run={run}"]})
    finally:
        monkeypatch.undo()
        C.remove_network(net.id)
        C.remove_image("reterm-snap/reap-race:1")
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(c.id).remove(force=True)


def test_rl_rewards_are_verified_in_a_fresh_fork_by_default(tmp_path):
    base = ["--model", str(tmp_path), "--out", str(tmp_path / "o")]  # no scaffold.json: the default one
    assert grpo.rollout_settings(C.parse_config(grpo.Config, base))[1].verify_fresh is True
    off = C.parse_config(grpo.Config, [*base, "--no-verify-fresh"])  # in place: an explicit choice
    assert grpo.rollout_settings(off)[1].verify_fresh is False
