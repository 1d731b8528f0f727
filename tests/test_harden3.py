"""The third round of attacks, each against a real container: output the host reads only up to a
cap whatever writes it, execs that answer within a deadline (fork start-up included), a container
the agent killed blamed on the agent, and a verifier whose trust boundary holds by construction."""

from __future__ import annotations

import resource
import time

import batch_rollouts as R
import pytest
import test_harden2
from conftest import ScriptedEngine, call
from test_harden2 import TOML, bundled, plant, start

import common as C

pytestmark = pytest.mark.usefixtures("docker_ready")
tok = test_harden2.tok  # the tiny tokenizer, module-scoped


def test_output_written_around_the_capture_is_bounded_on_the_host(make_task):
    """The command writes 200 MiB to the tool shell's own stdout (/proc/PID/fd/1, past the capturer):
    the host reads at most the cap, the process grows by no more than a few MiB, the tool goes on."""
    with start(make_task, "flood") as env:
        outer = "o=$(awk '{print $4}' /proc/$PPID/stat)"  # inner shell -> timeout -> the harness's shell
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.monotonic()
        r = env.bash(f"{outer}; yes | head -c 200M > /proc/$o/fd/1; echo done")
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
        assert len(r.output) <= C.MAX_OUTPUT_BYTES + 200 and "written around" in r.output, len(r.output)
        assert r.exit_code == 137 and time.monotonic() - t0 < 60
        assert grown_kib < 8 * 1024, grown_kib
        assert env.bash("echo still here").output == "still here\n"
        v = env.verify()  # the verifier's exec is capped the same way
        assert (v.reward, v.error) == (0.0, None), v


@pytest.mark.parametrize("trusted", [False, True])
def test_a_planted_hanging_shell_fails_the_fork_fast(make_task, monkeypatch, trusted):
    """A snapshot whose `sh` and `bash` never return (first in the image's PATH, and in the
    distribution's): a fork of it starts on the toolchain (trusted), or fails within START_TIMEOUT
    with a clear error that is not `infra:` (its own tools, as for a pinned image)."""
    if not trusted:
        monkeypatch.setenv("RETERM_TRUSTED_VERIFY", "0")
    monkeypatch.setattr(C, "START_TIMEOUT", 10.0)
    with start(make_task, f"hangsh{int(trusted)}") as env:
        assert env.trusted == trusted
        env.bash("echo ok > /app/out.txt")
        for path in ("/usr/local/bin/sh", "/usr/local/sbin/bash", "/usr/sbin/sh"):
            plant(path, "exec sleep 100000", env)
        snap = env.snapshot()
        try:
            t0 = time.monotonic()
            if trusted:
                with C.start_env(env.task, snap) as fork:
                    assert fork.bash("cat /app/out.txt").output == "ok\n"
                    pid1 = fork.bash("tr '\\0' ' ' </proc/1/cmdline").output
                    assert pid1.startswith(f"{C.TOOLS}/.reterm/ld.so "), pid1
                assert env.verify(fresh=True) == C.Verdict(1.0, None, "")
            else:
                with pytest.raises(C.ContainerDied, match="gave no answer in 10s"):
                    C.start_env(env.task, snap)
                v = env.verify(fresh=True)
                assert v.reward == 0.0 and "no answer" in v.error and not C.is_infra_error(v.error), v
            assert time.monotonic() - t0 < 60
        finally:
            C.remove_image(snap)


OOM_TOML = TOML.replace('memory = "512M"', 'memory = "256M"')
# Eight hogs of 48 MB each: each smaller than PID 1's score once its oom_score_adj is 1000.
HOG = "for i in $(seq 8); do python3 -c 'import time; a = bytearray(48 << 20); time.sleep(30)' & done; wait"


def test_a_container_the_agent_killed_is_its_own_failure(make_task, tok):
    """PID 1 made the OOM killer's first choice, then a memory hog: the container stops. The episode
    scores 0 without `infra:` and stays in its group; verification says why."""
    lines = bundled("dedupe-files").env_dir.joinpath("Dockerfile").read_text().splitlines()
    task = C.load_task(make_task("oom", toml=OOM_TOML, dockerfile="\n".join(lines[:2]) + "\nWORKDIR /app\n"))
    with C.start_env(task) as env:
        env.bash(f"echo 1000 > /proc/1/oom_score_adj; {HOG}")
        with pytest.raises(C.ContainerDied, match="stopped from inside"):
            env.bash("echo hello")
        for fresh in (False, True):
            v = env.verify(fresh=fresh)
            assert v.reward == 0.0 and "stopped from inside" in v.error and not C.is_infra_error(v.error), v
    kill = "echo 1000 >/proc/1/oom_score_adj; " + HOG
    eng = ScriptedEngine(tok, [call("echo ok > /app/out.txt"), call(kill), call("cat /app/out.txt"), "Done."])
    with C.env_session():
        (ep,), _ = R.run_attempts([task], eng, C.RolloutConfig(max_turns=6, max_context=8192, concurrency=1,
                                                               verify_fresh=True))
    assert (ep.error, ep.reward, ep.end) == (None, 0.0, "container_died"), (ep.error, ep.end)
    assert "stopped from inside" in ep.verify_error and not C.is_infra_error(ep.verify_error)


def test_a_huge_integer_reward_is_the_trials_error(make_task):
    with start(make_task, "huge", test="mkdir -p /logs/verifier; echo '{\"reward\": 1%s}' >"
               " /logs/verifier/reward.json\n" % ("0" * 400)) as env:
        v = env.verify()
        assert v.reward == 0.0 and v.error.startswith("unparsable reward"), v


def test_pid_exhaustion_cannot_stop_pid_1(make_task):
    """PID 1 never forks (bash builtins only), so it needs no free pid: processes that escaped the
    command's marker hold every pid and PID 1 lives on. The tool answers that no process can start,
    and verification scores 0 without `infra:` (the agent's failure, not the engine's)."""
    with start(make_task, "pidx", "pids_limit = 64\n") as env:
        assert env.bash("cat /proc/1/task/1/children; echo end").output == "end\n"  # no child to kill
        env.bash("for i in $(seq 100); do env -u RETERM_CMD setsid sleep 1000 & done 2>/dev/null", timeout=5)
        time.sleep(2)
        env.container.reload()
        assert env.container.attrs["State"]["Running"]
        assert "Resource temporarily unavailable" in env.bash("echo hello").output
        v = env.verify()
        assert v.reward == 0.0 and not C.is_infra_error(v.error), v
