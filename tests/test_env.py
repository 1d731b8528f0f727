"""The environment layer against a real Docker engine: the bash tool, snapshot/fork,
verification and cleanup."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import batch_rollouts as R
import pytest
from conftest import ROOT

import common as C

pytestmark = pytest.mark.usefixtures("docker_ready")


def labelled(**labels: str) -> list:
    filters = {"label": [C.LABEL, *[f"{k}={v}" for k, v in labels.items()]]}
    return C.docker_client().containers.list(all=True, filters=filters, ignore_removed=True)


@pytest.fixture
def env(make_task):
    task = C.load_task(make_task("envtest"))
    with C.start_env(task) as e:
        yield e


def test_cwd_env_exit_codes_and_no_tests_before_verify(env):
    r = env.bash("pwd; cd /tmp && export FOO='a b'; mkdir -p work; cd work")
    assert (r.output, r.exit_code, r.timed_out) == ("/app\n", 0, False)
    r = env.bash("pwd; echo \"$FOO\"; ls /tests /solution 2>&1 | wc -l; exit 7")
    assert r.output.splitlines()[:2] == ["/tmp/work", "a b"]
    assert r.exit_code == 7
    assert env.bash("false").exit_code == 1
    assert env.bash("cat </dev/stdin; echo read-eof").output == "read-eof\n"  # stdin is closed
    assert env.bash("ls /tests").exit_code != 0


def test_timeout_kills_process_group_and_env_stays_usable(env):
    t0 = time.monotonic()
    r = env.bash("sleep 1000 & sleep 1000", timeout=2)
    assert r.timed_out and time.monotonic() - t0 < 10
    r = env.bash("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done; echo alive")
    assert "read -r -u 3" in r.output and "sleep 1000" not in r.output  # PID 1 lives, the sleeps died
    assert r.output.endswith("alive\n")
    assert not env.bash("sleep 0.1", timeout=5).timed_out


def test_output_truncation_keeps_head_and_tail(env):
    r = env.bash("echo HEAD; head -c 50000 /dev/zero | tr '\\0' x; echo; echo TAIL")
    assert r.output.startswith("HEAD\n") and r.output.endswith("TAIL\n")
    assert len(r.output.encode()) < C.MAX_OUTPUT_BYTES + 100
    omitted = int(r.output.split("[... ")[1].split(" bytes omitted")[0])
    assert omitted == 5 + 50000 + 1 + 5 - C.MAX_OUTPUT_BYTES
    small = env.bash("seq 1 5", max_bytes=100)
    assert small.output == "1\n2\n3\n4\n5\n"


def test_no_network_inside(env):
    r = env.bash("cat /sys/class/net/*/operstate 2>/dev/null; ls /sys/class/net")
    assert r.output.split() == ["unknown", "lo"]
    r = env.bash("exec 3<>/dev/tcp/1.1.1.1/80 && echo connected || echo refused", timeout=10)
    assert "connected" not in r.output


@pytest.mark.slow
def test_snapshot_fork_keeps_state_and_isolates_forks(env):
    env.bash("cd /tmp && export STAGE=half && echo progress > /app/partial.txt")
    snap = env.snapshot()
    try:
        forks = R.fork(snap, env.task, 3)
        try:
            for f in forks:
                assert f.bash("pwd; echo $STAGE; cat /app/partial.txt").output == "/tmp\nhalf\nprogress\n"
            forks[0].bash("echo mine > /app/only-in-fork0 && export STAGE=changed")
            assert forks[1].bash("ls /app/only-in-fork0").exit_code != 0
            assert forks[1].bash("echo $STAGE").output == "half\n"
            assert env.bash("ls /app/only-in-fork0").exit_code != 0
            again = R.fork(snap, env.task, 1)[0]
            assert again.bash("ls /app/only-in-fork0; echo $STAGE").output.endswith("half\n")
            again.close()
        finally:
            for f in forks:
                f.close()
        image = C.docker_client().images.get(snap)
        assert image.labels[C.LABEL] == "1" and image.labels["reterm.kind"] == "snapshot"
    finally:
        C.remove_image(snap)


@pytest.mark.slow
def test_verify_rewards_and_errors(make_task):
    task = C.load_task(make_task("v1"))
    with C.start_env(task) as e:
        assert e.verify().reward == 0.0
        e.bash("echo ok > /app/out.txt")
        v = e.verify()
        assert (v.reward, v.error) == (1.0, None)
    cases = {
        "none": ("echo no reward written", "no reward file"),
        "junk": ("mkdir -p /logs/verifier; echo banana > /logs/verifier/reward.txt", "unparsable"),
        "slow": ("sleep 100", "timed out"),
    }
    for name, (script, err) in cases.items():
        t = C.load_task(make_task(name, test=script,
                                  toml="[verifier]\ntimeout_sec = 2.0\n"))
        with C.start_env(t) as e:
            v = e.verify()
            assert v.reward == 0.0 and err in v.error, (name, v)
    script = "mkdir -p /logs/verifier; echo '{\"reward\": 0.5}' > /logs/verifier/reward.json"
    t = C.load_task(make_task("json", test=script))
    with C.start_env(t) as e:
        assert e.verify() == C.Verdict(0.5, None, "")
    # staged tests that cannot become /tests: the container's state, so the trial's error, not infra
    with C.start_env(t) as e:
        e.bash("mkdir -p /tests/x")  # a folder mv -T can't replace, once the stage no longer empties /tests
        C._VERIFY_STAGE, stage = C._VERIFY_STAGE.replace("rm -rf /tests ", "rm -rf "), C._VERIFY_STAGE
        try:
            v = e.verify()
        finally:
            C._VERIFY_STAGE = stage
    assert v.reward == 0.0 and not C.is_infra_error(v.error) and "could not put the tests" in v.error, v


@pytest.mark.slow
def test_eval_oracle_null_and_resume(make_task, tmp_path):
    ev = __import__("importlib").import_module("05_eval_tb2")
    make_task("a")
    make_task("b", solve="echo wrong > /app/out.txt")
    out = tmp_path / "ev"
    s = ev.main(["--tasks", str(tmp_path / "tasks"), "--out", str(out), "--trials", "2"])
    assert (s["pass_at_1"], s["n_tasks"], s["n_trials"]) == (0.5, 2, 4)
    rows = C.read_jsonl(out / "trials.jsonl")
    assert {(r["task"], r["trial"]) for r in rows} == {("a", 0), ("a", 1), ("b", 0), ("b", 1)}
    s2 = ev.main(["--tasks", str(tmp_path / "tasks"), "--out", str(out), "--trials", "2"])
    assert s2 == s and len(C.read_jsonl(out / "trials.jsonl")) == 4  # nothing re-run
    n = ev.main(["--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "null"), "--agent", "null"])
    assert n["pass_at_1"] == 0.0
    assert not labelled(**{"reterm.run": C.RUN_ID})


@pytest.mark.slow
def test_sigint_leaves_nothing_behind(make_task, tmp_path):
    make_task("hang", solve="sleep 1000")
    cmd = [sys.executable, str(ROOT / "05_eval_tb2.py"), "--tasks", str(tmp_path / "tasks"),
           "--out", str(tmp_path / "ev"), "--trials", "3", "--concurrency", "3"]
    # Ctrl-C's default action in the child, whatever ours is: a test run started in the background of
    # a shell without job control (nohup cmd &) ignores SIGINT, and a child inherits an ignored signal
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while len(labelled(**{"reterm.task": "hang"})) < 3 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert len(labelled(**{"reterm.task": "hang"})) == 3
    time.sleep(1.0)  # let the solve.sh commands start
    p.send_signal(signal.SIGINT)
    p.wait(timeout=60)
    assert not labelled(**{"reterm.task": "hang"}), p.stdout.read().decode()[-2000:]


@pytest.mark.slow
def test_env_is_thread_safe_under_concurrency(make_task):
    task = C.load_task(make_task("conc"))

    def one(i: int) -> str:
        with C.start_env(task) as e:
            e.bash(f"export I={i}; cd /tmp")
            return e.bash("echo $I $(pwd)").output

    results = dict(C.run_concurrently(one, list(range(6)), concurrency=6))
    assert results == {i: f"{i} /tmp\n" for i in range(6)}


def test_docker_unreachable_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(C, "_client", None)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    with pytest.raises(C.EnvError, match="Docker engine unreachable.*docker-up"):
        C.docker_client()
    monkeypatch.setattr(C, "_client", None)


def test_reap_keeps_failure_snapshots_unless_asked(env):
    kept, scratch = env.snapshot(keep=True), env.snapshot()
    images = C.docker_client().images
    C.reap(C.RUN_ID)
    assert images.list(filters={"reference": kept})
    assert not images.list(filters={"reference": scratch})
    C.reap(C.RUN_ID, kept=True)
    assert not images.list(filters={"reference": kept})


def test_old_toolchains_go_unless_in_use_and_this_checkouts_stays():
    """`reap --toolchains`: each change to the toolchain script builds a new image and volume; the old
    ones go, except a volume a container still mounts (here one created, never started)."""
    import io

    client, (tag, vol) = C.docker_client(), C.toolchain_names()
    assert C.toolchain() == vol
    labels = {C.LABEL: "1", "reterm.kind": "toolchain"}
    client.images.build(fileobj=io.BytesIO(f"FROM {C.BASE_IMAGE}\n".encode()), tag="reterm-toolchain:0ld0",
                        labels=labels, rm=True)
    old, used = (client.volumes.create(f"reterm-toolchain-0ld{i}", labels=labels) for i in (0, 1))
    holder = client.containers.create(C.BASE_IMAGE, ["true"], labels={C.LABEL: "1"},
                                      volumes={used.name: {"bind": "/t", "mode": "ro"}})
    try:
        images, volumes = C.remove_old_toolchains()
        assert images >= 1 and volumes >= 1
        assert not client.images.list(name="reterm-toolchain:0ld0")
        left = {v.name for v in client.volumes.list(filters={"label": "reterm.kind=toolchain"})}
        assert old.name not in left and {vol, used.name} <= left
        assert client.images.list(name=tag)
    finally:
        holder.remove(force=True)
        used.remove(force=True)


def test_reap_failures_removes_only_the_snapshots_those_records_name(env, tmp_path):
    """`python common.py reap --failures FILE`: what run_tiny.sh calls once 04 is done with 03's states."""
    named, other = env.snapshot(keep=True), env.snapshot(keep=True)
    C.append_jsonl(tmp_path / "failures.jsonl", {"snapshot": named, "host": None})
    r = subprocess.run([sys.executable, str(ROOT / "common.py"), "reap", "--failures",
                        str(tmp_path / "failures.jsonl")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "1 failure records" in r.stdout, r.stderr
    images = C.docker_client().images
    assert not images.list(filters={"reference": named})
    assert images.list(filters={"reference": other})
    C.remove_image(other)
