"""The rollout layer in real Docker, driven by a scripted engine (exact, known outputs) and
by a real tiny model through 05_eval_tb2.py."""

from __future__ import annotations

import importlib

import pytest
from conftest import ScriptedEngine

import common as C

pytestmark = pytest.mark.usefixtures("docker_ready")


def call(cmd: str) -> str:
    return ("Running it.\n\n<tool_call>\n<function=bash>\n<parameter=command>\n"
            f"{cmd}\n</parameter>\n</function>\n</tool_call>")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return C.load_tokenizer(C.make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", arch="qwen3"))


def cfg(**kw):
    return C.RolloutConfig(**{"max_turns": 5, "max_context": 8192, "concurrency": 4, **kw})


def test_attempt_runs_commands_and_tokens_match_a_one_shot_render(make_task, tok):
    task = C.load_task(make_task("rt"))
    eng = ScriptedEngine(tok, [call("cd /app && export WORD=ok"), call("echo $WORD > out.txt"),
                               "<tool_call>\nnot a call", "All done."])
    with C.env_session():
        (ep,), stats = C.run_attempts([task], eng, cfg())
    assert (ep.reward, ep.end, ep.turns, ep.malformed, ep.category) == (1.0, "answered", 4, 1, None)
    assert [c["command"] for c in ep.commands] == ["cd /app && export WORD=ok", "echo $WORD > out.txt"]
    assert ep.messages[3]["content"] == "[exit code: 0]" and "ERROR: malformed" in ep.messages[7]["content"]
    assert stats["env_steps"] == 4
    # the delta-rendered trace equals the shared one-shot tokenisation SFT uses, mask and all
    ref = C.tokenize_messages(tok, ep.messages, train_from_message_index=ep.attempt_from)
    assert ep.trace.ids == ref.ids and ep.trace.mask == ref.mask
    sampled = [lp != 0.0 for lp in ep.trace.logprobs]
    assert sampled == [bool(m) for m in ep.trace.mask]  # mask == exactly the sampled tokens


def test_failure_snapshot_and_forked_recovery(make_task, tok):
    task = C.load_task(make_task("rec"))
    script = [call("echo wrong > /app/out.txt && cd /tmp"), call("ls /app")] * 3
    eng = ScriptedEngine(tok, script)
    with C.env_session():
        (ep,), _ = C.run_attempts([task], eng, cfg(max_turns=2), snapshot="failed")
        assert (ep.reward, ep.end, ep.category) == (0.0, "max_turns", "max_turns")
        assert C.docker_client().images.get(ep.snapshot).labels["reterm.keep"] == "1"
        state = C.FailureState.from_episode(ep, "scripted")
        eng.load([call("pwd; cat /app/out.txt"), call("echo ok > /app/out.txt"), "Fixed."])
        groups, _ = C.run_recoveries([state], {task.name: task}, 2, eng, cfg())
        for rec in groups[0]:
            assert rec.reward == 1.0 and rec.parent == state.id
            assert rec.trace.ids[: len(state.ids)] == state.ids
            assert not any(rec.trace.mask[: len(state.ids)])
            first_obs = rec.messages[rec.attempt_from + 1]["content"]
            assert first_obs.startswith("/tmp\nwrong\n")  # cwd and files of the failed attempt
            ref = C.tokenize_messages(tok, rec.messages, train_from_message_index=rec.attempt_from)
            assert rec.trace.ids == ref.ids and rec.trace.mask == ref.mask
            assert "NOT been reset" in rec.messages[rec.attempt_from - 1]["content"]
        C.remove_image(ep.snapshot)


def test_error_categories():
    def ep(end="answered", cmds=(), turns=3, malformed=0):
        e = C.Episode(task=None, messages=[], trace=C.TokenTrace(), end=end, turns=turns, malformed=malformed)
        e.commands = [{"exit_code": c, "timed_out": c == 124} for c in cmds]
        return C.classify_failure(e)

    assert ep("timeout") == "timeout" and ep("max_turns") == "max_turns"
    assert ep(malformed=3, turns=4) == "malformed_output"
    assert ep(cmds=[0]) == "gave_up_early"
    assert ep(cmds=[0, 0, 1]) == "command_error" and ep(cmds=[0, 0, 124]) == "command_error"
    assert ep(cmds=[0, 1, 0]) == "faulty_implementation"
    assert set(C.ERROR_CATEGORIES) == {"timeout", "max_turns", "malformed_output", "gave_up_early",
                                       "command_error", "faulty_implementation"}


def test_policy_eval_with_tiny_model_resumes_and_cleans_up(make_task, tmp_path):
    ev = importlib.import_module("05_eval_tb2")
    model = C.make_tiny_model(tmp_path / "tiny", arch="qwen3")
    make_task("p1")
    make_task("p2")
    engine = "vllm" if importlib.util.find_spec("vllm") else "hf"
    args = ["--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "ev"), "--agent", "policy",
            "--model", str(model), "--engine", engine, "--dtype", "float32", "--max-tokens", "24",
            "--max-turns", "2", "--max-context", "2048", "--trials", "2", "--recovery"]
    s = ev.main(args)
    rows = C.read_jsonl(tmp_path / "ev" / "trials.jsonl")
    assert s["n_trials"] == 4 and len(rows) == 4 and all(r["turns"] > 0 for r in rows)
    assert (tmp_path / "ev" / "summary.json").exists()
    assert len(list((tmp_path / "ev" / "trajectories").glob("p1__*.json"))) >= 2
    if s["pass_at_1"] < 1:
        assert "recovery_at_1" in s and s["recovery_by_category"]
    s2 = ev.main(args + ["--engine", "no-such-engine"])  # resume: nothing left, so no engine is built
    assert s2["n_trials"] == 4 and len(C.read_jsonl(tmp_path / "ev" / "trials.jsonl")) == 4
    assert not C.docker_client().containers.list(all=True, filters={"label": f"reterm.run={C.RUN_ID}"})
    assert not C.docker_client().images.list(filters={"label": ["reterm.kind=snapshot", "reterm.keep=1",
                                                                f"reterm.run={C.RUN_ID}"]})
