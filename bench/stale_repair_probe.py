"""What a recovery on a stale-file task gets wrong: finding the cause, or redoing the steps.

    python bench/stale_repair_probe.py --run DIR [--seed 0] [--tasks 40] [--part stale|pool]
                                       [--policy NAME=MODEL_DIR ...]

DIR is a bench/experiment_learning.py output folder. On a seeded sample of its stale-file TRAIN
tasks (never the held-out ones), the seed's SFT policy makes one first attempt each (they all fail:
nothing tells a first attempt the file is there); from every failure state the SFT, fork-GRPO and
standard-GRPO policies of that seed each fork --forks recovery attempts (the same states and
sampling seeds for all three). Per policy it prints the share of recoveries that removed
/app/out/report.old, Recovery@1, and Recovery@1 of the recoveries that removed it (the rest: the
steps redone with a wrong argument), the share of states whose forks all got the same reward (a
GRPO group without signal) and the distinct command sequences among a state's forks. Writes
DIR/seed<s>/stale_repair_probe.json, and every recovery (messages, commands, reward) to
DIR/seed<s>/stale_repair_probe_<policy>.jsonl.

--part pool probes the train tasks GRPO trains on instead (the seed's sample of --pool-tasks, stale
file or not; failure states of the same kind as 04's pool) and writes pool_repair_probe*.json(l);
--policy adds more checkpoints (e.g. a longer GRPO run's final/) to the three.
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
import batch_rollouts as R  # noqa: E402
import experiment_learning as E  # noqa: E402

import common as C  # noqa: E402


@dataclasses.dataclass
class Config:
    """Train-side probe of the stale-file recoveries of an experiment's policies."""

    run: str  # a bench/experiment_learning.py --out folder (its config.json gives the rollout limits)
    seed: int = 0  # which seed's policies (DIR/seed<s>/{sft,fork,standard})
    tasks: int = 40  # stale-file train tasks probed (a seeded sample)
    forks: int = 4  # recovery attempts per failure state and policy
    part: str = "stale"  # stale: stale-file train tasks | pool: the seed's GRPO train-task sample
    policy: list[str] = dataclasses.field(default_factory=list)  # more policies, NAME=MODEL_DIR each


def main(argv: list[str] | None = None) -> dict:
    cfg = C.parse_config(Config, argv)
    run, seed = Path(cfg.run), cfg.seed
    saved = json.loads((run / "config.json").read_text())
    exp = E.Config(**{f.name: saved[f.name] for f in dataclasses.fields(E.Config) if f.name in saved})
    stale = set(json.loads((run / "tasks/split.json").read_text())["stale"])
    if cfg.part == "pool":  # 03/04's seeded sample (E.pool_flags), then the probe's own sample of it
        tasks = C.load_tasks(E.grpo_tasks_dir(exp, run / "tasks"), sample=exp.pool_tasks, seed=seed)
    else:
        tasks = [t for t in C.load_tasks(run / "tasks/train") if t.name in stale]
    random.Random(seed).shuffle(tasks)
    tasks = tasks[:cfg.tasks]
    by_name = {t.name: t for t in tasks}
    policies = {p: run / f"seed{seed}" / p / "final" for p in ("sft", "fork", "standard")}
    policies |= {name: Path(path) for name, path in (p.split("=", 1) for p in cfg.policy)}
    out = run / f"seed{seed}" / f"{cfg.part}_repair_probe"

    res: dict = {"config": dataclasses.asdict(cfg)}
    with C.env_session():
        eng = E.policy_engine(exp, policies["sft"], seed)
        firsts, _ = R.run_attempts(tasks, eng, E.rollout_config(exp, policies["sft"], 1000), commit="failed",
                                   internet=False)
        states = [C.FailureState.from_episode(e) for e in firsts if e.reward < 1 and e.snapshot]
        res["first_attempts"], res["failure_states"] = len(firsts), len(states)
        try:
            for name, path in policies.items():
                if name != "sft":
                    del eng
                    gc.collect()
                    eng = E.policy_engine(exp, path, seed)
                rcfg = E.rollout_config(exp, path, 2000)
                groups, _ = R.run_recoveries(states, by_name, cfg.forks, eng, rcfg, internet=False)
                eps = [e for g in groups for e in g]
                with open(f"{out}_{name}.jsonl", "w") as f:
                    f.writelines(json.dumps({"task": e.task.name} | e.record()) + "\n" for e in eps)
                removed = [e for e in eps if E.removes_stale(e.commands)]
                res[name] = {"recoveries": len(eps), "removed_file": len(removed) / max(1, len(eps)),
                             "recovery_at_1": sum(e.reward >= 1 for e in eps) / max(1, len(eps)),
                             "recovery_at_1_if_removed": (sum(e.reward >= 1 for e in removed)
                                                          / max(1, len(removed)))}
                # the groups GRPO would see: all forks of a state equal in reward (no signal), and
                # how many different command sequences the forks of a state ran
                n = max(1, len(groups))
                res[name]["uniform_states"] = sum(len({e.reward >= 1 for e in g}) == 1 for g in groups) / n
                runs = [len({tuple(c["command"] for c in e.commands) for e in g}) for g in groups]
                res[name]["distinct_commands"] = sum(runs) / n
                if cfg.part == "pool":
                    for cause, want in (("stale", True), ("other", False)):
                        xs = [e.reward >= 1 for e in eps if (e.task.name in stale) == want]
                        res[name][f"recovery_at_1_{cause}"] = sum(xs) / max(1, len(xs))
        finally:
            for s in states:
                C.remove_image(s.snapshot)
    Path(f"{out}.json").write_text(json.dumps(res, indent=1) + "\n")
    kind = "stale-file train tasks" if cfg.part == "stale" else "train tasks of the GRPO sample"
    print(f"{len(states)} failure states of the SFT policy on {len(tasks)} {kind}, {cfg.forks} forks each")
    cols = ["removed_file", "recovery_at_1", "recovery_at_1_if_removed", "uniform_states",
            "distinct_commands"]
    cols += ["recovery_at_1_stale", "recovery_at_1_other"] if cfg.part == "pool" else []
    print(f"{'policy':<12}" + "".join(f"{c:>26}" for c in cols))
    for name in policies:
        print(f"{name:<12}" + "".join(f"{res[name][c]:>26.3f}" for c in cols))
    return res


if __name__ == "__main__":
    C.run_main(main)
