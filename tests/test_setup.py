"""setup.sh's install logic, run for real with stand-ins on PATH: a `python3` that records every call
(its environment's MAX_JOBS too) and can fail the kernel build or import, an `nvidia-smi` that does
or does not see a GPU, an `apt-get` that installs nothing. Nothing is installed; no GPU needed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import common as C

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


def _quota_mode(mnt) -> str:
    """The btrfs quota mode the kernel reports for the filesystem mounted at `mnt` (Linux >= 6.7)."""
    fsid = subprocess.run(["findmnt", "-no", "UUID", str(mnt)], capture_output=True, text=True).stdout.strip()
    mode = Path(f"/sys/fs/btrfs/{fsid}/qgroups/mode")
    return mode.read_text().strip() if mode.exists() else "off"


def test_the_engine_docker_up_starts_gets_a_btrfs_data_root_with_quotas(tmp_path, monkeypatch):
    """docker-up's storage flags, for real: a sparse loopback file, btrfs, mounted with SIMPLE quotas
    (full qgroups make each snapshot cost seconds to minutes), where a size limit on a subvolume
    stops a write at the limit; reused once mounted, switched to simple quotas if it has full
    qgroups; where the kernel has no simple quotas or there is no room, one line and the engine's
    defaults."""
    if os.geteuid() != 0 or not shutil.which("mkfs.btrfs"):
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs root and btrfs-progs (setup.sh installs them) for the quota engine")
        pytest.skip("a loopback btrfs needs root and btrfs-progs")
    img, mnt, lines = tmp_path / "engine.img", tmp_path / "root", []
    monkeypatch.setenv("RETERM_DOCKER_IMG", str(img))
    monkeypatch.setenv("RETERM_DOCKER_ROOT", str(mnt))
    monkeypatch.delenv("RETERM_STORAGE_QUOTA", raising=False)
    flags = C._quota_data_root(lines.append)
    try:
        assert flags == ["--storage-driver", "btrfs", "--data-root", f"{mnt}/docker"], lines
        assert os.path.ismount(mnt) and img.stat().st_blocks * 512 < 2**30 < img.stat().st_size  # sparse
        fs = subprocess.run(["stat", "-f", "-c", "%T", str(mnt)], capture_output=True, text=True).stdout
        assert fs.strip() == "btrfs", fs
        assert _quota_mode(mnt) == "squota"  # what the kernel says, and what the code reads
        assert C._btrfs_quota_mode(mnt) == "squota"
        subprocess.run(["btrfs", "-q", "subvolume", "create", str(mnt / "sv")], check=True)
        subprocess.run(["btrfs", "qgroup", "limit", "10M", str(mnt / "sv")], check=True)
        w = subprocess.run(f"head -c 20M /dev/zero > {mnt}/sv/f", shell=True, capture_output=True, text=True)
        assert "Disk quota exceeded" in w.stderr and (mnt / "sv/f").stat().st_size <= 10 * 2**20, w
        (mnt / "docker").mkdir()  # the host's reserve guards the folder of the file behind it too
        assert C._loop_backing(str(mnt / "docker")) == str(img) and C._loop_backing(str(tmp_path)) is None
        assert C._quota_data_root(lines.append) == flags and len(lines) == 1, lines  # reused, not rebuilt
        C._btrfs_quota_ctl(mnt, C._QUOTA_DISABLE)
        C._btrfs_quota_ctl(mnt, 1)  # full qgroups, as `btrfs quota enable` makes them
        assert _quota_mode(mnt) == "qgroup"
        assert C._quota_data_root(lines.append) == flags and "switching it to simple quotas" in lines[-1]
        assert _quota_mode(mnt) == "squota"
        C._btrfs_quota_ctl(mnt, C._QUOTA_DISABLE)  # for the kernel without simple quotas below
    finally:
        subprocess.run(["umount", str(mnt)], check=True)

    def old_kernel(path, cmd):
        raise OSError(22, "Invalid argument")  # what a kernel before 6.7 answers to ENABLE_SIMPLE

    monkeypatch.setattr(C, "_btrfs_quota_ctl", old_kernel)
    assert C._quota_data_root(lines.append) == [] and not os.path.ismount(mnt)  # unmounted again
    assert "no simple btrfs quotas (errno 22" in lines[-1] and "\n" not in lines[-1], lines[-1]
    monkeypatch.setenv("RETERM_DOCKER_IMG", str(tmp_path / "none.img"))
    monkeypatch.setenv("RETERM_DOCKER_ROOT", str(tmp_path / "none"))
    monkeypatch.setenv("RETERM_DISK_FLOOR_MB", str(2**40))  # no room left for it
    assert C._quota_data_root(lines.append) == [] and not (tmp_path / "none.img").exists()
    assert lines[-1].startswith("no kernel storage quota for the engine (") and "\n" not in lines[-1], lines
