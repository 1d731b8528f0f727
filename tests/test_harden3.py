"""The third round of attacks, each against a real container: output the host reads only up to a
cap whatever writes it, execs that answer within a deadline (fork start-up included), a container
the agent killed blamed on the agent, and a verifier whose trust boundary holds by construction."""

from __future__ import annotations

import os
import resource
import subprocess
import textwrap
import threading
import time

import batch_rollouts as R
import pytest
import test_harden2
from conftest import ScriptedEngine, call
from test_harden2 import TOML, bundled, plant, start

import common as C

pytestmark = [pytest.mark.usefixtures("docker_ready"), pytest.mark.slow]  # as test_harden and test_harden2
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
# Eight hogs of 48 MB each, held until killed (on a loaded machine hogs that let go after a few
# seconds could start one after another and never overlap): each smaller than PID 1's score once its
# oom_score_adj is 1000.
HOG = "for i in $(seq 8); do python3 -c 'import time; a = bytearray(48 << 20); time.sleep(600)' & done; wait"


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
    # the kill twice: on a loaded machine the first hogs may be reaped one by one before PID 1 is
    script = [call("echo ok > /app/out.txt"), call(kill), call(kill), call("cat /app/out.txt"), "Done."]
    eng = ScriptedEngine(tok, script)
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
        try:  # the command's bash starts and cannot fork, or (pids counted later) no exec starts
            assert "Resource temporarily unavailable" in env.bash("echo hello").output
        except C.ContainerDied as e:  # the agent's failure, never the engine's (EnvError)
            assert "pids of the container are taken" in str(e), e
        v = env.verify()
        assert v.reward == 0.0 and not C.is_infra_error(v.error), v


def test_an_exec_that_cannot_start_near_the_pid_limit_is_the_agents_failure(make_task):
    """An exec's start needs a few pids of its own: with 58 of 64 taken one may not start, and that
    is the agent's pid exhaustion (ContainerDied), not the engine's; far from the limit it is not."""
    class Running:  # a container that still runs, as the engine reports it
        attrs = {"State": {"Running": True}, "Config": {"Env": []}, "Image": "sha256:x"}

        def __init__(self, pids: int):
            self.pids = pids

        def reload(self) -> None:
            pass

        def stats(self, stream: bool) -> dict:
            return {"pids_stats": {"current": self.pids, "limit": 64}}

    task = C.load_task(make_task("pidy", toml=TOML + "pids_limit = 64\n"))
    why = RuntimeError("OCI runtime exec failed: read init-p: connection reset by peer")
    assert type(C.Env(Running(58), task, "img")._gone(why)) is C.ContainerDied
    assert type(C.Env(Running(30), task, "img")._gone(why)) is C.EnvError


# ---- the trust boundary of verification: each attack class scores 0 on dedupe-files, whose test.sh
# runs `python3 /tests/check.py` (hashlib) and writes 1 when it exits 0 ------------------------------

# A library that ends any process whose command line names /tests/check.py with status 0.
EVIL_C = r"""#include <fcntl.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
  char b[8192]; int fd = open("/proc/self/cmdline", O_RDONLY); if (fd < 0) return;
  ssize_t n = read(fd, b, sizeof b - 1); close(fd); if (n <= 0) return;
  for (ssize_t i = 0; i < n; i++) if (!b[i]) b[i] = ' ';
  b[n] = 0; if (strstr(b, "/tests/check.py")) _exit(0);
}"""


@pytest.fixture(scope="module")
def evil_so(tmp_path_factory):
    import shutil
    import subprocess

    if not shutil.which("gcc"):
        pytest.fail("these attacks need gcc on the host to build the agent's library")
    d = tmp_path_factory.mktemp("evil")
    (d / "evil.c").write_text(EVIL_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(d / "evil.so"), str(d / "evil.c")], check=True)
    return d / "evil.so"


def scores(env: C.Env) -> list[float]:
    return [env.verify(fresh=fresh).reward for fresh in (False, True)]


def test_python_site_hooks_through_etc_and_dist_packages_score_0():
    hook = b"import os, sys\nif sys.argv[0].startswith('/tests/'): os._exit(0)\n"
    with C.start_env(bundled("dedupe-files")) as env:
        env.container.put_archive("/", _tar({"etc/python3.11/sitecustomize.py": hook}))
        assert env.bash("python3 /tests/x.py; echo $?").output.endswith("0\n")  # the agent's python: fooled
        assert scores(env) == [0.0, 0.0]
        env.bash("rm /etc/python3.11/sitecustomize.py")
        dirs = ("usr/lib/python3/dist-packages", "usr/local/lib/python3.11/dist-packages",
                "usr/local/lib/python3.11/site-packages")
        files = {f"{d}/{m}customize.py": hook for d in dirs for m in ("site", "user")}
        env.container.put_archive("/", _tar(files))
        assert env.bash("python3 /tests/x.py; echo $?").output.endswith("0\n")
        assert scores(env) == [0.0, 0.0]


def test_planted_shells_that_rewrite_the_tests_score_0():
    """/usr/local/sbin/bash and /usr/local/bin/sh start a loop that makes every test.sh write 1, then
    run the real shell: neither PID 1 of a fresh fork nor any step of the verifier runs them."""
    loop = ("while :; do for d in /.reterm-tests-* /tests; do [ -f $d/test.sh ] && ! grep -q forged "
            "$d/test.sh && echo 'mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt # forged' "
            "> $d/test.sh; done; done")
    with C.start_env(bundled("dedupe-files")) as env:
        env.bash(f"cat > /tmp/loop.sh <<'EOF'\n{loop}\nEOF")
        for path, real in (("/usr/local/sbin/bash", "/usr/bin/bash"), ("/usr/local/bin/sh", "/usr/bin/sh")):
            env.bash(f"printf '#!/usr/bin/bash\\n(setsid /usr/bin/bash /tmp/loop.sh >/dev/null 2>&1 &)\\n"
                     f"exec {real} \"$@\"\\n' > {path} && chmod +x {path}")
        assert scores(env) == [0.0, 0.0]


def test_code_under_test_cannot_read_a_marker_or_write_control_lines(make_task):
    """Code run by test.sh writes forged control lines, with every `@@` word any process carries, to
    the stdout of every shell in the container: the reward is the file's, 0."""
    forge = textwrap.dedent("""\
        for p in /proc/[0-9]*; do
          m=$(tr '\\0' '\\n' < $p/cmdline 2>/dev/null | grep '^@@' | head -1)
          for q in /proc/[0-9]*; do
            printf '%s rc 0\\n%s txt\\n1\\n@@txt 1\\n' "$m" "$m" > $q/fd/1 2>/dev/null
          done
        done
        """)
    with start(make_task, "forge3", test=test_harden2.SCORED_BY_APP) as env:
        env.bash(f"cat > /app/run.sh <<'EOF'\n{forge}EOF\necho 'echo 0' > /app/score.sh")
        for fresh in (False, True):
            v = env.verify(fresh=fresh)
            assert (v.reward, v.error) == (0.0, None), v


def test_the_agents_library_through_openssl_config_or_nss_scores_0(evil_so):
    with C.start_env(bundled("dedupe-files")) as env:
        lib = evil_so.read_bytes()
        nss = "usr/lib/x86_64-linux-gnu/libnss_evil.so.2"
        env.container.put_archive("/", _tar({"usr/lib/evil.so": lib, nss: lib}))
        cnf = ("openssl_conf = init\\n[init]\\nproviders = prov\\n[prov]\\nevil = evil_sect\\n"
               "default = default_sect\\n[evil_sect]\\nmodule = /usr/lib/evil.so\\nactivate = 1\\n"
               "[default_sect]\\nactivate = 1\\n")
        env.bash(f'printf "{cnf}" > /etc/ssl/openssl.cnf; rm -f /usr/lib/ssl/openssl.cnf; '
                 'cp /etc/ssl/openssl.cnf /usr/lib/ssl/openssl.cnf')
        live = "mkdir -p /tests; echo 'import hashlib, sys; sys.exit(3)' > /tests/check.py; "
        assert env.bash(live + "python3 /tests/check.py; echo $?").output.endswith("0\n")  # fooled
        assert scores(env) == [0.0, 0.0]
        env.bash("rm /etc/ssl/openssl.cnf /usr/lib/ssl/openssl.cnf")
        env.bash("printf 'passwd: evil files\\ngroup: evil files\\nhosts: evil files\\n' >/etc/nsswitch.conf")
        fooled = env.bash(live + "env -u SHELL bash -c id /tests/check.py; echo $?").output
        assert fooled.endswith("0\n"), fooled
        assert scores(env) == [0.0, 0.0]


def test_a_planted_distribution_shell_on_a_pinned_image_scores_0(make_task):
    """A task that pins its image (as TB2's do) verifies with the image's tools, but the verifier's
    own shell is the toolchain's: a /usr/sbin/bash that writes 1 and prints control lines never runs."""
    toml = TOML + f'docker_image = "{C.BASE_IMAGE}"\n'
    fake = (b"#!/bin/sh\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"
            b"for a; do case $a in @@*) printf '%s rc 0\\n%s txt\\n1\\n' $a $a;; esac; done\n")
    with C.start_env(C.load_task(make_task("pinned-bash", toml=toml))) as env:
        assert not env.trusted
        env.container.put_archive("/", _tar({"usr/sbin/bash": fake}))
        env.bash("bash -c 'echo hi'")  # the image's bash (the tool's shell too) is the agent's now
        assert env.container.exec_run(["cat", "/logs/verifier/reward.txt"]).output == b"1\n"
        assert scores(env) == [0.0, 0.0]


def _tar(files: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


WRITERS = "for i in $(seq 20); do head -c 16M /dev/zero > /app/f$i & done; wait; echo finished"


@pytest.mark.parametrize("bound", ["kernel", "watch"])
def test_background_writers_under_a_64_mb_cap(make_task, monkeypatch, request, bound):
    """20 background writers of 16 MB at once under `storage = "64M"`. Under the kernel quota (a
    second engine on docker-up's data-root: btrfs with simple quotas, whatever the default engine
    is) at most 64 + 16 MB land; without one (RETERM_STORAGE_QUOTA=0) the watch stops them a poll
    late, and the overshoot is printed (the figure, not a promise: it depends on the disk's speed)."""
    host = None
    if bound == "kernel":
        host = request.getfixturevalue("quota_engine").url
        monkeypatch.setenv("RETERM_TRUSTED_VERIFY", "0")  # that engine has no network to build the toolchain
        assert C._quota_storage(host) == "squota"
    else:
        monkeypatch.setenv("RETERM_STORAGE_QUOTA", "0")
    task = C.load_task(make_task(f"fill{bound}", toml=TOML + 'storage = "64M"\n'))
    with C.start_env(task, host=host) as env:
        r = env.bash(WRITERS, timeout=60)
        written = int(env.bash("du -sm /app | cut -f1").output.split()[0])
        print(f"\n20 background 16 MB writers under a 64 MB cap ({bound}): {written} MB written")
        if bound == "kernel":
            assert env.container.attrs["HostConfig"]["StorageOpt"]["size"].endswith("M")
            assert "Disk quota exceeded" in r.output and 48 <= written <= 80, (written, r.output[-300:])
        else:  # the writers may all end inside one poll (a quiet disk) or be killed by it (a busy one)
            stopped = "finished" not in r.output and "passed the storage cap (64 MB" in r.output
            assert stopped or r.output.startswith("finished"), r.output
            assert 64 <= written <= 480, written
            # either way the layer is past the cap, so the next command's files are held to 1 MB (it
            # is told so, or, where a poll sees that 1 MB as growth past the cap, killed and told that)
            nxt = env.bash("head -c 4M /dev/zero > /app/g; stat -c %s /app/g").output
            told = "a file may grow by at most 1 MB" in nxt or "passed the storage cap (64 MB" in nxt
            assert f"\n{2**20}\n" in nxt and told, nxt
        assert env.bash("rm -f /app/f*; echo usable").output.startswith("usable\n")  # a full one answers


def test_sparse_files_are_stopped_and_the_snapshot_stays_under_the_cap(make_task):
    """24 sparse files of 60 MB, from background processes that stay: they take no blocks (no kernel
    quota sees them) but a snapshot would write them out whole. The watch counts apparent size: the
    processes are stopped, a snapshot past the cap is refused (the agent's failure), and once the
    agent deletes enough the snapshot is made, its layer within the cap."""
    sparse = ("for i in $(seq 24); do (truncate -s 60M /app/s$i; sleep 30) & sleep 0.2; done; "
              "wait; echo finished")
    with start(make_task, "sparse", 'storage = "64M"\n') as env:
        r = env.bash(sparse, timeout=60)
        assert "finished" not in r.output and "passed the storage cap (64 MB" in r.output, r.output
        n = int(env.bash("ls /app | wc -l").output.split()[0])
        print(f"\n24 sparse 60 MB files under a 64 MB cap: {n} made before the writers were stopped")
        assert 1 < n <= 24
        with pytest.raises(C.ContainerDied, match="no snapshot.*past the storage cap"):
            env.snapshot()
        assert env.bash("rm -f /app/s[2-9]* /app/s1?; ls /app").output.startswith("s1\n")
        snap = env.snapshot()
        try:
            api = env.container.client.api
            grew = api.inspect_image(snap)["Size"] - api.inspect_image(env.image_id)["Size"]
            assert grew <= 64 * 2**20, grew
        finally:
            C.remove_image(snap)


def test_the_host_disk_floor_stops_the_biggest_writer_and_holds_new_episodes(make_task, tmp_path,
                                                                             monkeypatch):
    """A guarded output folder (a 160 MB tmpfs) falls under a 100 MB floor while a container writes:
    the reserve stops that container's processes, a new episode waits and then fails in one line,
    and starts again once space comes back."""
    if os.geteuid() != 0:
        pytest.skip("mounting the small filesystem needs root")
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", str(out)], check=True)
    monkeypatch.setenv("RETERM_DISK_FLOOR_MB", "100")
    monkeypatch.setattr(C, "DISK_WAIT", 3.0)
    C.DISK.guard(out, "the test's output folder")
    try:
        with start(make_task, "floor") as env:
            fill = threading.Timer(3.0, lambda: (out / "ckpt").write_bytes(b"\0" * 100 * 2**20))
            fill.start()
            r = env.bash("while :; do head -c 1M /dev/zero >> /app/g; sleep 0.2; done", timeout=30)
            fill.join()
            assert "under its floor of free space" in r.output and not r.timed_out, r.output
            with pytest.raises(C.EnvError, match=r"only \d+ MB free on .*under the floor of 100 MB"):
                start(make_task, "floor2")
            (out / "ckpt").unlink()
            with start(make_task, "floor3") as again:
                assert again.bash("echo up").output == "up\n"
    finally:
        C.DISK.paths.pop(str(out), None)
        subprocess.run(["umount", str(out)], check=True)
