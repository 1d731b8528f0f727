"""Storage engines side by side, in one run (not a test): what `docker commit`, a run from the
snapshot and `docker rm` cost on the running engine and on engines started here (own dockerd, own
socket, no network) on a loopback btrfs: with simple quotas (docker-up's data-root) and, with
--full N, with full qgroups over N snapshot cycles, each cycle forking the last snapshot (layers
accumulate, as in a GRPO run). Then the margin docker-up's engine adds to a storage cap: what a
fresh container's own qgroup holds, and what one writer gets under `--storage-opt size=64M`.

    python bench/bench_storage.py [--n 6] [--full 12]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import docker  # noqa: E402
from conftest import SecondEngine  # noqa: E402

import common as C  # noqa: E402

RUN = {"command": ["sleep", "600"], "detach": True, "network_mode": "none", "labels": {C.LABEL: "1"}}
WRITE = "head -c 8M /dev/urandom > /f && seq 2000 > /g"  # what a cycle's agent leaves behind


def cycles(client, n: int, size: str | None) -> list[tuple[float, float, float]]:
    """n snapshot cycles, each from the last snapshot: (commit, run from it, rm) seconds each."""
    image, made, times, opt = C.BASE_IMAGE, [], [], {"storage_opt": {"size": size}} if size else {}
    live = []
    try:
        for i in range(n):
            c = client.containers.run(image, **RUN, **opt)
            live.append(c)
            c.exec_run(["sh", "-c", WRITE])
            t0 = time.perf_counter()
            img = c.commit(repository="reterm-bench/storage", tag=str(i), changes=[f"LABEL {C.LABEL}=1"])
            t1 = time.perf_counter()
            made.append(img.id)
            fork = client.containers.run(img.id, **RUN, **opt)
            t2 = time.perf_counter()
            fork.remove(force=True)
            times.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
            image = img.id
    finally:
        for c in live:
            with contextlib.suppress(docker.errors.NotFound):
                c.remove(force=True)
        for i in reversed(made):
            client.images.remove(i, force=True)
    return times


def show(name: str, times: list[tuple[float, float, float]]) -> None:
    cols = list(zip(*times, strict=True))
    med = [statistics.median(c) for c in cols]
    cells = [f"{m:6.2f} ({min(c):.2f}-{max(c):.2f})" for m, c in zip(med, cols, strict=True)]
    print(f"{name:<44}" + "".join(f"{c:<18}" for c in cells))


def margin(eng: SecondEngine) -> None:
    """A fresh container's own qgroup (what its start writes: metadata), and what a writer gets
    under size=64M."""
    client = docker.DockerClient(base_url=eng.url, timeout=600)
    root = client.info()["DockerRootDir"]
    c = client.containers.run(C.BASE_IMAGE, **RUN, storage_opt={"size": "64M"})
    try:
        c.exec_run(["sh", "-c", "mkdir -p /var/lib/reterm && echo /app > /var/lib/reterm/cwd"])
        mount = Path(root, "image/btrfs/layerdb/mounts", c.id, "mount-id").read_text().strip()
        sub = Path(root, "btrfs/subvolumes", mount)
        subprocess.run(["sync"], check=True)
        show_q = ["btrfs", "qgroup", "show", "--raw", "-ref", str(sub)]
        fresh = subprocess.run(show_q, capture_output=True, text=True).stdout.splitlines()[-1]
        out = c.exec_run(["sh", "-c", "head -c 100M /dev/zero > /f; sync; stat -c %s /f"]).output.decode()
        full = subprocess.run(show_q, capture_output=True, text=True).stdout.splitlines()[-1]
    finally:
        c.remove(force=True)
    print("\n== the margin (simple quotas, --storage-opt size=64M) ==")
    print(f"a fresh container's qgroup (id, referenced, exclusive, max ref, max excl): {fresh}")
    print(f"one writer of 100 MB: {out.strip().splitlines()[-1]} bytes written "
          f"({int(out.split()[-1]) / 2**20:.2f} MiB); its qgroup then: {full}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=6, help="snapshot cycles per engine")
    ap.add_argument("--full", type=int, default=0, help="also full qgroups, over this many cycles")
    args = ap.parse_args()
    driver = C.docker_client().info()["Driver"]
    rows = [(f"the running engine ({driver})", cycles(C.docker_client(), args.n, None))]
    engines = [("btrfs, simple quotas (docker-up's)", "squota", args.n)]
    if args.full:
        engines.append(("btrfs, full qgroups", "qgroup", args.full))
    for name, quota, n in engines:
        eng = SecondEngine(quota=quota).start()
        try:
            size = "128M" if quota == "squota" else "4G"  # full qgroups count the image's layers too
            times = cycles(docker.DockerClient(base_url=eng.url, timeout=900), n, size)
            if quota == "qgroup":  # the growth: first and last cycles apart
                rows += [(f"{name}, cycles 1-3", times[:3]), (f"{name}, cycles {n - 2}-{n}", times[-3:])]
            else:
                rows.append((name, times))
                margin(eng)
        finally:
            eng.remove()
    print(f"\n== seconds per operation: median (min-max); {args.n} cycles, each forking the last snapshot ==")
    print(f"{'engine':<44}{'commit':<18}{'run from it':<18}{'rm':<18}")
    for name, times in rows:
        show(name, times)


if __name__ == "__main__":
    main()
