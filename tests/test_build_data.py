"""Stage 01: oracle recovery demonstrations verified in real Docker, resume, the OpenAI-compatible
teacher against a scripted local server, and import of released ReTerm-10K rows."""

from __future__ import annotations

import dataclasses
import http.server
import importlib
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import batch_rollouts as R
import pytest
from conftest import ROOT

import common as C

B = importlib.import_module("01_build_data")
KEYS = {"id", "task_id", "messages", "train_from_message_index", "target_attempt_index", "trajectory_sha256"}


@pytest.fixture(scope="session")
def oracle_data(docker_ready, tmp_path_factory):
    """One oracle build over every bundled task (one verified fault each), through the CLI."""
    out = tmp_path_factory.mktemp("oracle") / "data.jsonl"
    subprocess.run([sys.executable, "01_build_data.py", "--tasks", "tasks", "--teacher", "oracle",
                    "--out", str(out), "--faults-per-task", "1", "--max-tries-per-task", "4",
                    "--concurrency", "4"], cwd=ROOT, check=True, timeout=600)
    return out, C.read_jsonl(out)


@pytest.mark.slow
def test_oracle_rows_cover_tasks_and_follow_the_schema(oracle_data):
    out, rows = oracle_data
    tasks = C.load_tasks(ROOT / "tasks")
    covered = {r["task_id"] for r in rows}
    assert len(covered) >= 0.9 * len(tasks), sorted({t.name for t in tasks} - covered)
    by_name = {t.name: t for t in tasks}
    for r in rows:
        assert KEYS <= set(r) and r["target_attempt_index"] == 2
        assert r["trajectory_sha256"] == B.trajectory_sha256(r["messages"])
        assert r["id"] == f"{r['task_id']}:{r['trajectory_sha256'][:16]}"
        msgs, tfi = r["messages"], r["train_from_message_index"]
        task = by_name[r["task_id"]]
        assert msgs[:2] == C.initial_messages(task.instruction)
        # context = failed attempt + the recovery message; then the recovery, assistant first
        assert msgs[tfi - 1] == C.recovery_message(task.instruction)
        assert msgs[tfi - 2]["role"] == "assistant" and not msgs[tfi - 2].get("tool_calls")
        assert msgs[tfi]["role"] == "assistant" and msgs[tfi]["tool_calls"]
        assert msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls")
        assert sum(m["role"] == "user" for m in msgs) == 2
        for m, nxt in zip(msgs, msgs[1:], strict=False):  # each tool call gets its observation
            if m.get("tool_calls"):
                assert nxt["role"] == "tool" and "[exit code: " in nxt["content"]
        trace = C.tokenize_messages(C.make_tiny_tokenizer(), msgs, tfi)
        assert 0 < sum(trace.mask) < len(trace)
    stats = json.loads(out.with_name(out.name + ".stats.json").read_text())
    assert stats["rows"] == len(rows) and stats["tasks_covered"] == len(covered)
    assert sum(stats["by_error_category"].values()) == len(rows)


@pytest.mark.slow
def test_recovery_commands_replayed_in_a_fork_of_a_fresh_failure_pass(oracle_data):
    _, rows = oracle_data
    row = next(r for r in rows if r["meta"]["fault_kind"] != "stop")
    task = C.load_task(ROOT / "tasks" / row["task_id"])
    tfi = row["train_from_message_index"]
    with C.env_session():
        with C.start_env(task) as env:
            for cmd in B.commands_of(row["messages"][:tfi]):
                env.bash(cmd)
            snap = env.snapshot()
            assert env.verify().reward < 1.0
        with R.fork(snap, task, 1)[0] as env:
            for cmd in B.commands_of(row["messages"][tfi:]):
                env.bash(cmd)
            assert env.verify().reward == 1.0


@pytest.mark.slow
def test_resume_keeps_rows_and_adds_only_new_faults(oracle_data, tmp_path):
    _, rows = oracle_data
    name = rows[0]["task_id"]
    out = tmp_path / "d.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows if r["task_id"] == name))
    argv = ["--tasks", str(ROOT / "tasks"), "--task-filter", f"^{name}$", "--out", str(out),
            "--concurrency", "1"]
    B.main(argv + ["--faults-per-task", "1"])  # already has its row: nothing is redone
    assert C.read_jsonl(out) == [r for r in rows if r["task_id"] == name]
    B.main(argv + ["--faults-per-task", "2"])
    new = C.read_jsonl(out)
    assert new[0] == rows[[r["task_id"] for r in rows].index(name)] and len(new) == 2
    assert new[0]["meta"]["fault"] != new[1]["meta"]["fault"]


def test_split_steps_and_faults():
    script = "#!/bin/bash\nset -e\n\n# step: make dir\nmkdir -p /app/out\n# step: write\n" \
             "python3 - <<'PY'\nimport os\nPY\necho 5 > /app/out/n.txt\n"
    steps = B.split_steps(script)
    assert [d for d, _ in steps] == ["make dir", "write"]
    assert steps[1][1].startswith("python3 - <<'PY'") and steps[1][1].endswith("echo 5 > /app/out/n.txt")
    faults = B.candidate_faults(steps, __import__("random").Random(0))
    kinds = [f.kind for f in faults]
    assert set(kinds[:5]) == {"drop", "stop", "typo", "path", "value"}
    assert len({f.key for f in faults}) == len(faults)
    typos = [f for f in faults if f.kind == "typo"]
    assert {f.good for f in typos} == {"mkdir", "python3"}  # never a word inside the heredoc
    assert all(f.commands != [c for _, c in steps] for f in faults)


@pytest.mark.slow
def test_input_fault_reads_a_sibling_file_and_its_recovery_verifies(docker_ready, tmp_path):
    """The `input` fault: a step reads another existing file of the same folder (the mix-up a policy
    that copies the wrong argument makes); the oracle's recovery redoes the step on the right one."""
    sys.path.insert(0, str(ROOT / "bench"))
    import microtasks

    name = microtasks.write_task(tmp_path, "copy", "green", "elk", "644")
    task = C.load_task(tmp_path / name)
    steps = B.split_steps((task.solution_dir / "solve.sh").read_text())
    scaffold = C.load_scaffold(None)  # the prompts and timeouts main() fills in
    cfg = B.Config(tasks=str(tmp_path), command_timeout=30.0, system_prompt=scaffold.system_prompt,
                   recovery_prompt=scaffold.recovery_prompt)
    with C.env_session():
        siblings = B.input_siblings(cfg, task, steps)
        # the input has its 7 siblings; the output does not exist yet, so it has none
        assert set(siblings) == {"/app/data/green.txt"}
        assert sorted(siblings["/app/data/green.txt"]) == sorted(
            f"/app/data/{n}.txt" for n in microtasks.NAMES if n != "green")
        fault = next(f for f in B.candidate_faults(steps, __import__("random").Random(0), siblings)
                     if f.kind == "input")
        assert fault.good == "/app/data/green.txt" and fault.bad in siblings[fault.good]
        assert fault.commands[1] == f"cp {fault.bad} /app/out/elk.txt"
        row, outcome = B.oracle_row(cfg, task, steps, fault)
    assert outcome == "row" and row["meta"]["fault_kind"] == "input"
    first = row["messages"][: row["train_from_message_index"]]
    wrong = Path(fault.bad).stem
    assert f"Next: copy {wrong} to elk." in [m["content"] for m in first]  # the thought shares the mix-up
    recovery = B.commands_of(row["messages"][row["train_from_message_index"]:])
    assert recovery[-1] == "cp /app/data/green.txt /app/out/elk.txt"
    diagnosis = row["messages"][row["train_from_message_index"] + 2]["content"]
    assert f"read the wrong file {fault.bad} instead of {fault.good}" in diagnosis


# ── openai teacher against a scripted local server ──────────────────────────


class Scripted(http.server.BaseHTTPRequestHandler):
    """Chat-completions stand-in: first attempt writes the wrong content, the recovery (after
    the FAILED message) inspects and fixes it. The first request of all answers 503."""

    calls = 0

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Scripted.calls += 1
        if Scripted.calls == 1:
            self.send_response(503)
            self.end_headers()
            return
        msgs = body["messages"]
        assert body["tools"][0]["function"]["name"] == "bash"
        recovering = any("FAILED" in (m.get("content") or "") for m in msgs if m["role"] == "user")
        since = [m for m in msgs[max(i for i, m in enumerate(msgs) if m["role"] == "user"):]
                 if m["role"] == "assistant"]
        plan = ["cat /app/out.txt", "echo ok > /app/out.txt"] if recovering else ["echo nope > /app/out.txt"]
        if len(since) < len(plan):
            call = {"id": "c1", "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": plan[len(since)]})}}
            msg = {"role": "assistant", "content": "Working on it.", "tool_calls": [call]}
        else:
            msg = {"role": "assistant", "content": "Done."}
        data = json.dumps({"choices": [{"message": msg}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.mark.slow
def test_openai_teacher_with_a_local_server(docker_ready, make_task, tmp_path):
    task_dir = make_task("api")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = tmp_path / "api.jsonl"
    kept = B.convert_row(released_row(9))  # a row already there must survive the run
    out.write_text(json.dumps(kept) + "\n")
    try:
        stats = B.main(["--tasks", str(task_dir.parent), "--teacher", "openai", "--out", str(out),
                        "--base-url", f"http://127.0.0.1:{server.server_port}/v1", "--api-model", "m",
                        "--attempts", "1", "--http-retries", "2"])
    finally:
        server.shutdown()
    rows = C.read_jsonl(out)
    assert rows[0] == kept and len(rows) == 2 and stats["rows"] == 2
    row = rows[1]
    tfi = row["train_from_message_index"]
    assert row["messages"][tfi - 1]["content"].startswith("Your previous attempt")
    assert B.commands_of(row["messages"][:tfi]) == ["echo nope > /app/out.txt"]
    assert B.commands_of(row["messages"][tfi:]) == ["cat /app/out.txt", "echo ok > /app/out.txt"]
    assert "nope" in row["messages"][tfi + 1]["content"]  # the recovery saw the un-reset state


class ScriptedEngine:
    """A local 'model' for the policy teacher: fails the task, then repairs it after the
    recovery message. Same interface as the engines (generate over token-id prompts)."""

    def __init__(self):
        self.tokenizer = C.make_tiny_tokenizer()

    def generate(self, prompts, sampling, seeds=None):
        gens = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            seg = text.split("Your previous attempt at this task FAILED")
            plan = (["echo nope > /app/out.txt"] if len(seg) == 1
                    else ["cat /app/out.txt", "echo ok > /app/out.txt"])
            n = seg[-1].count("<tool_response>")
            out = "Done." if n >= len(plan) else (
                f"Step {n}.\n\n<tool_call>\n<function=bash>\n<parameter=command>\n{plan[n]}\n"
                "</parameter>\n</function>\n</tool_call>")
            ids = self.tokenizer.encode(out, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            gens.append(C.Generation(ids, [0.0] * len(ids), "stop"))
        return gens


@pytest.mark.slow
def test_policy_teacher_recovers_student_failures(docker_ready, make_task, tmp_path, monkeypatch):
    task_dir = make_task("pol")
    monkeypatch.setattr(C, "make_engine", lambda kind, path, **kw: ScriptedEngine())
    out = tmp_path / "pol.jsonl"
    tok = C.make_tiny_model(tmp_path / "tiny", arch="qwen3")  # for the token-length stats
    stats = B.main(["--tasks", str(task_dir.parent), "--teacher", "policy", "--model", "scripted",
                    "--out", str(out), "--attempts", "2", "--max-turns", "5", "--tokenizer", str(tok)])
    rows = C.read_jsonl(out)
    # both attempts fail and are recovered, identically: the duplicate is dropped
    assert stats["rows"] == len(rows) == 1 and stats["by_error_category"] == {"gave_up_early": 1}
    for row in rows:
        tfi = row["train_from_message_index"]
        assert row["messages"][tfi - 1] == C.recovery_message(C.load_task(task_dir).instruction)
        assert B.commands_of(row["messages"][:tfi]) == ["echo nope > /app/out.txt"]
        assert B.commands_of(row["messages"][tfi:]) == ["cat /app/out.txt", "echo ok > /app/out.txt"]
        # attempts finish in any order: whichever identical recovery was verified first is kept
        assert row["meta"]["teacher"] == "scripted" and row["meta"]["fault"] in ("attempt0", "attempt1")
        assert C.tokenize_messages(C.make_tiny_tokenizer(), row["messages"], tfi).mask.count(1) > 0


# ── --import ────────────────────────────────────────────────────────────────


def released_row(i: int) -> dict:
    """A hand-written row in the released ReTerm-10K layout (OpenAI wire format)."""
    call = lambda cid, cmd: {"id": cid, "type": "function",
                             "function": {"name": "bash", "arguments": json.dumps({"command": cmd})}}
    messages = [
        {"role": "system", "content": "You are a helpful assistant that can interact with a Linux terminal."},
        {"role": "user", "content": f"Create /app/f{i}.txt containing hello."},
        {"role": "assistant", "content": None, "tool_calls": [call("a", f"echo helo > /app/f{i}.txt")]},
        {"role": "tool", "tool_call_id": "a", "name": "bash", "content": ""},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Your previous attempt failed. The environment was not reset."},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [call("b", f"cat /app/f{i}.txt")]},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "helo\n"}]},
        {"role": "assistant", "content": "", "tool_calls": [call("c", f"echo hello > /app/f{i}.txt")]},
        {"role": "tool", "tool_call_id": "c", "content": ""},
        {"role": "assistant", "content": "Fixed the typo."},
    ]
    sha = f"{i:064x}"
    return {"id": f"task_00000{i}_abcdef12:{sha[:16]}", "task_id": f"task_00000{i}_abcdef12",
            "messages": messages, "train_from_message_index": 6, "target_attempt_index": 2,
            "trajectory_sha256": sha}


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_import_round_trips_released_rows(tmp_path, fmt):
    src = tmp_path / f"released.{fmt}"
    raw = [released_row(1), released_row(2)]
    src.write_text("".join(json.dumps(r) + "\n" for r in raw) if fmt == "jsonl" else json.dumps(raw))
    out = tmp_path / "ours.jsonl"
    B.main(["--import", str(src), "--out", str(out)])
    rows = C.read_jsonl(out)
    assert [r["id"] for r in rows] == [r["id"] for r in raw]
    for ours, theirs in zip(rows, raw, strict=True):
        assert {k: ours[k] for k in KEYS - {"messages"}} == {k: theirs[k] for k in KEYS - {"messages"}}
        assert len(ours["messages"]) == len(theirs["messages"])
        for a, b in zip(ours["messages"], theirs["messages"], strict=True):
            assert a["role"] == b["role"]
            if b.get("tool_calls"):
                assert a["tool_calls"][0]["function"]["arguments"] == json.loads(
                    b["tool_calls"][0]["function"]["arguments"])
        assert ours["messages"][7]["content"] == "helo\n" and ours["messages"][2]["content"] == ""
        # our token views accept the converted rows; only the recovery is trained on
        tfi = ours["train_from_message_index"]
        trace = C.tokenize_messages(C.make_tiny_tokenizer(), ours["messages"], tfi)
        assert sum(trace.mask) > 0
    B.main(["--import", str(src), "--out", str(out)])  # importing again adds nothing (dedupe)
    assert len(C.read_jsonl(out)) == 2


def test_import_rejects_broken_rows_naming_them(tmp_path, capsys):
    rows = [released_row(i) for i in range(6)]
    del rows[1]["task_id"]
    rows[2]["train_from_message_index"] = 99
    rows[3]["messages"][2]["tool_calls"][0]["function"]["arguments"] = "{not json"
    rows[4]["messages"][6]["tool_calls"][0]["function"]["name"] = "python"
    src = tmp_path / "bad.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ours.jsonl"
    B.main(["--import", str(src), "--out", str(out)])
    printed = capsys.readouterr().out
    assert [r["id"] for r in C.read_jsonl(out)] == [rows[0]["id"], rows[5]["id"]]
    assert f"{src}:2 (id={rows[1]['id']}): field 'task_id' missing" in printed
    assert f"{src}:3 (id={rows[2]['id']}): train_from_message_index 99 is past the end" in printed
    assert f"{src}:4 (id={rows[3]['id']}): message 2: tool call arguments are not valid JSON" in printed
    assert f"{src}:5 (id={rows[4]['id']}): message 6: unknown tool 'python'" in printed


@pytest.mark.parametrize("text, message", [
    ("", "empty"), ("\n\n", "empty"), ("garbage\n", ":1: not valid JSON"),
    ('{"id": 1}\n{"id"', ":2: not valid JSON (a cut-off last line?)"),
    ('[{"id": 1},\n oops]', ":2: not valid JSON"), ('{"id": 1}\n', "no importable row; first problem: "),
])
def test_import_refuses_bad_files_leaving_nothing(tmp_path, text, message):
    src, out = tmp_path / "in.jsonl", tmp_path / "sub" / "ours.jsonl"
    src.write_text(text)
    with pytest.raises(C.DataError, match="^" + re.escape(f"{src}") + ".*" + re.escape(message)) as e:
        B.main(["--import", str(src), "--out", str(out)])
    assert "\n" not in str(e.value) and not (tmp_path / "sub").exists()


@pytest.mark.slow
def test_oracle_makes_the_smallest_repair_that_passes(docker_ready, tmp_path):
    """The recovery redoes the faulty step alone when that passes (later steps keep their work), and
    falls back to more only when it does not: a dropped first step whose absence the later steps
    did not depend on is repaired by that step alone; a wrong path in a middle step needs the
    steps after it too (the chmod went to the stray file)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import microtasks

    cfg = B.Config(tasks=str(tmp_path), command_timeout=30.0, system_prompt=microtasks.SYSTEM_PROMPT,
                   recovery_prompt=C.RECOVERY_PROMPT, no_internet=True)

    def recover(name: str, pick) -> tuple[dict, list[str]]:
        task = C.load_task(tmp_path / name)
        steps = B.split_steps((task.solution_dir / "solve.sh").read_text())
        row, outcome = B.oracle_row(cfg, task, steps, pick(steps))
        assert outcome == "row", outcome
        return row["meta"], B.commands_of(row["messages"][row["train_from_message_index"]:])

    with C.env_session():
        stale = microtasks.write_task(tmp_path, "copy", "green", "elk", "", stale=True)
        meta, cmds = recover(stale, lambda steps: B.Fault("drop", 0, "drop@0", [c for _, c in steps[1:]]))
        assert meta["recovery"] == "step" and cmds == ["ls -la /app/out", microtasks.STALE_STEP[1]]
        mode = microtasks.write_task(tmp_path, "mode", "green", "elk", "640")
        bad = "/app/out/owl.txt"
        meta, cmds = recover(mode, lambda steps: B.Fault(
            "path", 1, "path@1", ["mkdir -p /app/out", f"cp /app/data/green.txt {bad}", f"chmod 640 {bad}"],
            good="/app/out/elk.txt", bad=bad))
        assert meta["recovery"] == "from_fault" and cmds[1:] == [
            f"rm -rf -- {bad}", "cp /app/data/green.txt /app/out/elk.txt", "chmod 640 /app/out/elk.txt"]
        # --scopes from_start: every recovery redoes the whole task; with --fresh-out its first step
        # empties the output folder, so the redo also clears what the wrong input left there
        cfg = dataclasses.replace(cfg, scopes="from_start")
        fresh = microtasks.write_task(tmp_path, "mode", "red", "yak", "600", fresh_out=True)
        solution = [microtasks.FRESH_STEP[1], "cp /app/data/red.txt /app/out/yak.txt",
                    "chmod 600 /app/out/yak.txt"]
        meta, cmds = recover(fresh, lambda steps: B.Fault(
            "input", 1, "input@1", [solution[0], "cp /app/data/gray.txt /app/out/yak.txt", solution[2]],
            bad="/app/data/gray.txt", good="/app/data/red.txt"))
        assert meta["recovery"] == "from_start" and cmds == ["ls -la /app/data /app/out", *solution]
