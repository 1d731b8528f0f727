"""Shared fixtures: a real Docker engine (bootstrapped if we can), tiny task folders."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import docker
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # batch_rollouts: the tests' and benchmarks' batch helpers

import common as C  # noqa: E402


def _docker_missing() -> str | None:
    """Why docker_ready will skip here (None: an engine answers, or root on Debian can start one)."""
    try:
        docker.from_env(timeout=3).ping()
        return None
    except Exception:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            return None  # docker_up installs and starts dockerd
        return "no Docker engine answers and this is not root on Debian (start dockerd or set DOCKER_HOST)"


def _second_engine_missing() -> str | None:
    if os.geteuid() != 0 or not shutil.which("dockerd"):
        return "a second Docker engine needs root and dockerd"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Every test that needs the Docker engine carries the `docker` marker (-m "not docker")."""
    for item in items:
        if "docker_ready" in item.fixturenames:
            item.add_marker(pytest.mark.docker)


def pytest_collection_finish(session) -> None:
    """Outside CI, one line up front when Docker (or root, for the second engine) is missing: how
    many of the selected tests will skip, and why. Under CI=true those tests fail instead."""
    if os.environ.get("CI") == "true":
        return
    docker_why, second_why = _docker_missing(), _second_engine_missing()
    skip = {}
    for item in session.items:
        if docker_why and "docker_ready" in item.fixturenames:
            skip[item.nodeid] = docker_why
        elif second_why and {"second_engine", "quota_engine"} & set(item.fixturenames):
            skip[item.nodeid] = second_why
    if skip:
        why = "; ".join(dict.fromkeys(skip.values()))
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"NOTE: {len(skip)} of {len(session.items)} tests will skip: {why}. CI=true makes them fail.")


@pytest.fixture(scope="session")
def docker_ready() -> None:
    """Engine up + base image present. Without one, docker tests skip with the reason —
    except under CI=true, where a missing engine is a failure."""
    try:
        C.docker_up(log=lambda s: None)
        C.docker_client()
    except Exception as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs a Docker engine: {e}")
        pytest.skip(f"no Docker engine: {e}")


@pytest.fixture(scope="session")
def vllm_ready():
    """vLLM, for a test that needs it. Without it the test skips with the reason — except under
    CI=true, where a missing vLLM is a failure."""
    try:
        import vllm
    except ImportError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs vLLM: {e}")
        pytest.skip(f"no vLLM: {e}")
    return vllm


def write_task(root: Path, name: str, *, solve: str = "echo ok > /app/out.txt",
               test: str | None = None, toml: str | None = None, dockerfile: str | None = None,
               instruction: str = "Write ok to /app/out.txt.") -> Path:
    """A minimal Harbor task folder (FROM the base image, no apt layer: builds in ~1 s)."""
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "instruction.md").write_text(instruction + "\n")
    (d / "task.toml").write_text(toml if toml is not None else textwrap.dedent("""\
        version = "1.0"
        [metadata]
        category = "file-operations"
        difficulty = "easy"
        [agent]
        timeout_sec = 60.0
        [verifier]
        timeout_sec = 30.0
        [environment]
        cpus = 1
        memory = "512M"
        allow_internet = false
        """))
    (d / "environment" / "Dockerfile").write_text(
        dockerfile or f"FROM {C.BASE_IMAGE}\nWORKDIR /app\n")
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\nset -e\n{solve}\n")
    (d / "tests" / "test.sh").write_text(test if test is not None else textwrap.dedent("""\
        mkdir -p /logs/verifier
        r=0; [ "$(cat /app/out.txt 2>/dev/null)" = ok ] && r=1
        echo $r > /logs/verifier/reward.txt
        """))
    return d


@pytest.fixture
def make_task(tmp_path: Path):
    return lambda name="t", **kw: write_task(tmp_path / "tasks", name, **kw)


def call(cmd: str) -> str:
    """A model turn that calls the bash tool (Qwen3.5 format)."""
    return (f"<tool_call>\n<function=bash>\n<parameter=command>\n{cmd}\n</parameter>\n</function>\n"
            "</tool_call>")


class FakeEngine:
    """What every test engine shares with the real ones besides generate: a stage closes the engine
    it made."""

    def close(self) -> None:
        pass


class ScriptedEngine(FakeEngine):
    """Engine interface, but each episode's turns come from a script: tests know the truth.
    Episodes advance on their own clocks, so a prompt's turn is found from its own history: it
    extends the prompt of that episode's previous turn (load() starts a new script at turn 0)."""

    def __init__(self, tokenizer, script: list[str]):
        self.tokenizer = tokenizer
        self.load(script)

    def load(self, script: list[str]) -> None:
        self.script, self.turn_of = script, {}

    def turn(self, prompt: list[int]) -> int:
        prev = [len(p) for p in self.turn_of if len(p) < len(prompt) and tuple(prompt[: len(p)]) == p]
        return self.turn_of.setdefault(tuple(prompt), self.turn_of[tuple(prompt[: max(prev)])] + 1
                                       if prev else 0)

    def generate(self, prompts, sampling, seeds=None):
        gens = []
        for p in prompts:
            t = self.turn(p)
            text = self.script[t] if t < len(self.script) else "Done."
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            gens.append(C.Generation(ids, [-0.5] * len(ids), "stop"))
        return gens


class SecondEngine:
    """A second dockerd on this machine, as a stand-in for another node's engine: its own socket,
    data-root, exec-root, pidfile and network namespace, and no bridge (containers run with network
    none, as the bundled tasks do). Seeded with the base image from the default engine (save | load).
    quota="squota": its data-root is the one docker-up builds (common._quota_data_root: a loopback
    btrfs with simple quotas, here in its own folder); "qgroup": the same with full qgroups (for the
    benchmark only)."""

    def __init__(self, quota: str = ""):
        self.dir = Path(tempfile.mkdtemp(prefix="reterm-d2-"))
        self.url, self.proc, self.quota = f"unix://{self.dir}/sock", None, quota
        self.root = ["--data-root", f"{self.dir}/root"]  # its storage flags (see _quota_root)

    def _quota_root(self) -> list[str]:
        """docker-up's storage flags, on a loopback file and mount in this engine's folder."""
        lines: list[str] = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RETERM_DOCKER_IMG", f"{self.dir}/engine.img")
            mp.setenv("RETERM_DOCKER_ROOT", f"{self.dir}/mnt")
            mp.delenv("RETERM_STORAGE_QUOTA", raising=False)
            flags = C._quota_data_root(lines.append)
        if not flags:
            raise RuntimeError(lines[-1])
        if self.quota == "qgroup":
            C._btrfs_quota_ctl(f"{self.dir}/mnt", C._QUOTA_DISABLE)
            C._btrfs_quota_ctl(f"{self.dir}/mnt", 1)  # BTRFS_QUOTA_CTL_ENABLE: full qgroups
        return flags

    def start(self) -> SecondEngine:
        d = self.dir
        if self.quota and self.root[0] != "--storage-driver":
            self.root = self._quota_root()
        log = open(d / "dockerd.log", "ab")
        self.proc = subprocess.Popen(
            # its own network namespace: with --bridge=none dockerd deletes any `docker0` link it
            # sees, which would take the default engine's bridge away from every other test
            ["unshare", "--net", "dockerd", "--host", self.url, *self.root,
             "--exec-root", f"{d}/exec", "--pidfile", f"{d}/pid", "--bridge=none", "--iptables=false",
             "--ip-masq=false"],
            stdout=log, stderr=log, start_new_session=True)
        for _ in range(120):
            time.sleep(0.25)
            with contextlib.suppress(Exception):
                docker.DockerClient(base_url=self.url, timeout=5).ping()
                break
        else:
            raise RuntimeError(f"second dockerd did not start; see {d}/dockerd.log")
        client = docker.DockerClient(base_url=self.url, timeout=600)
        if not client.images.list(name=C.BASE_IMAGE):
            client.images.load(C.docker_client().api.get_image(C.BASE_IMAGE))
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # dockerd stops its containers and unmounts its layers
            self.proc.wait(60)

    def remove(self) -> None:
        """Stop it and delete its folder (its loopback btrfs unmounted first: the loop device goes)."""
        self.stop()
        if os.path.ismount(self.dir / "mnt"):
            subprocess.run(["umount", "-R", str(self.dir / "mnt")], check=True)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def second_engine(docker_ready):
    """The URL of a second real Docker engine (started here, stopped and deleted at the end)."""
    if os.geteuid() != 0 or not shutil.which("dockerd"):
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs root and dockerd for the two-engine tests")
        pytest.skip("a second Docker engine needs root and dockerd")
    eng = SecondEngine().start()
    try:
        yield eng
    finally:
        eng.remove()


@pytest.fixture(scope="session")
def quota_engine(docker_ready):
    """A second real engine whose storage the kernel bounds: its data-root is docker-up's (a
    loopback btrfs with simple quotas, built by common._quota_data_root in a temporary folder), so
    the kernel quota is tested whatever the default engine is. Under CI=true a failure to build it
    fails the test."""
    why = _second_engine_missing() or (None if shutil.which("mkfs.btrfs") else "no btrfs-progs")
    eng = None if why else SecondEngine(quota="squota")
    try:
        if eng:
            eng.start()
    except Exception as e:  # noqa: BLE001 -- whatever stops it, the test reports it
        why = f"no engine on a quota data-root: {e}"
    if why:
        if eng:
            eng.remove()
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs the quota engine: {why}")
        pytest.skip(why)
    try:
        yield eng
    finally:
        eng.remove()


@pytest.fixture(scope="session")
def learning_run(docker_ready, tmp_path_factory) -> tuple[Path, list[str], dict]:
    """bench/experiment_learning.py --sft-only end to end at a toy size, run once for the session: (its
    --out, its argv, its results). A 64x2 model, a few steps, a GRPO pool kept out of SFT, --stale-vary
    entries with --stale-compose names, and --entry-split dev twins: a block for experiment_paired.py
    (its bank: the dev twins' failure states, forked twice each), whose end-to-end test runs the GRPO
    chunks (grpo_chunk) and forks (recovery_at_1) after SFT; the GRPO flags here are the block's recipe
    for it. run_seed's own chunk loop after SFT is test_learning's stubbed test: running it here would
    run the same 04 chunks and forks a second time."""
    import importlib.util
    import json

    import experiment_learning as E

    out = tmp_path_factory.mktemp("learning") / "exp"
    argv = ["--out", str(out), "--seeds", "1", "--n-train", "8", "--n-heldout", "3", "--pool-frac", "0.05",
            "--stale-frac", "0.5", "--stale-vary", "--stale-compose", "--entry-split", "--plain-frac", "1",
            "--hidden", "64", "--layers", "2", "--warmup-steps", "10", "--warmup-extra", "0",
            "--sft-steps", "10", "--attempts", "1", "--pool-tasks", "3", "--grpo-steps", "1",
            "--eval-every", "1", "--batch-states", "2", "--group-size", "2", "--recovery-samples", "2",
            "--eval-trials", "1", "--max-turns", "2", "--max-tokens", "32", "--bootstrap", "50",
            "--concurrency", "4", "--n-dev", "3", "--eval-on", "dev", "--no-plain-standard", "--sft-only"]
    if not importlib.util.find_spec("vllm"):
        argv += ["--engine", "hf"]
    return out, argv, json.loads(json.dumps(E.main(argv)))  # as JSON holds it (tuples become lists)
