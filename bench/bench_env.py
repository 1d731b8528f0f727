"""Environment-layer figures, measured side by side in one run (not a test).

1. snapshot + fork of N containers vs N fresh starts of the same task image;
2. the machine's CPU time per environment operation (every process: dockerd, containerd, runc and
   the container's own, from /proc/stat, so Linux only) and what it caps: rollouts are CPU-bound
   on a small machine, whatever the concurrency;
3. oracle evaluation of all bundled tasks at concurrency 1 vs 4 (wall-clock ratio);
4. --verify-cost: wall-clock medians of verification in place vs in a fresh fork (04's default).

    python bench/bench_env.py [--tasks tasks] [--n 8] [--verify-cost TASK]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import batch_rollouts as R  # noqa: E402

import common as C  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def cpu_seconds() -> float:
    """CPU time the whole machine has spent busy (all cores, user + system) since boot."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait


def cpu_per_call(fn, n: int) -> float:
    """Machine CPU seconds per call of fn, over n calls one after another."""
    t0 = cpu_seconds()
    for _ in range(n):
        fn()
    return (cpu_seconds() - t0) / n


OPS = {"start": "start + remove a container", "command": "one bash command (ls)",
       "verify": "verify (tests uploaded, test.sh run)",
       "verify_fresh": "verify in a fresh fork (04's default)", "snapshot": "snapshot + remove it"}
def op_costs(task: C.Task, n: int) -> dict[str, float]:
    """Machine CPU seconds per operation (OPS), each measured on its own."""
    with C.start_env(task) as env:
        return {"start": cpu_per_call(lambda: C.start_env(task).close(), n),
                "command": cpu_per_call(lambda: env.bash("ls /"), 4 * n),
                "verify": cpu_per_call(env.verify, n),
                "verify_fresh": cpu_per_call(lambda: env.verify(fresh=True), n),
                "snapshot": cpu_per_call(lambda: C.remove_image(env.snapshot()), n)}


def verify_cost(task: C.Task, n: int) -> None:
    """Wall-clock medians of n verifications of the oracle's solution, in place and in a fresh fork
    (commit, fork, verify, remove): what 04's default --verify-fresh adds per attempt."""
    with C.env_session(), C.start_env(task) as env:
        env.upload(task.solution_dir, "/solution")
        env.bash("bash /solution/solve.sh >/dev/null 2>&1")
        walls = {}
        for fresh in (False, True):
            runs = [timed(lambda f=fresh: env.verify(fresh=f)) for _ in range(n)]
            assert all(v.reward == 1.0 for v, _ in runs), runs
            walls[fresh] = statistics.median(s for _, s in runs)
    print(f"\n== verification of {task.name} (median of {n}) ==")
    print(f"in place          : {1000 * walls[False]:6.0f} ms")
    extra = 1000 * (walls[True] - walls[False])
    print(f"in a fresh fork   : {1000 * walls[True]:6.0f} ms   (+{extra:.0f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="tasks")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument("--verify-cost", metavar="TASK", help="only measure verification in place vs fresh")
    args = ap.parse_args()
    tasks = C.load_tasks(args.tasks)
    if args.verify_cost:
        return verify_cost(next(t for t in tasks if t.name == args.verify_cost), args.n)
    task = tasks[0]
    with C.env_session():
        C.task_image(task)  # build outside the timings
        fresh, t_fresh = timed(lambda: [C.start_env(task) for _ in range(args.n)])
        for e in fresh:
            e.close()
        fresh_par, t_fresh_par = timed(lambda: R.fork(C.task_image(task), task, args.n))
        base = fresh_par[0]
        base.bash("cd /app && export STAGE=1 && echo progress > /tmp/progress")
        for e in fresh_par[1:]:
            e.close()
        snap, t_snap = timed(base.snapshot)
        forks, t_fork = timed(lambda: R.fork(snap, task, args.n))
        for e in forks + [base]:
            e.close()
        C.remove_image(snap)
        costs = op_costs(task, args.n)
    print(f"\n== containers ({task.name}, n={args.n}) ==")
    print(f"{args.n} fresh starts, one after another : {t_fresh:6.2f} s")
    print(f"{args.n} fresh starts, concurrent         : {t_fresh_par:6.2f} s")
    print(f"snapshot (docker commit)               : {t_snap:6.2f} s")
    print(f"fork {args.n} from the snapshot, concurrent : {t_fork:6.2f} s")
    print(f"snapshot + fork vs fresh concurrent    : {(t_snap + t_fork) / t_fresh_par:6.2f}x the time")
    print(f"\n== machine CPU per operation ({task.name}, {os.cpu_count()} cores; every process) ==")
    for op, s in costs.items():
        print(f"{OPS[op]:<40}: {1000 * s:6.0f} ms")
    episode = costs["start"] + 3 * costs["command"] + costs["verify"]
    print(f"an episode of 3 commands, verified      : {1000 * episode:6.0f} ms -> at most "
          f"{60 * (os.cpu_count() or 1) / episode:.0f} episodes/min on this machine, before any generation")
    if args.skip_eval:
        return
    ev = importlib.import_module("05_eval_tb2")
    for t in tasks:
        C.task_image(t)  # images cached: both runs measure evaluation, not builds
    walls = {}
    for conc in (1, 4):
        with tempfile.TemporaryDirectory() as d:
            argv = ["--tasks", args.tasks, "--out", d, "--concurrency", str(conc)]
            s, walls[conc] = timed(lambda argv=argv: ev.main(argv))
            assert s["pass_at_1"] == 1.0, s
    print(f"\n== oracle evaluation of {len(tasks)} tasks ==")
    print(f"concurrency 1 : {walls[1]:6.1f} s")
    print(f"concurrency 4 : {walls[4]:6.1f} s   (speed-up {walls[1] / walls[4]:.2f}x)")


if __name__ == "__main__":
    main()
