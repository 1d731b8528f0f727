"""Does fork-based GRPO teach recovery better than standard GRPO? (the paper's ablation, tiny)

1. collect failure states of the starting policy on the bundled tasks (snapshots before verify)
   and split them BY TASK: half the tasks train, the other half are held out;
2. held-out recovery rate (Recovery@1 over --eval-samples forks per state) of the start policy;
3. `04 --mode fork` for --steps steps on the training states; its environment steps E;
4. `04 --mode standard` from the same start with the same budget E of environment steps;
5. held-out recovery rate of both results; with --sft, Pass@1 of SFT vs --base on the tasks.

    python bench/experiment_recovery.py [--model PATH] [--sft PATH --base PATH] [--steps 3]

Without --model a random-init tiny model is made: the table then measures the pipeline, not
learning (such a model essentially never recovers). It prints whatever it measures.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import batch_rollouts as R  # noqa: E402

import common as C  # noqa: E402

GRPO = importlib.import_module("04_reterm_grpo")


@dataclasses.dataclass
class Config:
    """Held-out recovery before/after fork vs standard GRPO at an equal environment-step budget."""

    tasks: str = "tasks"  # bundled Harbor tasks
    out: str = "runs/experiment_recovery"  # work folder (failures, runs, results.json)
    model: str | None = None  # starting policy (default: a random-init tiny model)
    failures: str | None = None  # use these failure states instead of collecting them
    sft: str | None = None  # an SFT checkpoint: also report its Pass@1 vs --base
    base: str | None = None  # the model the SFT started from (default: --model)
    k: int = 2  # first attempts per task when collecting failure states
    steps: int = 3  # fork-mode GRPO steps (standard mode gets the same environment steps)
    batch_states: int = 4  # groups per step
    group_size: int = 4  # attempts per group
    fresh_frac: float = 0.25  # fork mode's fresh-start share
    lr: float = 1e-4  # GRPO learning rate
    eval_samples: int = 2  # recovery attempts per held-out state
    max_tokens: int = 48  # per assistant turn
    max_turns: int = 3  # per attempt
    max_context: int = 4096  # tokens per attempt
    engine: str = "vllm"  # vllm | hf
    dtype: str = "float32"  # engine dtype (float32 on CPU)
    concurrency: int = 8  # containers at once
    seed: int = 0  # sampling seed


def rollout_cfg(cfg: Config) -> C.RolloutConfig:
    sampling = C.SamplingConfig(max_tokens=cfg.max_tokens)  # unseeded requests: the engine is seeded
    return C.RolloutConfig(max_turns=cfg.max_turns, max_context=cfg.max_context, command_timeout=60.0,
                           concurrency=cfg.concurrency, sampling=sampling)


def engine_for(cfg: Config, model: str | Path):
    kw = {"max_model_len": cfg.max_context, "seed": cfg.seed} if cfg.engine == "vllm" else {}
    return C.make_engine(cfg.engine, model, dtype=cfg.dtype, **kw)


def recovery_rate(cfg: Config, model: str | Path, states: list, tasks: dict) -> dict:
    """Recovery@1 over eval_samples forks of each held-out state, overall and by category."""
    engine = engine_for(cfg, model)
    groups, stats = R.run_recoveries(states, tasks, cfg.eval_samples, engine, rollout_cfg(cfg))
    del engine
    gc.collect()
    by = collections.defaultdict(list)
    for s, g in zip(states, groups, strict=True):
        by[s.category] += [float(ep.reward >= 1.0) for ep in g]
    every = [x for v in by.values() for x in v]
    return {"recovery": sum(every) / max(1, len(every)), "n": len(every),
            "by_category": {k: sum(v) / len(v) for k, v in sorted(by.items())}}


def train(cfg: Config, mode: str, model: str, failures: Path, out: Path, budget: int = 0) -> tuple[Path, int]:
    args = ["--failures", str(failures), "--model", str(model), "--out", str(out), "--tasks", cfg.tasks,
            "--mode", mode, "--steps", str(cfg.steps if not budget else 100 * cfg.steps),
            "--env-step-budget", str(budget), "--groups-per-step", str(cfg.batch_states),
            "--group-size", str(cfg.group_size), "--fresh-frac", str(cfg.fresh_frac), "--lr", str(cfg.lr),
            "--max-tokens", str(cfg.max_tokens), "--max-turns", str(cfg.max_turns),
            "--max-context", str(cfg.max_context), "--engine", cfg.engine, "--dtype", cfg.dtype,
            "--concurrency", str(cfg.concurrency), "--seed", str(cfg.seed), "--save-every", "1000"]
    final = GRPO.main(args)
    gc.collect()
    rows = C.read_jsonl(out / "metrics.jsonl")
    return final, rows[-1]["env_steps_total"] if rows else 0


def pass_at_1(cfg: Config, model: str, out: Path) -> float:
    ev = importlib.import_module("05_eval_tb2")
    s = ev.main(["--tasks", cfg.tasks, "--out", str(out), "--agent", "policy", "--model", str(model),
                 "--engine", cfg.engine, "--dtype", cfg.dtype, "--max-tokens", str(cfg.max_tokens),
                 "--max-turns", str(cfg.max_turns), "--max-context", str(cfg.max_context),
                 "--concurrency", str(cfg.concurrency), "--temperature", "0"])
    gc.collect()
    return s["pass_at_1"]


def main(argv: list[str] | None = None) -> dict:
    cfg = C.parse_config(Config, argv)
    out = Path(cfg.out)
    C.dump_config(cfg, out)
    tasks = {t.name: t for t in C.load_tasks(cfg.tasks)}
    model = cfg.model or str(C.make_tiny_model(out / "tiny", arch="qwen3"))
    res: dict = {"model": model}
    with C.env_session():
        if cfg.failures:
            states = GRPO.load_failures(cfg.failures)
        else:
            engine = engine_for(cfg, model)
            todo = [t for t in tasks.values() for _ in range(cfg.k)]
            eps, _ = R.run_attempts(todo, engine, rollout_cfg(cfg), commit="failed")
            del engine
            gc.collect()
            states = [C.FailureState.from_episode(ep, model) for ep in eps if ep.snapshot]
            res["start_pass_at_1"] = sum(ep.reward for ep in eps) / len(eps)
        held_tasks = set(sorted(tasks)[1::2])
        held = [s for s in states if s.task in held_tasks]
        train_states = [s for s in states if s.task not in held_tasks]
        (out / "train_failures.jsonl").unlink(missing_ok=True)
        for s in train_states:
            C.append_jsonl(out / "train_failures.jsonl", dataclasses.asdict(s))
        C.log0(f"{len(states)} failure states: {len(train_states)} train, {len(held)} held out "
               f"({len(held_tasks)} held-out tasks)")
        try:
            res["before"] = recovery_rate(cfg, model, held, tasks)
            fork, env_steps = train(cfg, "fork", model, out / "train_failures.jsonl", out / "fork")
            std, std_steps = train(cfg, "standard", model, out / "train_failures.jsonl", out / "standard",
                                   budget=env_steps)
            res["fork"] = recovery_rate(cfg, fork, held, tasks) | {"env_steps": env_steps}
            res["standard"] = recovery_rate(cfg, std, held, tasks) | {"env_steps": std_steps}
            if cfg.sft:
                res["pass_at_1"] = {"base": pass_at_1(cfg, cfg.base or model, out / "eval_base"),
                                    "sft": pass_at_1(cfg, cfg.sft, out / "eval_sft")}
        finally:
            if not cfg.failures:
                for s in states:
                    C.remove_image(s.snapshot)
    (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    print(f"\nheld-out failure states: {res['before']['n'] // max(1, cfg.eval_samples)} "
          f"(x{cfg.eval_samples} forks each)")
    print(f"{'policy':<26}{'env steps':>10}{'recovery':>10}   by category")
    for name in ("before", "fork", "standard"):
        r = res[name]
        cats = ", ".join(f"{k} {v:.2f}" for k, v in r["by_category"].items())
        print(f"{name:<26}{r.get('env_steps', 0):>10}{r['recovery']:>10.3f}   {cats}")
    if "pass_at_1" in res:
        print(f"\nPass@1 (greedy): base {res['pass_at_1']['base']:.3f}   SFT {res['pass_at_1']['sft']:.3f}")
    return res


if __name__ == "__main__":
    main()
