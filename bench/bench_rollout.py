"""Asynchronous vs lockstep rollouts on a heterogeneous workload, side by side in one run.

32 episodes (default), 16 container slots, 6 turns each. Every turn is a real generation by the
tiny model on the vLLM engine (CPU here), but the command the episode runs is scripted: a sleep
drawn from a heavy-tailed mix (70% 0.05 s, 25% 1 s, 5% 8 s; seeded per episode and turn), like
Terminal-Bench work where one command takes milliseconds and another a minute.

- async: common.RolloutPool, each episode on its own clock, vLLM continuous batching;
- async-queue: the same pool with the batching queue (one `generate` over whatever queued);
- lockstep: the loop this project had before (kept here only as the baseline): chunks of
  `concurrency` episodes, one batched generate per turn for the chunk, then every command, then
  the next turn, so each turn waits for the slowest command of the chunk and each chunk for its
  slowest episode.

    python bench/bench_rollout.py [--episodes 32] [--concurrency 16] [--turns 6] [--json]

With --json the last stdout line is one JSON object with both runs' figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import batch_rollouts as R  # noqa: E402

import common as C  # noqa: E402

MIX = [(0.70, 0.05), (0.25, 1.0), (0.05, 8.0)]  # (share, seconds) of the scripted commands


def duration(episode: int, turn: int, seed: int) -> float:
    u, acc = random.Random(f"{seed}-{episode}-{turn}").random(), 0.0
    for share, secs in MIX:
        acc += share
        if u < acc:
            return secs
    return MIX[-1][1]


class ScriptedOverReal:
    """The real engine generates (so generation costs what it costs), then the sampled tokens are
    replaced by the scripted command of that episode's turn (so the workload is controlled)."""

    def __init__(self, real, turns: int, seed: int):
        self.real, self.tokenizer, self.turns, self.seed = real, real.tokenizer, turns, seed
        self.prompts: dict[str, list[int]] = {}
        self.continuous = real.continuous

    def _script(self, prompt: list[int]) -> C.Generation:
        text = self.tokenizer.decode(prompt)
        episode = int(re.search(r"\[episode (\d+)\]", text).group(1))
        turn = text.count("<tool_response>")
        out = "Done." if turn >= self.turns else (
            "<tool_call>\n<function=bash>\n<parameter=command>\n"
            f"sleep {duration(episode, turn, self.seed)}\n</parameter>\n</function>\n</tool_call>")
        ids = self.tokenizer.encode(out, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return C.Generation(ids, [-1.0] * len(ids), "stop")

    def generate(self, prompts, sampling, seeds=None):
        self.real.generate(prompts, sampling, seeds)
        return [self._script(p) for p in prompts]

    def add_request(self, prompt, sampling, seed):
        rid = self.real.add_request(prompt, sampling, seed)
        self.prompts[rid] = prompt
        return rid

    def step(self):
        return [(rid, self._script(self.prompts.pop(rid))) for rid, _ in self.real.step()]

    def abort(self, rids):
        self.real.abort(rids)


def lockstep(episodes: list[C.Episode], engine, cfg: C.RolloutConfig) -> dict:
    """The baseline: chunks of cfg.concurrency episodes; each turn waits for the whole chunk."""
    stats = {"gen_s": 0.0, "env_steps": 0}
    with ThreadPoolExecutor(cfg.concurrency) as threads:
        for lo in range(0, len(episodes), cfg.concurrency):
            chunk = episodes[lo:lo + cfg.concurrency]
            envs = list(threads.map(lambda ep: C.start_env(ep.task), chunk))
            try:
                lockstep_chunk(chunk, envs, engine, cfg, threads, stats)
            finally:
                for env in envs:
                    env.close()
    return stats


def lockstep_chunk(chunk, envs, engine, cfg: C.RolloutConfig, threads, stats: dict) -> None:
    tok, t0, live = engine.tokenizer, time.monotonic(), list(range(len(chunk)))

    def act(i: int, gen: C.Generation) -> None:  # the chunk's clock, not the episode's own
        C._act(chunk[i], envs[i], gen, tok, cfg, chunk[i].task.agent_timeout_sec - (time.monotonic() - t0))

    while live:
        t = time.monotonic()
        gens = engine.generate([chunk[i].trace.ids for i in live], cfg.sampling)
        stats["gen_s"] += time.monotonic() - t
        list(threads.map(act, live, gens))
        stats["env_steps"] += len(live)
        live = [i for i in live if not chunk[i].end and chunk[i].turns < cfg.max_turns]
        for ep in (chunk[i] for i in live):
            last = max(k for k, m in enumerate(ep.messages) if m["role"] == "assistant")
            ep.trace.add_context(C.delta_ids(tok, ep.messages[: last + 1], ep.messages[last + 1:]))
    list(threads.map(lambda ep, env: C._finish(ep, env, "none", cfg), chunk, envs))


def make_task(root: Path) -> C.Task:
    d = root / "bench-task"
    for sub in ("environment", "tests"):
        (d / sub).mkdir(parents=True)
    (d / "instruction.md").write_text("Run the commands.\n")
    (d / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 600.0\n[verifier]\n'
                                 'timeout_sec = 60.0\n[environment]\ncpus = 1\nmemory = "256M"\n'
                                 'allow_internet = false\n')
    (d / "environment" / "Dockerfile").write_text(f"FROM {C.BASE_IMAGE}\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text("mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n")
    return C.load_task(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=16)  # real tokens generated per turn
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = C.make_tiny_model(Path(d) / "tiny", arch="qwen3")
        real = C.make_engine("vllm", model, dtype="float32", max_model_len=4096)
        task = make_task(Path(d))
        C.task_image(task)  # built outside the timings
        engine = ScriptedOverReal(real, args.turns, args.seed)
        cfg = C.RolloutConfig(max_turns=args.turns + 1, max_context=4096, concurrency=args.concurrency,
                              sampling=C.SamplingConfig(temperature=1.0, max_tokens=args.max_tokens, seed=0))
        episodes = lambda: [C.first_attempt(dataclasses.replace(task, instruction=f"Run the commands. "  # noqa: E731
                                                                f"[episode {i}]"), real.tokenizer, seed=i)
                            for i in range(args.episodes)]
        res = {}
        with C.env_session():
            for name in ("async", "async-queue", "lockstep"):
                eps, t0 = episodes(), time.monotonic()
                engine.continuous = name == "async"
                st = (lockstep(eps, engine, cfg) if name == "lockstep"
                      else R.run_episodes(eps, [None] * len(eps), engine, cfg))
                wall = time.monotonic() - t0
                assert all(ep.reward == 1.0 and len(ep.commands) == args.turns for ep in eps), name
                res[name] = {"wall_s": round(wall, 2), "episodes_per_s": round(len(eps) / wall, 3),
                             "env_steps_per_s": round(st["env_steps"] / wall, 2),
                             "engine_idle_frac": round(1 - st["gen_s"] / wall, 3)}
    sleep_s = sum(duration(i, t, args.seed) for i in range(args.episodes) for t in range(args.turns))
    print(f"\n== {args.episodes} episodes x {args.turns} turns, {args.concurrency} slots; scripted commands "
          f"sleep {sleep_s:.0f} s in all; tiny Qwen3 on vLLM (CPU) generates every turn ==")
    print(f"{'loop':<12}{'wall s':>8}{'episodes/s':>12}{'env-steps/s':>13}{'engine idle':>13}")
    for name, r in res.items():
        print(f"{name:<12}{r['wall_s']:>8.1f}{r['episodes_per_s']:>12.3f}{r['env_steps_per_s']:>13.2f}"
              f"{r['engine_idle_frac']:>13.1%}")
    speedup = res["async"]["episodes_per_s"] / res["lockstep"]["episodes_per_s"]
    print(f"async / lockstep: {speedup:.2f}x episodes/s")
    if args.json:
        print(json.dumps({"async_episodes_per_s": res["async"]["episodes_per_s"],
                          "lockstep_episodes_per_s": res["lockstep"]["episodes_per_s"],
                          "speedup": round(speedup, 2), **res,
                          "episodes": args.episodes, "concurrency": args.concurrency, "turns": args.turns}))


if __name__ == "__main__":
    main()
