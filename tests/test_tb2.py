"""Terminal-Bench 2.0 evaluation the way Harbor scores it, against real containers: network per
task.toml and --no-internet, pinned images (never silently built), /logs present from the start,
network failures flagged, Harbor's job layout (checked against Harbor's result models), task
sampling for large corpora."""

from __future__ import annotations

import datetime
import importlib
import json
import time
import uuid

import pytest
from conftest import ROOT

import common as C

ev = importlib.import_module("05_eval_tb2")
MODELS = json.loads((ROOT / "tests" / "fixtures" / "harbor_models.json").read_text())
docker = pytest.mark.usefixtures("docker_ready")

NET_TOML = """[verifier]\ntimeout_sec = 60.0\n[environment]\nbuild_timeout_sec = 20\n"""


def check(value, tp: str, where: str) -> list[str]:
    """Problems of `value` against a type of the fixture's notation (empty list: it parses)."""
    if tp == "any":
        return []
    if tp.endswith("?"):
        return [] if value is None else check(value, tp[:-1], where)
    if value is None:
        return [f"{where}: required, got null"]
    if tp.startswith("list["):
        return ([f"{where}: not a list"] if not isinstance(value, list) else
                [p for i, v in enumerate(value) for p in check(v, tp[5:-1], f"{where}[{i}]")])
    if tp.startswith("dict[str, "):
        return ([f"{where}: not an object"] if not isinstance(value, dict) else
                [p for k, v in value.items() for p in check(v, tp[10:-1], f"{where}.{k}")])
    if tp in MODELS:
        if not isinstance(value, dict):
            return [f"{where}: {tp} must be an object"]
        fields = MODELS[tp]
        probs = [f"{where}.{k}: not a field of Harbor's {tp}" for k in value if k not in fields]
        for k, t in fields.items():
            if k not in value and not t.endswith("?"):
                probs.append(f"{where}.{k}: required by {tp}")
            elif k in value:
                probs += check(value[k], t, f"{where}.{k}")
        return probs
    ok = {"str": lambda v: isinstance(v, str),
          "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "bool": lambda v: isinstance(v, bool),
          "datetime": lambda v: isinstance(v, str) and bool(datetime.datetime.fromisoformat(v)),
          "uuid": lambda v: isinstance(v, str) and bool(uuid.UUID(v))}[tp]
    try:
        return [] if ok(value) else [f"{where}: not a {tp}: {value!r}"]
    except ValueError:
        return [f"{where}: not a {tp}: {value!r}"]


def test_fixture_checker_catches_misnamed_and_missing_fields():
    good = {"exception_type": "E", "exception_message": "m", "exception_traceback": "",
            "occurred_at": "2025-11-01T00:00:00+00:00"}
    assert check(good, "ExceptionInfo", "x") == []
    assert check({**good, "type": "E"}, "ExceptionInfo", "x") == [
        "x.type: not a field of Harbor's ExceptionInfo"]
    assert check({"rewards": {"reward": "1"}}, "VerifierResult", "v") == [
        "v.rewards.reward: not a number: '1'"]
    assert check({"name": "a"}, "AgentInfo", "a") == ["a.version: required by AgentInfo"]


def interfaces(env: C.Env) -> set[str]:
    lines = env.bash("cat /proc/net/dev").output.splitlines()[2:]
    return {ln.split(":")[0].strip() for ln in lines if ":" in ln}


@pytest.mark.slow
@docker
def test_network_as_harbor_gives_it(make_task):
    on = C.load_task(make_task("net-on", toml=NET_TOML))  # no allow_internet: Harbor's default is on
    off = C.load_task(make_task("net-off"))  # allow_internet = false
    assert on.allow_internet and not off.allow_internet
    with C.start_env(on) as e:
        assert interfaces(e) - {"lo"} and e.internet
    with C.start_env(off) as e:
        assert interfaces(e) == {"lo"} and not e.internet
    with C.start_env(on, internet=False) as e:  # --no-internet
        assert interfaces(e) == {"lo"}


@pytest.mark.slow
@docker
def test_logs_dirs_exist_before_the_first_command_and_docker_timeout_follows_tasks(make_task):
    task = C.load_task(make_task("logs", toml="[agent]\ntimeout_sec = 12000.0\n"))
    with C.start_env(task) as e:
        assert e.bash("stat -c '%a %U' /logs/agent /logs/verifier").output == "777 root\n777 root\n"
        assert e.bash("setpriv --reuid=65534 --regid=65534 --clear-groups touch /logs/agent/x && echo ok"
                      ).output == "ok\n"
        e.bash("true", timeout=task.agent_timeout_sec)  # a 12,000 s command must not hit a 7,200 s read limit
        assert C.docker_client().api.timeout >= 12000


@pytest.mark.slow
@docker
def test_pinned_image_absent_is_an_error_row_and_never_built(make_task, tmp_path):
    pinned = 'docker_image = "reterm-test/no-such-image:never"\nallow_internet = false\n'
    make_task("pinned", toml=f"[environment]\nbuild_timeout_sec = 30\n{pinned}")
    for im in C.docker_client().images.list(name="reterm-task/pinned"):  # a previous run's --force-build
        C.remove_image(im.id)
    args = ["--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "ev")]
    s = ev.main(args)
    (row,) = C.read_jsonl(tmp_path / "ev" / "trials.jsonl")
    assert s["pass_at_1"] == 0.0 and s["n_errors"] == 1
    assert row["reward"] == 0.0 and "pinned image reterm-test/no-such-image:never" in row["error"]
    assert "--force-build" in row["error"] and row["image_id"] is None
    assert not C.docker_client().images.list(name="reterm-task/pinned")  # not built behind our back
    (trial,) = (tmp_path / "ev" / "harbor").glob("pinned__*/result.json")
    res = json.loads(trial.read_text())
    assert res["verifier_result"] is None and res["exception_info"]["exception_type"] == "EnvError"
    s2 = ev.main(args[:3] + [str(tmp_path / "built"), "--force-build"])
    (row,) = C.read_jsonl(tmp_path / "built" / "trials.jsonl")
    assert s2["pass_at_1"] == 1.0 and row["error"] is None
    assert row["image"].startswith("reterm-task/pinned:") and row["image_id"].startswith("sha256:")


@pytest.mark.slow
@docker
def test_verifier_failing_for_lack_of_network_is_flagged(make_task, tmp_path):
    # TB2's test.sh shape: fetch the test tools, write 0 when that fails, exit normally.
    test = ("apt-get update 2>&1 | tail -n 3\nmkdir -p /logs/verifier\n"
            "apt-get install -y -q jq >/dev/null 2>&1 && echo 1 > /logs/verifier/reward.txt "
            "|| echo 0 > /logs/verifier/reward.txt\n")
    make_task("needs-net", test=test, toml=NET_TOML)
    s = ev.main(["--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "ev"), "--no-internet"])
    (row,) = C.read_jsonl(tmp_path / "ev" / "trials.jsonl")
    assert row["reward"] == 0.0 and row["network_error"] and not row["internet"]
    assert "network unavailable" in row["error"] and s["n_network_errors"] == 1 and s["n_errors"] == 1
    (trial,) = (tmp_path / "ev" / "harbor").glob("needs-net__*/result.json")
    res = json.loads(trial.read_text())
    assert res["exception_info"]["exception_type"] == "NetworkUnavailableError"
    assert res["verifier_result"] == {"rewards": {"reward": 0.0}}


@pytest.mark.slow
@docker
def test_bundled_oracle_run_reads_as_harbor_job(tmp_path):
    out = tmp_path / "ev"
    s = ev.main(["--tasks", str(ROOT / "tasks"), "--task-filter", "^(csv-sales-summary|fix-lru-cache)$",
                 "--out", str(out), "--trials", "2", "--concurrency", "2"])
    assert s["pass_at_1"] == 1.0 and s["n_trials"] == 4
    job = out / "harbor"
    result = json.loads((job / "result.json").read_text())
    assert check(result, "JobResult", "result.json") == []
    assert result["n_total_trials"] == 4
    (stats,) = result["stats"]["evals"].values()
    assert stats["n_trials"] == 4 and stats["metrics"] == [{"mean": 1.0}]
    assert len(stats["reward_stats"]["reward"]["1.0"]) == 4
    trials = sorted(job.glob("*/result.json"))
    assert len(trials) == 4 and (job / "config.json").exists()
    for path in trials:
        res = json.loads(path.read_text())
        assert check(res, "TrialResult", path.parent.name) == []
        assert res["trial_name"] == path.parent.name and path.parent.name.startswith(res["task_name"] + "__")
        assert res["verifier_result"]["rewards"]["reward"] == 1.0 and res["exception_info"] is None
        assert float((path.parent / "verifier" / "reward.txt").read_text()) == 1.0
        assert (path.parent / "verifier" / "test-stdout.txt").exists()
        assert (path.parent / "agent" / "oracle.txt").exists()
    rows = C.read_jsonl(out / "trials.jsonl")
    assert all(r["image_id"].startswith("sha256:") and r["image"].startswith("reterm-task/") for r in rows)


def _trial_rows(cfg, task, trial, out):
    """Stage 05's rows for four outcomes, as run_trial makes them (no container): a pass, a trial
    lost to the infrastructure (no reward), an agent timeout that was still verified (reward 0), a
    verifier timeout (no reward)."""
    row, t = ev.new_row(cfg, task, trial), ev.now()
    timed = {"environment_setup": [t, t], "agent_execution": [t, t], "verifier": [t, t], "turns": 1}
    infra = C.infra_error("trial", "BuildError: no space left")
    outcome = {("a", 0): timed | {"reward": 1.0, "verified": True},
               ("b", 0): {"error": infra, "error_type": "BuildError"},
               ("a", 1): timed | {"agent_timed_out": True, "verified": True},
               ("b", 1): timed | {"error": "verifier timed out after 30 s",
                                  "error_type": "VerifierTimeoutError"}}
    return row | outcome[task.name, trial] | {"seconds": 1.0}


def test_error_trials_and_a_job_with_errors_read_as_harbor_and_a_resume_rebuilds_the_job(
        make_task, tmp_path, monkeypatch):
    make_task("a"), make_task("b")
    monkeypatch.setattr(ev, "run_trial", _trial_rows)
    out = tmp_path / "ev"
    args = ["--tasks", str(tmp_path / "tasks"), "--out", str(out), "--concurrency", "1"]
    ev.main(args + ["--trials", "1"])  # a pass and an infrastructure error
    first = json.loads((out / "harbor" / "result.json").read_text())
    assert check(first, "JobResult", "result.json") == [] and first["n_total_trials"] == 2
    (e,) = first["stats"]["evals"].values()
    assert (e["n_trials"], e["n_errors"], e["metrics"]) == (1, 1, [{"mean": 0.5}])
    summary = ev.main(args + ["--trials", "2"])  # resumed with a second trial per task
    job = json.loads((out / "harbor" / "result.json").read_text())
    assert check(job, "JobResult", "result.json") == []
    assert job["started_at"] == first["started_at"] and job["n_total_trials"] == 4
    assert (job["stats"]["n_trials"], job["stats"]["n_errors"]) == (4, 3)  # every trial, not the last run's
    (e,) = job["stats"]["evals"].values()
    name = {(r["task"], r["trial"]): ev.trial_dir(out, r["task"], r["trial"]).name
            for r in C.read_jsonl(out / "trials.jsonl")}
    assert e["n_trials"] == 2 and e["n_errors"] == 3  # verified trials; trials with an exception
    assert e["metrics"] == [{"mean": 0.25}] == [{"mean": summary["pass_at_1"]}]  # a missing reward is 0
    assert e["reward_stats"] == {"reward": {"1.0": [name["a", 0]], "0.0": [name["a", 1]]}}
    assert e["exception_stats"] == {"BuildError": [name["b", 0]], "AgentTimeoutError": [name["a", 1]],
                                    "VerifierTimeoutError": [name["b", 1]]}
    for (task, trial), dirname in name.items():
        res = json.loads((out / "harbor" / dirname / "result.json").read_text())
        assert check(res, "TrialResult", dirname) == []
        assert (res["verifier_result"] is None) == (task == "b")  # no reward: none is reported
        assert (res["exception_info"] is None) == ((task, trial) == ("a", 0))


def test_sample_draws_disjoint_train_and_held_out_sets_fast(tmp_path):
    root = tmp_path / "corpus"
    for i in range(3000):
        d = root / f"task-{i:04d}"
        (d / "environment").mkdir(parents=True)
        (d / "tests").mkdir()
        (d / "instruction.md").write_text(f"Do thing {i}.\n")
        (d / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 900.0\n[environment]\n'
                                     'docker_image = "example/task:1"\nmemory = "2G"\n')
        (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    t0 = time.perf_counter()
    everything = C.load_tasks(root)
    seconds = time.perf_counter() - t0
    print(f"load_tasks: {len(everything)} task folders in {seconds:.2f}s")
    assert len(everything) == 3000 and seconds < 10
    train = C.load_tasks(root, sample=2000, seed=7)
    held = C.load_tasks(root, sample=500, skip=2000, seed=7)
    assert len(train) == 2000 and len(held) == 500
    assert not {t.name for t in train} & {t.name for t in held}
    assert [t.name for t in C.load_tasks(root, sample=2000, seed=7)] == [t.name for t in train]
    assert {t.name for t in C.load_tasks(root, sample=2000, seed=8)} != {t.name for t in train}


def test_scaffold_travels_in_the_model_folder(tmp_path):
    assert C.load_scaffold(None) == C.Scaffold()
    C.Scaffold(system_prompt="Be terse.", max_turns=7).save(tmp_path)
    said: list[str] = []
    s = C.load_scaffold(tmp_path, log=said.append, max_turns=None, max_tokens=64)
    assert (s.system_prompt, s.max_turns, s.max_tokens) == ("Be terse.", 7, 64)
    assert said == ["scaffold: max_tokens = 64 (flag; the model says 4096)"]
    rcfg = C.rollout_config(s, C.SamplingConfig(), concurrency=2)
    assert (rcfg.max_turns, rcfg.sampling.max_tokens, rcfg.system_prompt) == (7, 64, "Be terse.")
    assert C.recovery_message("X", "Failed; redo: {instruction}")["content"] == "Failed; redo: X"



CUSTOM = "You are TermBot. Use the bash tool; one command per call."
RECOVERY = "That failed and nothing was reset. Fix it. Task again: {instruction}"


def custom_row(i: int, instruction: str) -> dict:
    call = lambda c: [{"type": "function", "function": {"name": "bash", "arguments": {"command": c}}}]  # noqa: E731
    msgs = [{"role": "system", "content": CUSTOM}, {"role": "user", "content": instruction},
            {"role": "assistant", "content": "Look first.", "tool_calls": call("ls /app")},
            {"role": "tool", "content": "[exit code: 0]"}, {"role": "assistant", "content": "Done."},
            {"role": "user", "content": RECOVERY.replace("{instruction}", instruction)},
            {"role": "assistant", "content": f"Fix {i}.", "tool_calls": call("echo ok > /app/out.txt")},
            {"role": "tool", "content": "[exit code: 0]"}, {"role": "assistant", "content": "Fixed."}]
    return {"id": f"r{i}", "task_id": "t", "messages": msgs, "train_from_message_index": 6}


@pytest.mark.slow
@docker
def test_sft_scaffold_reaches_evaluation_which_resumes_and_cleans_up(make_task, tmp_path):
    """02 -> 05 on rows with their own system prompt: the trajectories 05 saves start with it; a second
    run resumes with nothing left to do (no engine built) and neither leaves a container or snapshot."""
    sft = importlib.import_module("02_sft")
    data = tmp_path / "rows.jsonl"
    rows = [custom_row(i, f"Write ok to /app/out.txt ({i}).") for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = C.make_tiny_model(tmp_path / "base", arch="qwen3")
    final = sft.main(["--data", str(data), "--model", str(base), "--out", str(tmp_path / "sft"),
                      "--max-steps", "1", "--max-len", "1024", "--micro-batch-tokens", "1024",
                      "--grad-accum", "1", "--save-every", "0", "--no-activation-checkpointing"])
    saved = json.loads((final / "scaffold.json").read_text())
    assert saved["system_prompt"] == CUSTOM and saved["recovery_prompt"] == RECOVERY
    make_task("p1")
    make_task("p2")
    engine = "vllm" if importlib.util.find_spec("vllm") else "hf"
    out = tmp_path / "ev"
    args = ["--tasks", str(tmp_path / "tasks"), "--out", str(out), "--agent", "policy", "--model", str(final),
            "--engine", engine, "--dtype", "float32", "--max-tokens", "16", "--max-turns", "1",
            "--max-context", "2048", "--trials", "2", "--recovery"]
    summary = ev.main(args)
    assert summary["n_trials"] == 4 and all(r["turns"] > 0 for r in C.read_jsonl(out / "trials.jsonl"))
    assert len(list((out / "trajectories").glob("p1__*.json"))) >= 2
    if summary["pass_at_1"] < 1:
        assert "recovery_at_1" in summary and summary["recovery_by_category"]
    # a trial succeeds within one attempt + one recovery if it passed or its recovery did
    rec = {(r["task"], r["trial"]): r["reward"] for r in C.read_jsonl(out / "recovery.jsonl")}
    trials = C.read_jsonl(out / "trials.jsonl")
    assert summary["success_with_retry"] == sum(max(t["reward"], rec.get((t["task"], t["trial"]), 0.0))
                                                for t in trials) / len(trials) >= summary["pass_at_1"]
    trajectories = sorted((out / "trajectories").glob("*.json"))
    assert trajectories
    for path in trajectories:
        msgs = json.loads(path.read_text())["messages"]
        assert msgs[0] == {"role": "system", "content": CUSTOM}
        if path.name.endswith("__recovery.json"):
            assert {"role": "user", "content": RECOVERY.replace("{instruction}", msgs[1]["content"])} in msgs
    harbor = sorted((out / "harbor").glob("p*__*/agent/trajectory.json"))
    assert len(harbor) == 4 and all(json.loads(h.read_text())[0]["content"] == CUSTOM for h in harbor)
    again = ev.main(args + ["--engine", "no-such-engine"])  # resume: nothing left, so no engine is built
    assert again["n_trials"] == 4 and len(C.read_jsonl(out / "trials.jsonl")) == 4
    assert not C.docker_client().containers.list(all=True, filters={"label": f"reterm.run={C.RUN_ID}"})
    assert not C.docker_client().images.list(filters={"label": ["reterm.kind=snapshot", "reterm.keep=1",
                                                                f"reterm.run={C.RUN_ID}"]})
