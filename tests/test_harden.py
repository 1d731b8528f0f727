"""Attacks an exploring policy (or a careless user) finds, each against a real container: the
environment stays bounded and usable, the verifier can't be fooled, one bad episode or input
doesn't end a run."""

from __future__ import annotations

import importlib
import textwrap
import threading
import time

import pytest
from conftest import FakeEngine, write_task

import common as C

pytestmark = [pytest.mark.usefixtures("docker_ready"), pytest.mark.slow]

TOML = textwrap.dedent("""\
    [agent]
    timeout_sec = 60.0
    [verifier]
    timeout_sec = 20.0
    [environment]
    memory = "512M"
    """)


def start(make_task, name: str, extra: str = "", **kw) -> C.Env:
    return C.start_env(C.load_task(make_task(name, toml=TOML + extra, **kw)))


def test_fork_bomb_is_bounded_by_the_pid_limit(make_task):
    with start(make_task, "pids", "pids_limit = 64\n") as env:
        assert env.container.client.api.inspect_container(env.container.id)["HostConfig"]["PidsLimit"] == 64
        seen = []
        probe = threading.Timer(2.0, lambda: seen.append(env.container.stats(stream=False)["pids_stats"]))
        probe.start()
        r = env.bash("for i in $(seq 300); do sleep 60 & done 2>/dev/null; wait", timeout=4)
        probe.join()
        assert r.timed_out and 50 <= seen[0]["current"] <= 64, seen  # it hit the limit, not the host's
        assert env.bash("echo usable").output == "usable\n"  # the spawned sleeps died with the command


def test_disk_fillers_are_bounded(make_task, monkeypatch):
    monkeypatch.setenv("RETERM_STORAGE_QUOTA", "0")  # the watch alone (the kernel quota: test_harden3)
    with start(make_task, "disk", 'storage = "64M"\n') as env:
        r = env.bash("yes > /app/big; echo rc=$?", timeout=60)  # one file: ulimit -f of the cap
        assert "rc=153" in r.output  # SIGXFSZ
        assert int(env.bash("stat -c %s /app/big").output.split()[0]) <= 64 * 2**20
        time.sleep(1)  # the file and the tool's state put the layer just past the cap: the watch acts once
        env.bash("rm /app/big")
        time.sleep(1)
        # many files: the container's storage watch stops it
        fill = "for i in $(seq 100); do head -c 16M /dev/zero > /app/f$i; done; echo finished"
        r = env.bash(fill, timeout=60)
        assert "finished" not in r.output and "passed the storage cap (64 MB" in r.output
        written = int(env.bash("du -sm /app | cut -f1").output.split()[0])
        # stopped past the cap but far short of the loop's 1600 MB; how far past depends on how fast
        # the disk writes between two 0.25 s polls: measured 266-301 MB for 20 background writers
        # (docs/environment.md), ~350 MB once for this loop on CI under load; the promise is one poll
        assert 64 <= written <= 480, written
        env.bash("rm -f /app/f*")  # back under the cap (while over it, the container may not grow)
        # output capture costs no disk: 3 s of `yes` keeps a few MiB, and reports the true size
        r = env.bash("yes", timeout=3)
        assert r.timed_out and int(r.output.split("[... ")[1].split(" bytes")[0]) > 10**7
        kept = env.bash(f"du -sck /var/lib/reterm {C._CAPTURE} | tail -1 | cut -f1").output  # state + capture
        assert int(kept.split()[0]) < 4 * 1024, kept


def test_verifier_cannot_be_fooled(make_task):
    test = textwrap.dedent("""\
        echo 0 > /logs/verifier/reward.txt
        [ -e /tests/conftest.py ] && { echo 1 > /logs/verifier/reward.txt; exit; }
        grep -qx ok /app/out.txt && echo 1 > /logs/verifier/reward.txt
        """)
    with start(make_task, "hack", test=test) as env:
        env.bash("mkdir -p /logs/verifier/reward.txt; echo '{\"reward\": 1}' > /logs/verifier/reward.json")
        env.bash("mkdir -p /tests && touch /tests/conftest.py")
        env.bash("printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/grep; chmod +x /usr/local/bin/grep")
        env.bash("printf '#!/bin/sh\\nsleep 1000\\n' > /usr/local/bin/tail; chmod +x /usr/local/bin/tail")
        cp = "cp /usr/local/bin/tail /usr/local/bin/timeout; cp /usr/local/bin/tail /usr/local/bin/stat"
        env.bash(cp)
        assert env.bash("grep -qx ok /app/out.txt; echo $?").output == "0\n"  # the agent's PATH has the plant
        t0 = time.monotonic()
        v = env.verify()
        assert (v.reward, v.error) == (0.0, None) and time.monotonic() - t0 < 15
        assert env.bash("ls /tests").output == "test.sh\n"
        # a background loop rewriting the reward wins in place sometimes; a fresh fork has no loop
        env.bash("(while :; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; done) >/dev/null 2>&1 &")
        assert [env.verify(fresh=True).reward for _ in range(3)] == [0.0] * 3
        env.bash("echo ok > /app/out.txt; rm /usr/local/bin/grep")
        assert env.verify(fresh=True).reward == 1.0


def test_keepalive_survives_kill_commands_and_a_dead_container_is_a_clear_error(make_task):
    with start(make_task, "kills") as env:
        kill_sleeps = "for p in /proc/[0-9]*; do [ \"$(cat $p/comm)\" = sleep ] && kill ${p#/proc/}; done"
        for cmd in (kill_sleeps, "kill 1", "kill -9 1", "kill -9 -1"):
            env.bash(cmd)
            time.sleep(0.3)
            assert env.bash("echo alive").output == "alive\n", cmd
        env.container.remove(force=True)
        with pytest.raises(C.EnvError, match="container is gone"):
            env.bash("echo hi")


def test_tool_state_survives_what_agents_do(make_task):
    with start(make_task, "state") as env:
        env.bash("cd /usr && export A=1; rm -rf /tmp")
        assert env.bash("pwd; echo $A").output == "/usr\n1\n"
        env.bash("trap 'echo bye' EXIT; cd /etc; export B=2")
        env.bash("cd /var; export C=3; exec bash")
        env.bash("set -e; cd /opt; export D=4; false")
        env.bash("export BASH_ENV=/nonexistent ENV=/nonexistent; echo 'exit 3' > /root/.bashrc")
        assert env.bash("pwd; echo $A$B$C$D").output == "/opt\n1234\n"
        long = "echo " + "x" * 300_000 + " | wc -c"  # over the 128 KiB argv string limit
        assert env.bash(long).output == "300001\n"
        # setsid children escape `timeout`'s process group; they die with the command all the same
        r = env.bash("setsid sleep 1000 & nohup setsid bash -c 'sleep 1001' & sleep 1000", timeout=2)
        assert r.timed_out
        ps = env.bash("cat /proc/[0-9]*/cmdline | tr '\\0' ' '").output
        assert "sleep 1000" not in ps and "sleep 1001" not in ps
        # a server left running keeps running, and the command still answers
        r = env.bash("(sleep 2; echo late) & echo now")
        assert r.output == "now\n" and r.seconds < 2


def test_a_hung_harness_is_bounded_on_the_host(make_task, monkeypatch):
    monkeypatch.setattr(C, "EXEC_GRACE", 3.0)
    with start(make_task, "nohang") as env:  # the harness runs on the toolchain: a planted tail is not used
        env.bash("printf '#!/bin/sh\\nsleep 1000\\n' > /tmp/t; chmod +x /tmp/t; mv /tmp/t /usr/bin/tail")
        r = env.bash("seq 100000", timeout=2)
        assert not r.timed_out and r.output.endswith("100000\n")
    monkeypatch.setenv("RETERM_TRUSTED_VERIFY", "0")  # as for a pinned image: the container's own tools
    with start(make_task, "hung") as env:
        env.bash("cp /usr/bin/tail /usr/bin/tail.real; printf '#!/bin/sh\\nsleep 1000\\n' > /usr/bin/tail")
        t0 = time.monotonic()
        r = env.bash("seq 100000", timeout=2)  # the capture's tail now hangs
        assert r.timed_out and time.monotonic() - t0 < 10
        env.bash("mv /usr/bin/tail.real /usr/bin/tail")
        assert env.bash("echo fine").output == "fine\n"


@pytest.mark.parametrize("toml, message", [
    ("[agent]\ntimeout_sec = -5\n", r"\[agent\] timeout_sec must be a positive number, got -5"),
    ("[verifier]\ntimeout_sec = 0\n", r"\[verifier\] timeout_sec must be a positive number, got 0"),
    ("[agent]\ntimeout_sec = \"abc\"\n", r"timeout_sec must be a positive number, got 'abc'"),
    ("[environment]\nmemory = \"0\"\n", r"\[environment\] memory \(in MB\) must be a positive integer"),
    ("[environment]\npids_limit = 1.5\n", r"pids_limit must be a positive integer"),
    ("[environment]\nallow_internet = \"yes\"\n", r"allow_internet must be a bool"),
    # upper bounds: 1e10 s once overflowed inside the shared Docker client and broke every other task
    ("[verifier]\ntimeout_sec = 1e10\n", r"\[verifier\] timeout_sec must be at most 86400"),
    ("[agent]\ntimeout_sec = 1e300\n", r"\[agent\] timeout_sec must be at most 86400"),
    ("[environment]\nbuild_timeout_sec = 1e10\n", r"build_timeout_sec must be at most 86400"),
    ("[environment]\ncpus = 1e9\n", r"cpus must be at most 1024"),
    ("[environment]\nmemory = \"1e9G\"\n", r"memory \(in MB\) must be at most"),
    ("[environment]\nstorage = \"9999999999T\"\n", r"storage \(in MB\) must be at most"),
    ("[environment]\npids_limit = 99999999999\n", r"pids_limit must be at most"),
])
def test_bad_task_limits_are_one_line_errors(tmp_path, toml, message):
    d = write_task(tmp_path, "bad", toml=toml)
    with pytest.raises(C.TaskError, match=f"^{d / 'task.toml'}: .*{message}") as e:
        C.load_task(d)
    assert "\n" not in str(e.value)


def tool_call(cmd: str) -> str:
    return (f"<tool_call>\n<function=bash>\n<parameter=command>\n{cmd}\n</parameter>\n</function>\n"
            "</tool_call>")


class KillerOrSolver(FakeEngine):
    """Each episode sees its own prompt: the `killer` task's policy kills everything it can, the
    others solve their task."""

    def __init__(self):
        self.tokenizer = C.make_tiny_tokenizer()

    def generate(self, prompts, sampling, seeds=None):
        gens = []
        for p in prompts:
            seen = self.tokenizer.decode(p)
            if "<tool_response>" in seen:
                text = "Done."
            elif "KILLER" in seen:
                text = tool_call("kill -9 -1; kill 1; for p in /proc/[0-9]*; do kill -9 ${p#/proc/}; done")
            else:
                text = tool_call("echo ok > /app/out.txt")
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            gens.append(C.Generation(ids, [0.0] * len(ids), "stop"))
        return gens


def test_a_killing_policy_in_a_05_run_leaves_every_other_trial_scored(make_task, tmp_path, monkeypatch):
    ev = importlib.import_module("05_eval_tb2")
    make_task("killer", instruction="KILLER: write ok to /app/out.txt.")
    for name in ("good1", "good2", "good3"):
        make_task(name)
    monkeypatch.setattr(C, "make_engine", lambda *a, **k: KillerOrSolver())
    s = ev.main(["--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "ev"), "--agent", "policy",
                 "--model", "scripted", "--max-turns", "3", "--concurrency", "4", "--trials", "2"])
    rows = {(r["task"], r["trial"]): r for r in C.read_jsonl(tmp_path / "ev" / "trials.jsonl")}
    assert len(rows) == 8 and s["n_trials"] == 8
    assert all(rows[(t, k)]["reward"] == 1.0 for t in ("good1", "good2", "good3") for k in (0, 1))
    assert all(rows[("killer", k)]["reward"] == 0.0 for k in (0, 1))


def test_fork_mode_with_no_usable_state_is_refused(make_task, tmp_path):
    grpo = importlib.import_module("04_reterm_grpo")
    task = C.load_task(make_task("nostate"))
    state = C.FailureState("abc", task.name, "reterm-snap/gone:nope", [], [1], "timeout")
    C.append_jsonl(tmp_path / "failures.jsonl", __import__("dataclasses").asdict(state))
    model = C.make_tiny_model(tmp_path / "tiny", arch="qwen3")
    with pytest.raises(C.UserError, match="--mode fork: no usable failure state in .*failures.jsonl"):
        grpo.main(["--failures", str(tmp_path / "failures.jsonl"), "--model", str(model), "--out",
                   str(tmp_path / "grpo"), "--tasks", str(task.path.parent), "--steps", "1", "--engine", "hf",
                   "--fresh-frac", "0.5"])


def test_retry_errors_reruns_only_infrastructure_failures(make_task, tmp_path):
    ev = importlib.import_module("05_eval_tb2")
    make_task("a")
    out = tmp_path / "ev"
    infra = {"task": "a", "trial": 0, "category": "file-operations", "difficulty": "easy", "reward": 0.0,
             "error": C.infra_error("trial", C.EnvError("engine restarted")), "turns": 0}
    agent = infra | {"trial": 1, "error": "no reward file written (test.sh exit 1)"}
    C.append_jsonl(out / "trials.jsonl", infra)
    C.append_jsonl(out / "trials.jsonl", agent)
    args = ["--tasks", str(tmp_path / "tasks"), "--out", str(out), "--trials", "2"]
    assert ev.main(args)["pass_at_1"] == 0.0  # plain resume: nothing re-run
    s = ev.main(args + ["--retry-errors"])
    rows = C.read_jsonl(out / "trials.jsonl")
    assert len(rows) == 3 and rows[-1]["trial"] == 0 and rows[-1]["reward"] == 1.0
    assert (s["n_trials"], s["pass_at_1"], s["n_errors"]) == (2, 0.5, 1)  # the retried row replaces the old


def test_reap_spares_live_runs_unless_all(make_task):
    client, task = C.docker_client(), C.load_task(make_task("reap"))
    image = C.task_image(task)
    mine = C.start_env(task)  # labelled with this (live) process
    labels = {C.LABEL: "1", "reterm.run": "deadrun", "reterm.host": C.socket.gethostname(),
              "reterm.pid": "999999"}
    dead = client.containers.run(image, ["sleep", "60"], detach=True, labels=labels, network_mode="none")
    try:
        C.reap(run_id=None)
        ids = {c.id for c in client.containers.list(all=True, filters={"label": C.LABEL})}
        assert mine.container.id in ids and dead.id not in ids
    finally:
        mine.close()
        with __import__("contextlib").suppress(Exception):
            dead.remove(force=True)
