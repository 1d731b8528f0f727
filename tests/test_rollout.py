"""The rollout layer in real Docker, driven by a scripted engine (exact, known outputs). A real tiny
model through 05_eval_tb2.py: test_tb2's scaffold test."""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import threading
import time

import batch_rollouts as R
import pytest
from conftest import ScriptedEngine

import common as C

pytestmark = [pytest.mark.usefixtures("docker_ready"), pytest.mark.slow]


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
        (ep,), stats = R.run_attempts([task], eng, cfg())
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
        (ep,), _ = R.run_attempts([task], eng, cfg(max_turns=2), commit="failed")
        assert (ep.reward, ep.end, ep.category) == (0.0, "max_turns", "max_turns")
        assert C.docker_client().images.get(ep.snapshot).labels["reterm.keep"] == "1"
        state = C.FailureState.from_episode(ep, "scripted")
        eng.load([call("pwd; cat /app/out.txt"), call("echo ok > /app/out.txt"), "Fixed."])
        groups, _ = R.run_recoveries([state], {task.name: task}, 2, eng, cfg())
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


def test_fork_recovery_starts_from_the_attempts_snapshot_and_removes_it(make_task, tok):
    """RolloutPool.fork_recovery (01's policy teacher, 04's standard_retry, 05's --recovery): the
    recovery runs in a fork of the failed attempt's container, with the engine and seed it is given,
    and the attempt's snapshot image is gone by the time completed() yields the recovery."""
    task = C.load_task(make_task("forkrec"))
    student = ScriptedEngine(tok, [call("echo wrong > /app/out.txt && cd /tmp"), "Done."])
    teacher = ScriptedEngine(tok, [call("pwd; cat /app/out.txt"), call("echo ok > /app/out.txt"), "Fixed."])
    images, yielded = [], []
    try:
        with C.env_session(), C.RolloutPool(student, cfg()) as pool:
            pool.submit(C.first_attempt(task, tok), commit="failed", tag=None)
            for attempt, ep in pool.completed():
                yielded.append((attempt, ep))
                if attempt is None:
                    assert ep.reward == 0.0 and ep.snapshot
                    images.append(ep.snapshot)
                    rec = pool.fork_recovery(ep, "student", tag=ep, engine=teacher, seed=7)
                    assert rec.parent == C.FailureState.from_episode(ep).id and rec.seed == 7
                else:
                    assert attempt.snapshot is None
                    assert not C.docker_client().images.list(filters={"reference": images[0]})
        (_, first), (attempt, rec) = yielded
        assert attempt is first and rec.reward == 1.0
        assert rec.messages[rec.attempt_from + 1]["content"].startswith("/tmp\nwrong\n")  # its cwd, its files
        assert rec.trace.ids[: len(first.trace.ids)] == first.trace.ids
    finally:
        for image in images:
            C.remove_image(image)


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


# ── asynchronous rollouts: own clocks, fault isolation, clean interrupts ───────


class ByTask(ScriptedEngine):
    """A script per task, chosen by the task's instruction inside the prompt."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]]):
        super().__init__(tokenizer, [])
        self.scripts = scripts

    def generate(self, prompts, sampling, seeds=None):
        gens = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            self.script = next(s for key, s in self.scripts.items() if key in text)
            gens += super().generate([p], sampling)
        return gens


def test_a_slow_command_does_not_delay_another_episodes_turns(make_task, tok):
    slow = C.load_task(make_task("slow", instruction="SLOW task."))
    fast = C.load_task(make_task("fast", instruction="FAST task."))
    stamp = "date +%s.%N"
    eng = ByTask(tok, {"SLOW task": [call(f"sleep 6; {stamp}"), "Done."],
                       "FAST task": [call(stamp), call(stamp), call(stamp), "Done."]})
    episodes = [C.first_attempt(slow, tok), C.first_attempt(fast, tok)]
    with C.env_session():
        stats = R.run_episodes(episodes, [None, None], eng, cfg(concurrency=2))
    s, f = episodes
    assert s.end == f.end == "answered" and len(f.commands) == 3 and not s.error and not f.error
    when = lambda ep, i: float(ep.messages[ep.attempt_from + 2 * i + 1]["content"].split()[0])  # noqa: E731
    # all three turns of the fast episode ran while the slow one's single command was still sleeping
    assert when(f, 2) < when(s, 0) - 2.0, (when(f, 2), when(s, 0))
    assert f.seconds < s.seconds and stats["env_steps"] == 2 + 4


def test_agent_timeout_counts_each_episodes_own_time(make_task, tok):
    toml = ('version = "1.0"\n[agent]\ntimeout_sec = 5.0\n[verifier]\ntimeout_sec = 30.0\n'
            '[environment]\ncpus = 1\nmemory = "512M"\n')
    task = C.load_task(make_task("clock", toml=toml))
    eng = ScriptedEngine(tok, [call("sleep 3"), "Done."])
    episodes = [C.first_attempt(task, tok) for _ in range(2)]
    with C.env_session():  # one slot: the second episode waits ~3 s for it, on nobody's clock
        R.run_episodes(episodes, [None, None], eng, cfg(concurrency=1))
    assert [ep.end for ep in episodes] == ["answered", "answered"]
    eng = ScriptedEngine(tok, [call("sleep 3"), call("sleep 30"), "Done."])
    ep = C.first_attempt(task, tok)
    with C.env_session():
        R.run_episodes([ep], [None], eng, cfg())
    # the second command only got what was left of the episode's own 5 s
    assert ep.end == "timeout" and ep.commands[1]["timed_out"] and ep.commands[1]["seconds"] < 4


def test_dead_container_and_failed_start_are_error_rows(make_task, tmp_path, tok, monkeypatch):
    ev = importlib.import_module("05_eval_tb2")
    make_task("ok1")
    make_task("ok2")
    make_task("doomed", instruction="DOOMED task.")
    make_task("broken", dockerfile=f"FROM {C.BASE_IMAGE}\nRUN exit 3\n")
    fix = [call("echo ok > /app/out.txt"), "Done."]
    eng = ByTask(tok, {"DOOMED task": [call("sleep 60"), "Done."], "Write ok": fix})
    monkeypatch.setattr(C, "make_engine", lambda *a, **kw: eng)

    def kill_doomed():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for c in C.docker_client().containers.list(filters={"label": ["reterm.task=doomed",
                                                                          f"reterm.run={C.RUN_ID}"]}):
                time.sleep(1.0)  # let its `sleep 60` start
                c.remove(force=True)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_doomed)
    killer.start()
    s = ev.main(["--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "ev"), "--agent", "policy",
                 "--model", "scripted", "--concurrency", "4", "--max-turns", "3", "--recovery"])
    killer.join()
    rows = {r["task"]: r for r in C.read_jsonl(tmp_path / "ev" / "trials.jsonl")}
    assert set(rows) == {"ok1", "ok2", "doomed", "broken"} and s["n_trials"] == 4
    assert rows["ok1"]["reward"] == rows["ok2"]["reward"] == 1.0
    # its exec or snapshot failed; the image that can't be built never started a container
    assert rows["doomed"]["reward"] == 0.0 and C.is_infra_error(rows["doomed"]["error"])
    assert rows["broken"]["reward"] == 0.0 and C.is_infra_error(rows["broken"]["error"])
    assert "build failed" in rows["broken"]["error"]
    assert not C.docker_client().containers.list(all=True, filters={"label": f"reterm.run={C.RUN_ID}"})


def test_sigterm_during_async_policy_rollout_leaves_nothing_behind(make_task, tmp_path):
    model = C.make_tiny_model(tmp_path / "tiny", arch="qwen3")
    make_task("hang-async", test="sleep 1000\n")  # every trial ends in a verifier that never returns
    cmd = [sys.executable, str(C.ROOT / "05_eval_tb2.py"), "--tasks", str(tmp_path / "tasks"),
           "--out", str(tmp_path / "ev"), "--agent", "policy", "--model", str(model), "--engine", "hf",
           "--dtype", "float32", "--max-tokens", "8", "--max-turns", "1", "--trials", "3",
           "--concurrency", "3", "--recovery"]
    p = subprocess.Popen(cmd, cwd=C.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    mine = lambda **kw: C.docker_client().containers.list(  # noqa: E731
        all=True, filters={"label": [f"{k.replace('_', '.')}={v}" for k, v in kw.items()]})
    deadline = time.monotonic() + 120
    while len(mine(reterm_task="hang-async")) < 3 and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.3)
    assert len(mine(reterm_task="hang-async")) == 3
    time.sleep(2.0)  # snapshots committed, verifiers running
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=90)
    assert not mine(reterm_task="hang-async"), p.stdout.read().decode()[-2000:]
    snapshots = {"label": ["reterm.kind=snapshot", "reterm.task=hang-async"]}
    assert not C.docker_client().images.list(filters=snapshots)
