"""setup.sh's install logic, run for real with stand-ins on PATH: a `python3` that records every call
(its environment's MAX_JOBS too) and can fail the kernel build or import, an `nvidia-smi` that does
or does not see a GPU, an `apt-get` that installs nothing. Nothing is installed; no GPU needed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/bin/sh
echo "MAX_JOBS=${MAX_JOBS:-unset} $*" >> "$SETUP_LOG"
case "$*" in
  *--no-build-isolation*) [ "${FAIL_BUILD:-0}" = 1 ] && exit 1 ;;
  "-c import"*) [ "${FAIL_IMPORT:-0}" = 1 ] && exit 1 ;;
esac
exit 0
"""


def run_setup(tmp_path: Path, gpu: bool, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    for name, text in (("python3", FAKE_PYTHON), ("nvidia-smi", f"#!/bin/sh\nexit {0 if gpu else 9}\n"),
                       ("apt-get", "#!/bin/sh\nexit 0\n")):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.write_text("")
    environ = {k: v for k, v in os.environ.items() if k not in ("MAX_JOBS", "RETERM_NO_KERNELS")}
    environ |= {"PATH": f"{bin_}:{os.environ['PATH']}", "SETUP_LOG": str(log)} | env
    res = subprocess.run(["bash", str(ROOT / "setup.sh")], env=environ, capture_output=True, text=True,
                         timeout=60)
    return res, log.read_text().splitlines()


def kernel_build(calls: list[str]) -> list[str]:
    return [c for c in calls if "--no-build-isolation" in c]


def test_gpu_kernel_build_failure_stops_setup(tmp_path):
    res, calls = run_setup(tmp_path, gpu=True, FAIL_BUILD="1")
    assert res.returncode != 0, res.stderr
    assert "did not build" in res.stderr and "RETERM_NO_KERNELS=1" in res.stderr, res.stderr
    (build,) = kernel_build(calls)
    assert "flash-attn==" in build and "causal-conv1d==" in build
    assert not any("docker-up" in c for c in calls), calls  # stopped before anything else ran


def test_gpu_kernels_that_build_but_do_not_import_stop_setup(tmp_path):
    res, calls = run_setup(tmp_path, gpu=True, FAIL_IMPORT="1")
    assert res.returncode != 0 and "RETERM_NO_KERNELS=1" in res.stderr, res.stderr
    assert any("import flash_attn, causal_conv1d, fla" in c for c in calls), calls


def test_opting_out_goes_on_without_the_kernels(tmp_path):
    res, calls = run_setup(tmp_path, gpu=True, FAIL_BUILD="1", RETERM_NO_KERNELS="1")
    assert res.returncode == 0, res.stderr
    assert "--batching pad" in res.stderr and any("common.py docker-up" in c for c in calls), calls


@pytest.mark.parametrize("given", [None, "3"])
def test_kernel_build_runs_with_max_jobs(tmp_path, given):
    res, calls = run_setup(tmp_path, gpu=True, **({"MAX_JOBS": given} if given else {}))
    assert res.returncode == 0, res.stderr
    (build,) = kernel_build(calls)
    jobs = build.split()[0].removeprefix("MAX_JOBS=")
    assert jobs == given if given else 1 <= int(jobs) <= os.cpu_count(), build


def test_cpu_machine_builds_no_kernels(tmp_path):
    res, calls = run_setup(tmp_path, gpu=False)
    assert res.returncode == 0, res.stderr
    assert not kernel_build(calls) and any("uninstall" in c and "torchvision" in c for c in calls), calls
    assert any("common.py docker-up" in c for c in calls)
