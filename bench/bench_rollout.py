"""Rollout-layer figures on the tiny model, measured side by side in one run (not a test).

1. generation: vLLM vs transformers-generate tokens/s for one batch of 16 episode prompts;
2. environment: env-steps/s of 16 concurrent episodes vs the same 16 run one after another
   (a scripted policy issues the commands, so only the environment side is timed).

    python bench/bench_rollout.py [--tasks tasks] [--max-tokens 128] [--turns 6]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common as C  # noqa: E402

COMMANDS = ["ls -la", "pwd && ls /app | head", "cat /etc/os-release | head -3",
            "find /app -maxdepth 2 | wc -l", "python3 -c 'print(sum(range(10**5)))'", "git --version"]


class ScriptedPolicy:
    """Engine interface; every episode runs the same command list, then answers."""

    def __init__(self, tokenizer, turns: int):
        self.tokenizer, self.turns, self.n = tokenizer, turns, 0

    def generate(self, prompts, sampling):
        n, self.n = self.n, self.n + 1  # live episodes all sit on the same turn here
        text = "Done." if n >= self.turns else (
            "<tool_call>\n<function=bash>\n<parameter=command>\n"
            f"{COMMANDS[n % len(COMMANDS)]}\n</parameter>\n</function>\n</tool_call>")
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [C.Generation(ids, [-1.0] * len(ids), "stop") for _ in prompts]


def gen_speed(engine, prompts, max_tokens: int) -> float:
    s = C.SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=max_tokens, seed=0)
    engine.generate(prompts[:2], C.SamplingConfig(max_tokens=4, seed=0))  # warm-up
    t0 = time.perf_counter()
    gens = engine.generate(prompts, s)
    return sum(len(g.ids) for g in gens) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="tasks")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--n", type=int, default=16)
    args = ap.parse_args()
    tasks = C.load_tasks(args.tasks)
    with tempfile.TemporaryDirectory() as d:
        model = C.make_tiny_model(Path(d) / "tiny", arch="qwen3")
        tok = C.load_tokenizer(model)
        prompts = [C.render_ids(tok, C.initial_messages(tasks[i % len(tasks)].instruction), True)
                   for i in range(args.n)]
        speeds = {}
        for kind in ("vllm", "hf"):
            try:
                kw = {"max_model_len": 4096} if kind == "vllm" else {}
                speeds[kind] = gen_speed(C.make_engine(kind, model, dtype="float32", **kw), prompts,
                                         args.max_tokens)
            except C.UserError as e:
                print(f"{kind}: skipped ({e})")
    print(f"\n== generation: batch of {args.n} prompts (~{len(prompts[0])} tokens), "
          f"{args.max_tokens} new tokens each, tiny Qwen3, CPU fp32 ==")
    for k, v in speeds.items():
        print(f"{k:<5}: {v:8.0f} tokens/s")
    if len(speeds) == 2:
        print(f"vLLM / transformers: {speeds['vllm'] / speeds['hf']:.2f}x")

    pick = [tasks[i % len(tasks)] for i in range(args.n)]
    for t in {t.name: t for t in pick}.values():
        C.task_image(t)  # builds outside the timings
    walls = {}
    with C.env_session():
        for conc in (args.n, 1):
            cfg = C.RolloutConfig(max_turns=args.turns + 1, max_context=8192, concurrency=conc,
                                  sampling=C.SamplingConfig(max_tokens=64))
            t0 = time.perf_counter()
            steps = 0
            for lo in range(0, args.n, conc):
                eps, st = C.run_attempts(pick[lo:lo + conc], ScriptedPolicy(tok, args.turns), cfg)
                steps += st["env_steps"]
            walls[conc] = (steps, time.perf_counter() - t0)
    print(f"\n== environment: {args.n} episodes x {args.turns} commands (+ start, verify, cleanup) ==")
    for conc, (steps, wall) in walls.items():
        label = "concurrent" if conc > 1 else "one after another"
        print(f"{label:<18}: {steps / wall:6.1f} env-steps/s  ({wall:.1f} s wall)")
    print(f"speed-up: {walls[1][1] / walls[args.n][1]:.2f}x")


if __name__ == "__main__":
    main()
