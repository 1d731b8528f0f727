"""What a recovery on a stale-file task gets wrong: finding the cause, or redoing the steps.

    python bench/stale_repair_probe.py --run DIR [--seed 0] [--tasks 40]

DIR is a bench/experiment_learning.py output folder. On a seeded sample of its stale-file TRAIN
tasks (never the held-out ones), the seed's SFT policy makes one first attempt each (they all fail:
nothing tells a first attempt the file is there); from every failure state the SFT, fork-GRPO and
standard-GRPO policies of that seed each fork --forks recovery attempts (the same states and
sampling seeds for all three). Per policy it prints the share of recoveries that removed
/app/out/report.old, Recovery@1, and Recovery@1 of the recoveries that removed it (the rest: the
steps redone with a wrong argument). Writes DIR/seed<s>/stale_repair_probe.json.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import microtasks  # noqa: E402
from experiment_learning import removes_stale  # noqa: E402

import common as C  # noqa: E402


@dataclasses.dataclass
class Config:
    """Train-side probe of the stale-file recoveries of an experiment's policies."""

    run: str  # a bench/experiment_learning.py --out folder
    seed: int = 0  # which seed's policies (DIR/seed<s>/{sft,fork,standard})
    tasks: int = 40  # stale-file train tasks probed (a seeded sample)
    forks: int = 4  # recovery attempts per failure state and policy
    max_turns: int = 6  # as the experiment's defaults
    max_tokens: int = 160
    max_context: int = 4096
    concurrency: int = 8


def main(argv: list[str] | None = None) -> dict:
    cfg = C.parse_config(Config, argv)
    run, seed = Path(cfg.run), cfg.seed
    stale = set(json.loads((run / "tasks/split.json").read_text())["stale"])
    tasks = [t for t in C.load_tasks(run / "tasks/train") if t.name in stale]
    random.Random(seed).shuffle(tasks)
    tasks = tasks[:cfg.tasks]
    by_name = {t.name: t for t in tasks}
    policies = {p: run / f"seed{seed}" / p / "final" for p in ("sft", "fork", "standard")}

    def rollout(sampling_seed: int) -> C.RolloutConfig:
        sampling = C.SamplingConfig(max_tokens=cfg.max_tokens, seed=sampling_seed)  # temperature 1
        return C.RolloutConfig(max_turns=cfg.max_turns, max_context=cfg.max_context, command_timeout=30.0,
                               concurrency=cfg.concurrency, system_prompt=microtasks.SYSTEM_PROMPT,
                               sampling=sampling)

    def engine(path: Path) -> C.VLLMEngine:
        return C.make_engine("vllm", path, dtype="float32", max_model_len=cfg.max_context, seed=seed)

    res: dict = {"config": dataclasses.asdict(cfg)}
    with C.env_session():
        eng = engine(policies["sft"])
        firsts, _ = C.run_attempts(tasks, eng, rollout(1000), commit="failed", internet=False)
        states = [C.FailureState.from_episode(e) for e in firsts if e.reward < 1 and e.snapshot]
        res["first_attempts"], res["failure_states"] = len(firsts), len(states)
        try:
            for name, path in policies.items():
                if name != "sft":
                    del eng
                    gc.collect()
                    eng = engine(path)
                groups, _ = C.run_recoveries(states, by_name, cfg.forks, eng, rollout(2000), internet=False)
                eps = [e for g in groups for e in g]
                removed = [e for e in eps if removes_stale(e.commands)]
                res[name] = {"recoveries": len(eps), "removed_file": len(removed) / max(1, len(eps)),
                             "recovery_at_1": sum(e.reward >= 1 for e in eps) / max(1, len(eps)),
                             "recovery_at_1_if_removed": (sum(e.reward >= 1 for e in removed)
                                                          / max(1, len(removed)))}
        finally:
            for s in states:
                C.remove_image(s.snapshot)
    (run / f"seed{seed}" / "stale_repair_probe.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"{len(states)} failure states of the SFT policy on {len(tasks)} stale-file train tasks, "
          f"{cfg.forks} recoveries each")
    print(f"{'policy':<10}{'removed the file':>18}{'Recovery@1':>12}{'Recovery@1 if removed':>23}")
    for name in policies:
        r = res[name]
        print(f"{name:<10}{r['removed_file']:>18.2f}{r['recovery_at_1']:>12.3f}{r['recovery_at_1_if_removed']:>23.3f}")
    return res


if __name__ == "__main__":
    C.run_main(main)
