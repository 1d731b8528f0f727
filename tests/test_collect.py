"""Stage 03: failure states from real rollouts — records, kept snapshots that fork into the
failed attempt's state, resume, and --gc."""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys

import batch_rollouts as R
import pytest
from conftest import ROOT

import common as C

M = importlib.import_module("03_collect_failures")
pytestmark = [pytest.mark.usefixtures("docker_ready"), pytest.mark.slow]
RECORD_KEYS = {f.name for f in dataclasses.fields(C.FailureState)}


def images_of(records: list[dict]) -> list[str]:
    return [r["snapshot"] for r in records if M.snapshot_exists(r["snapshot"])]


class ScriptedPolicy:
    """An engine that leaves work behind: one command that changes files, cwd and env, then it
    declares success. Verification then fails (the task wants 'ok')."""

    COMMAND = "mkdir -p /app/work && cd /app/work && export STAGE=half && echo partial > /app/out.txt"

    def __init__(self):
        self.tokenizer = C.make_tiny_tokenizer()

    def generate(self, prompts, sampling, seeds=None):
        gens = []
        for p in prompts:
            seen = self.tokenizer.decode(p)
            text = ("All done." if "<tool_response>" in seen else
                    f"<tool_call>\n<function=bash>\n<parameter=command>\n{self.COMMAND}\n</parameter>\n"
                    "</function>\n</tool_call>")
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            gens.append(C.Generation(ids, [0.0] * len(ids), "stop"))
        return gens


def test_failure_snapshots_fork_into_the_failed_state_and_gc(make_task, tmp_path):
    make_task("one")
    make_task("two")
    out = tmp_path / "failures"
    cfg = C.parse_config(M.Config, ["--tasks", str(tmp_path / "tasks"), "--model", "scripted",
                                    "--out", str(out), "--attempts", "2", "--max-turns", "4"])
    summary = M.collect(cfg, engine=ScriptedPolicy())
    records = C.read_jsonl(out / "failures.jsonl")
    try:
        assert summary["n_attempts"] == 4 and summary["n_failures"] == 4 and len(records) == 4
        assert summary["by_category"] == {"gave_up_early": 4}
        for r in records:
            assert set(r) == RECORD_KEYS and r["policy"] == "scripted" and r["category"] == "gave_up_early"
            call = r["messages"][2]["tool_calls"][0]["function"]
            assert call["arguments"]["command"] == ScriptedPolicy.COMMAND
            assert r["messages"][-1] == {"role": "assistant", "content": "All done."}
            assert C.FailureState(**r).ids == r["ids"] and len(r["ids"]) > 100
        assert len(images_of(records)) == 4
        task = C.load_task(tmp_path / "tasks" / records[0]["task"])
        forks = R.fork(records[0]["snapshot"], task, 2)
        try:
            for env in forks:  # files, cwd and env of the failed attempt are all still there
                assert env.bash("cat /app/out.txt; pwd; echo $STAGE").output == "partial\n/app/work\nhalf\n"
                assert env.bash("ls /tests").exit_code != 0  # snapshotted before the verifier ran
        finally:
            for env in forks:
                env.close()
        assert not C.docker_client().containers.list(all=True, filters={"label": f"reterm.run={C.RUN_ID}"})

        again = M.collect(cfg, engine=ScriptedPolicy())  # resume: nothing left to run
        assert again["n_attempts"] == 4 and len(C.read_jsonl(out / "failures.jsonl")) == 4

        # an orphan image (its record deleted) and a record whose image is gone
        (out / "failures.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[1:]))
        C.remove_image(records[1]["snapshot"])
        assert M.main(["--out", str(out), "--gc"]) == {"removed_images": 1, "dropped_records": 1}
        left = C.read_jsonl(out / "failures.jsonl")
        assert [r["id"] for r in left] == [r["id"] for r in records[2:]]
        assert images_of(records) == [r["snapshot"] for r in records[2:]]
    finally:
        for r in records:
            C.remove_image(r["snapshot"])


def test_collect_cli_with_the_tiny_model(tmp_path):
    model = C.make_tiny_model(tmp_path / "tiny", arch="qwen3")
    try:
        import vllm  # noqa: F401

        engine = "vllm"
    except ImportError:
        engine = "hf"
    out = tmp_path / "out"
    cmd = [sys.executable, "03_collect_failures.py", "--tasks", "tasks", "--task-filter",
           "^(csv-sales-summary|fix-lru-cache)$", "--model", str(model), "--out", str(out),
           "--engine", engine, "--attempts", "2", "--max-turns", "2", "--max-tokens", "24",
           "--max-context", "8192", "--concurrency", "4"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    records = C.read_jsonl(out / "failures.jsonl")
    try:
        summary = json.loads((out / "summary.json").read_text())
        assert summary["n_attempts"] == 4 and summary["n_success"] + len(records) == 4
        assert records and all(set(x) == RECORD_KEYS for x in records)
        assert all(x["policy"] == str(model.resolve()) and x["ids"] for x in records)
        assert len(images_of(records)) == len(records)
        run_id = (out / "runs.txt").read_text().split()[0]
        assert not C.docker_client().containers.list(all=True, filters={"label": f"reterm.run={run_id}"})
        assert "failure states in" in r.stdout and "category" in r.stdout
    finally:
        for x in records:
            C.remove_image(x["snapshot"])
