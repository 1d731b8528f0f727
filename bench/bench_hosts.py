"""Rollouts on one Docker engine vs two, and the cost of moving one snapshot between engines.

Both engines run on this machine (the second is a dockerd started here, unless --docker-hosts
names one), so the env-steps/s ratio shows what the routing costs, not what more hardware buys.
The workload is scripted (no model): E episodes of T commands each on a RolloutPool of C slots,
once with the default engine alone and once with the slots split over both engines.

Moving a snapshot is `docker save` on one engine streamed into `docker load` on the other; save
has no deltas, so the whole image (base layers too) crosses. Moving a fork beats waiting for a
slot on the snapshot's engine when the expected wait (a slot's mean holding time / its slots) is
longer than the copy; common.Hosts decides that way with the rate it measured on earlier copies.

    python bench/bench_hosts.py [--episodes 16] [--turns 6] [--concurrency 8] [--docker-hosts URL] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import batch_rollouts as R  # noqa: E402
from conftest import ScriptedEngine, SecondEngine, write_task  # noqa: E402

import common as C  # noqa: E402

TOML = """version = "1.0"
[agent]
timeout_sec = 120.0
[verifier]
timeout_sec = 30.0
[environment]
cpus = 1
memory = "256M"
allow_internet = false
"""


def call(cmd: str) -> str:
    return f"<tool_call>\n<function=bash>\n<parameter=command>\n{cmd}\n</parameter>\n</function>\n" \
        "</tool_call>"


def rollouts(task: C.Task, hosts: str, args) -> float:
    """env-steps/s of E scripted episodes on a pool spread over `hosts`."""
    C.use_docker_hosts(hosts)
    tok = C.make_tiny_tokenizer()
    engine = ScriptedEngine(tok, [call(f"echo {i} >> /app/log; ls /app | wc -l") for i in range(args.turns)])
    cfg = C.RolloutConfig(max_turns=args.turns + 1, max_context=16384, concurrency=args.concurrency)
    t0 = time.monotonic()
    eps, stats = R.run_attempts([task] * args.episodes, engine, cfg)
    wall = time.monotonic() - t0
    assert not any(ep.error for ep in eps), [ep.error for ep in eps if ep.error]
    return stats["env_steps"] / wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--docker-hosts", default="", help="the second engine's URL (default: start one here)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    second = SecondEngine() if not args.docker_hosts else None
    url = second.start().url if second else args.docker_hosts
    half = max(1, args.concurrency // 2)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            task = C.load_task(write_task(Path(tmp), "bench-hosts", toml=TOML))
            for h in (None, url):  # build outside the timings
                C.task_image(task, h)
            one = rollouts(task, "", args)
            two = rollouts(task, f"{C._default_url()}#{half},{url}#{args.concurrency - half}", args)
            # one snapshot of a worked-on container, moved to the other engine
            hosts = C.use_docker_hosts(f"{C._default_url()},{url}")
            with C.start_env(task) as env:
                env.bash("head -c 20000000 /dev/urandom > /app/blob")
                tag = env.snapshot()
            hosts._copy(tag, None, url)
            size = C.docker_client().api.inspect_image(tag)["Size"]
            C.remove_image(tag)
            res = {"one_engine_env_steps_per_s": round(one, 2), "two_engines_env_steps_per_s": round(two, 2),
                   "two_vs_one": round(two / one, 3), "move_s": round(hosts.counts["move_s"], 2),
                   "move_bytes": hosts.counts["move_bytes"], "image_bytes": size,
                   "move_mb_per_s": round(hosts.counts["move_bytes"] / hosts.counts["move_s"] / 1e6, 1)}
    finally:
        for h in (None, url):
            C.reap(C.RUN_ID, host=h)
        if second:
            second.stop()
            shutil.rmtree(second.dir, ignore_errors=True)
    print(f"{args.episodes} episodes x {args.turns} commands, {args.concurrency} slots")
    print(f"one engine : {res['one_engine_env_steps_per_s']:.2f} env-steps/s")
    print(f"two engines: {res['two_engines_env_steps_per_s']:.2f} env-steps/s ({res['two_vs_one']:.2f}x, "
          "same machine: the routing's overhead)")
    print(f"move one snapshot: {res['move_s']:.2f} s for {res['move_bytes'] / 1e6:.0f} MB "
          f"({res['move_mb_per_s']:.0f} MB/s); moving beats waiting when a slot frees later than that")
    if args.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
