"""The powered learning experiment: at an equal environment-step budget, does fork GRPO teach
recovery better than fresh-start GRPO whose failed attempts go on with a recovery turn?

    python bench/experiment_paired.py --block RUN --out DIR --replicates 0,1     # paired replicates
    python bench/experiment_paired.py --block RUN --keep-block bench/results/NAME  # keep a block (~5 MB)
    python bench/experiment_paired.py --combine DIR ... --plan bench/prereg_paired.json --out DIR

The design (bench/experiment_learning.md, "The paired design", tells why):
  block      one SFT policy and its bank: a finished `experiment_learning.py --sft-only --entry-split`
             run (RUN: its tasks/, data/, seed<s>/). The bank is that run's stage-03 failure states on
             the evaluation split (twins of train tasks whose planted entry has an unseen name or
             kind), every one forked `recovery_samples` times for the SFT policy (sft_result.json).
             A block must pass the block rule or it is not used (block_rule: the gate, train-side
             figures only, and its bank Recovery@1 inside --bank-range, counted exactly).
  replicate  one GRPO seed from the block; it runs both arms from the same SFT weights:
               fork            stage 03 collects a failure pool on a seeded sample of train tasks
                               (its agent turns count), then 04 --mode fork on it;
               standard_retry  04 --mode standard_retry up to the fork arm's environment steps;
             every `eval_every` GRPO steps each arm is forked from every bank state as often as the
             SFT policy was (a curve), and at the end 05 scores Pass@1 and success within one attempt
             plus one recovery on the evaluation split's tasks (secondary endpoints).
  combine    pools replicates of one block or several, and applies the pre-registered plan (--plan):
             the primary endpoint, its intervals, the sequential looks and the futility rule, and
             prints the verdict the plan implies. It runs nothing, so anyone can redo it from the
             committed files.
The bank's snapshot images do not survive a machine: a replicate rebuilds missing ones by replaying
each failed attempt's commands in a fresh container of its task (replay_bank), which gives the same
files for the micro tasks' deterministic commands.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import experiment_learning as E  # noqa: E402

import common as C  # noqa: E402

ARMS = ("fork", "standard_retry")


@dataclasses.dataclass
class Config:
    """Paired replicates of fork vs standard + retry GRPO from one SFT block; or --combine."""

    block: str = ""  # a finished `experiment_learning.py --sft-only --entry-split` run: the SFT block
    block_seed: int = 0  # its seed<s>/ folder: the SFT policy and bank used
    out: str = "runs/paired"  # rep<r>/ per replicate (replicate.json, progress.jsonl, stage outputs)
    replicates: str = "0"  # GRPO seeds to run, comma-separated (one replicate each, both arms)
    grpo_steps: int = 64  # fork-arm GRPO steps per replicate (the dev curves' flattening, guess: 64)
    eval_every: int = 16  # GRPO steps between bank evaluations (a curve point per arm)
    # forks per bank state at the curve's intermediate points (the final point forks as often as the
    # block's SFT evaluation did): 2 x ~96 states gives a point's SE ~0.035 at a quarter of the cost
    curve_forks: int = 2
    # block gate, train side only: first attempts on train tasks WITHOUT a planted entry must pass at
    # least this often (a policy that still copies its trained arguments wrong is half-trained). Set on
    # dev (bench/experiment_learning.md, dev runs 6 and 8): three seeds of one recipe passed 0.19, 0.64
    # and 0.77 of them, and their bank Recovery@1 was 0.076, 0.18 and 0.32: 0.6 keeps the two whose
    # bank has reward spread (the first guess, 0.8, kept none)
    gate_plain_pass: float = 0.6
    # block rule, bank side: the SFT policy's bank Recovery@1 lies in [low, high] (the plan's
    # sft_bank_recovery_range, read as the exact share of forks, never rounded): below it most groups
    # of G forks have no reward spread to learn from; above it there is little left to recover
    bank_range: str = "0.15,0.7"
    secondary: bool = True  # 05 Pass@1 and success with one retry on the evaluation tasks, at the end
    keep_block: str = ""  # instead: copy what replicates need of --block to this folder (to commit it)
    combine: list[str] = dataclasses.field(default_factory=list)  # replicate folders (or runs of them)
    require_commit: str = ""  # refuse to run a replicate unless this is a clean checkout of that commit
    plan: str = "bench/prereg_paired.json"  # --combine: the pre-registered analysis plan
    bootstrap: int = 4000  # --combine: bootstrap resamples (replicates and bank states together)


# ---- the block: the SFT policy, its gate and its bank -------------------------------------------

# what of a block run is kept (keep_block): enough for replicates on another machine
BLOCK_FILES = ("config.json", "results.json", "seed{s}/sft_result.json",
               "seed{s}/failures_heldout/failures.jsonl", "seed{s}/failures_heldout/attempts.jsonl",
               "seed{s}/failures_train/attempts.jsonl", "seed{s}/{phase}/final")


def block_parts(cfg: Config) -> dict:
    """Paths and figures of the block: its experiment config, split, SFT model, bank and SFT samples.
    A kept block (keep_block) has no tasks/: they are written again from its config (the split is a
    function of it) into OUT/tasks and checked against the task lists its results.json names."""
    run = Path(cfg.block)
    seed_dir = run / f"seed{cfg.block_seed}"
    sft = json.loads((seed_dir / "sft_result.json").read_text())
    econf = json.loads((run / "config.json").read_text())
    if not econf.get("entry_split"):
        raise SystemExit(f"{run}: not an --entry-split run; its bank would measure copying, not recovery")
    fields = {f.name for f in dataclasses.fields(E.Config)}
    ecfg = E.Config(**{k: v for k, v in econf.items() if k in fields})
    model = seed_dir / ("repair" if ecfg.repair_steps else "sft") / "final"
    tasks = run / "tasks"
    if not (tasks / "split.json").exists():
        tasks = Path(cfg.out) / "tasks"
        split = E.write_tasks(ecfg, tasks)
        kept = json.loads((run / "results.json").read_text())
        if any(split[k] != kept[f"{k}_tasks"] for k in ("train", "dev", "heldout")):
            raise SystemExit(f"{run}: its config no longer writes the tasks its results.json names")
    return {"run": run, "seed_dir": seed_dir, "ecfg": ecfg, "model": model, "sft": sft, "tasks": tasks,
            "bank": seed_dir / "failures_heldout/failures.jsonl",
            "split": json.loads((tasks / "split.json").read_text())}


def keep_block(run: Path, seed: int, dest: Path) -> list[Path]:
    """Copy what replicates need of a block run (BLOCK_FILES: its config, SFT figures, bank, the
    gate's attempts and the SFT model, ~5 MB) to dest, e.g. bench/results/<name> to commit it."""
    import shutil

    phase = "repair" if json.loads((run / "config.json").read_text()).get("repair_steps") else "sft"
    copied = []
    for f in BLOCK_FILES:
        src, dst = run / f.format(s=seed, phase=phase), dest / f.format(s=seed, phase=phase)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.pt", "optim*"))
        else:
            shutil.copy2(src, dst)
        copied.append(dst)
    return copied


def gate(b: dict) -> dict:
    """The block's train-side figures and whether it passes: the pass rate of the SFT policy's first
    attempts (stage 03, train sample) on tasks without a planted entry, and its warm-up loss."""
    causes = b["split"]["causes"]
    attempts = C.read_jsonl(b["seed_dir"] / "failures_train/attempts.jsonl")
    plain = [a["reward"] >= 1.0 for a in attempts if a["task"] not in causes]
    rate = sum(plain) / len(plain) if plain else 0.0
    return {"plain_pass": rate, "n_plain_attempts": len(plain), "warmup_loss": b["sft"].get("warmup_loss"),
            "warmup_runs": b["sft"].get("warmup_runs")}


def block_rule(cfg: Config, b: dict) -> tuple[dict, list[str]]:
    """The plan's block rule on the block's own files: its gate figures with the bank's count of
    recovered forks added, and why it fails (empty: the block passes)."""
    g, rec = gate(b), b["sft"]["recovery_before"]
    try:
        low, high = map(float, cfg.bank_range.split(","))
    except ValueError:
        raise SystemExit(f"--bank-range {cfg.bank_range!r}: give LOW,HIGH (the plan's: 0.15,0.7)") from None
    share = sum(rec) / len(rec) if rec else 0.0
    g |= {"bank_recovered": int(sum(rec)), "bank_forks": len(rec), "bank_recovery": share}
    why = []
    if g["plain_pass"] < cfg.gate_plain_pass:
        why.append(f"its first attempts pass {g['plain_pass']:.3f} of train tasks without an entry "
                   f"(< {cfg.gate_plain_pass})")
    if not low <= share <= high:
        why.append(f"its bank Recovery@1 is {g['bank_recovered']}/{g['bank_forks']} = {share:.4f}, "
                   f"outside [{low}, {high}]")
    return g, why


def replay_bank(b: dict, out: Path, concurrency: int) -> Path:
    """The bank with live snapshot images: the block's own where they exist, else each state rebuilt
    by replaying its failed attempt's commands in a fresh container of its task (kept images)."""
    import importlib

    collect = importlib.import_module("03_collect_failures")
    rows = C.read_jsonl(b["bank"])
    path = out / "bank.jsonl"
    if path.exists():
        rows = C.read_jsonl(path)
    missing = [i for i, r in enumerate(rows) if not collect.snapshot_exists(r["snapshot"], r.get("host"))]
    if not missing and path.exists():
        return path
    by_name = {t.name: t for t in C.load_tasks(b["tasks"] / b["ecfg"].eval_on)}

    def rebuild(i: int) -> tuple[int, str]:
        r = rows[i]
        with C.start_env(by_name[r["task"]], internet=False) as env:
            for m in r["messages"]:
                for call in (m.get("tool_calls") or []) if m["role"] == "assistant" else []:
                    env.bash(call["function"]["arguments"]["command"], 30.0)
            return i, env.snapshot(keep=True)

    with C.env_session():
        for _, res in C.run_concurrently(rebuild, missing, concurrency, "bank replay"):
            if isinstance(res, Exception):
                raise res
            i, tag = res
            rows[i] = rows[i] | {"snapshot": tag, "host": None}
    out.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- one replicate: both arms from the block's SFT policy ----------------------------------------

def run_replicate(cfg: Config, b: dict, r: int) -> dict:
    """Both arms for GRPO seed r, their bank curves and secondary endpoints; rep<r>/replicate.json."""
    ecfg = dataclasses.replace(b["ecfg"], grpo_steps=cfg.grpo_steps, eval_every=cfg.eval_every)
    out = Path(cfg.out) / f"rep{r}"
    log, t0 = out / "log.txt", time.monotonic()
    wall: dict[str, float] = {}
    lap = [t0]

    def tick(name: str) -> None:
        wall[name] = round(time.monotonic() - lap[0], 1)
        lap[0] = time.monotonic()
        C.log0(f"replicate {r}: {name} done ({wall[name]:.0f} s)")

    sft, held = b["model"], b["tasks"] / ecfg.eval_on
    grpo_dir = E.grpo_tasks_dir(ecfg, b["tasks"])
    bank = replay_bank(b, out, ecfg.concurrency)
    tick("bank")
    pool = out / "pool"  # the fork arm's failure pool: stage 03 on this replicate's train sample
    E.sh(["03_collect_failures.py", "--tasks", grpo_dir, "--model", sft, "--out", pool, "--attempts",
          ecfg.attempts, "--seed", 1000 + r, "--temperature", 1.0, *E.pool_flags(ecfg, r),
          *E.roll_flags(ecfg)],
         log)
    (pool / "failures.jsonl").touch()
    pool_steps = sum(a["turns"] for a in C.read_jsonl(pool / "attempts.jsonl"))
    tick("pool")
    sft_rec = sum(b["sft"]["recovery_before"]) / len(b["sft"]["recovery_before"])
    curves = {arm: [{"grpo_step": 0, "env_steps": 0, "recovery": sft_rec}] for arm in ARMS}
    causes = E.load_causes(b["tasks"])
    samples, by_cause, env_steps = {}, {}, {}
    progress = out / "progress.jsonl"
    progress.unlink(missing_ok=True)  # a resumed replicate evaluates every point again
    try:
        n_chunks = -(-cfg.grpo_steps // cfg.eval_every)
        for c in range(1, n_chunks + 1):
            steps, last = min(cfg.grpo_steps, c * cfg.eval_every), c == n_chunks
            env_steps["fork"] = pool_steps + E.grpo_chunk(ecfg, "fork", sft, out / "fork", steps, 0, grpo_dir,
                                                          pool / "failures.jsonl", r, last, log)
            env_steps["standard_retry"] = E.grpo_chunk(ecfg, "standard_retry", sft, out / "standard_retry",
                                                       10**6, env_steps["fork"], grpo_dir,
                                                       pool / "failures.jsonl", r, last, log)
            tick(f"grpo_chunk{c}")
            forks = ecfg if last else dataclasses.replace(ecfg, recovery_samples=cfg.curve_forks)
            for arm in ARMS:
                rec, commands = E.recovery_at_1(forks, out / arm / "final", bank, held, b["ecfg"].task_seed)
                point = {"grpo_step": steps, "env_steps": env_steps[arm], "recovery": sum(rec) / len(rec),
                         "forks_per_state": forks.recovery_samples}
                curves[arm].append(point)
                C.append_jsonl(progress, {"arm": arm, **point, "samples": rec})
                if last:
                    samples[arm] = rec
                    by_cause[arm] = E.cause_stats(rec, commands, b["sft"]["recovery_sample_tasks"], causes)
            tick(f"eval_chunk{c}")
    finally:
        C.remove_snapshots(bank, pool / "failures.jsonl")
    res = {"replicate": r, "block": str(b["run"]), "block_seed": cfg.block_seed, "task_seed": ecfg.task_seed,
           "evaluated_on": ecfg.eval_on, "code": E.code_version(), "gate": gate(b),
           # the block's SFT figures on the bank, so that --combine needs this file alone
           "sft": {"recovery": sft_rec, "samples": b["sft"]["recovery_before"],
                   "sample_tasks": b["sft"]["recovery_sample_tasks"],
                   "forks_per_state": ecfg.recovery_samples},
           "env_steps": env_steps, "env_steps_pool": pool_steps,
           "curves": curves, "samples": samples, "by_cause": by_cause,
           "nonuniform_group_frac": {}, "secondary": {}}
    for arm in ARMS:
        rows = C.read_jsonl(out / arm / "metrics.jsonl")
        res["nonuniform_group_frac"][arm] = 1 - sum(x["groups_dropped"] for x in rows) / max(
            1, sum(x["groups"] for x in rows))
        if cfg.secondary:
            p = E.pass_at_1(ecfg, out / arm / "final", held, out / f"eval_{arm}", r, log)
            swr = E.success_with_retry(out / f"eval_{arm}")
            res["secondary"][arm] = {"pass_at_1": p, "success_with_retry": swr}
    tick("secondary")
    res["wall_s"] = wall | {"total": round(time.monotonic() - t0, 1)}
    (out / "replicate.json").write_text(json.dumps(res) + "\n")
    return res


# ---- the pre-registered analysis -------------------------------------------------------------------

def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with df degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(p, df))


def mdd(sd: float, n: int, alpha: float, power: float = 0.8) -> float:
    """Minimal detectable difference of a paired mean over n replicates with per-replicate SD sd: the
    true difference a two-sided level-alpha t-test detects with the given power."""
    return (t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def paired_bootstrap(reps: list[dict], n: int, rng: random.Random) -> list[float]:
    """95% interval of the mean final fork − standard_retry difference: each draw resamples the
    replicates, and within each the bank states (one draw for both arms: a state's forks stay
    together and the arms stay paired)."""
    vals = []
    for _ in range(n):
        diffs = []
        for rep in (rng.choice(reps) for _ in reps):
            per_state = rep["per_state"]
            draw = [rng.randrange(len(per_state)) for _ in per_state]
            diffs.append(sum(per_state[i][0] - per_state[i][1] for i in draw) / len(draw))
        vals.append(sum(diffs) / len(diffs))
    vals.sort()
    return [vals[int(0.025 * (n - 1))], vals[int(0.975 * (n - 1))]]


def per_state(rep: dict, forks: int) -> list[tuple[float, float]]:
    """(fork, standard_retry) final Recovery@1 of each bank state (its forks' mean)."""
    a, b = rep["samples"]["fork"], rep["samples"]["standard_retry"]
    return [(sum(a[i:i + forks]) / forks, sum(b[i:i + forks]) / forks) for i in range(0, len(a), forks)]


def verdict(diffs: list[float], plan: dict) -> dict:
    """Apply the plan's sequential rule to the replicates' paired differences (in order): at each
    look n (plan["looks"]) the interval mean ± t(1 − alpha_n/2, n − 1)·sd/√n with the look's
    O'Brien–Fleming-type nominal alpha; stop for efficacy when it excludes 0, for futility when its
    upper bound is below plan["futility_margin"]; at the last look, the interval says what is excluded."""
    looks = [n for n in plan["looks"] if n <= len(diffs)]
    if not looks:
        return {"decision": "continue", "replicates": len(diffs),
                "text": f"{len(diffs)} replicates: before the first look ({plan['looks'][0]}); no verdict"}
    for n, alpha in zip(plan["looks"], plan["nominal_alpha"], strict=True):
        if n > len(diffs):
            break
        xs = diffs[:n]
        m, sd = sum(xs) / n, (sum((x - sum(xs) / n) ** 2 for x in xs) / (n - 1)) ** 0.5
        half = t_quantile(1 - alpha / 2, n - 1) * sd / math.sqrt(n)
        lo, hi = m - half, m + half
        out = {"look": n, "mean": m, "sd": sd, "interval": [lo, hi], "nominal_alpha": alpha}
        if lo > 0 or hi < 0:
            better = "fork" if lo > 0 else "standard_retry"
            return out | {"decision": f"efficacy: {better} better",
                          "text": f"after {n} replicates {better} recovers more on the bank: fork − "
                                  f"standard_retry {m:+.3f}, interval [{lo:+.3f}, {hi:+.3f}] excludes 0"}
        if hi < plan["futility_margin"]:
            return out | {"decision": "futility",
                          "text": f"after {n} replicates no detectable difference: fork − standard_retry "
                                  f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]; a fork advantage above {hi:+.3f} (so "
                                  f"one of {plan['futility_margin']:+.2f} or more) is excluded"}
        if n == plan["looks"][-1]:
            return out | {"decision": "no detectable difference",
                          "text": f"after {n} replicates no detectable difference: fork − standard_retry "
                                  f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]; effects outside that interval are "
                                  "excluded"}
    return out | {"decision": "continue",
                  "text": f"look {looks[-1]}: neither bound crossed; run to the next look"}


def combine(cfg: Config) -> dict:
    """results.json of the pooled replicates under the plan: every field the plan names, the curves
    (per arm, mean and min-max over replicates, by GRPO step) and the verdict; curves.png."""
    plan = json.loads(Path(cfg.plan).read_text())
    paths = []
    for d in map(Path, cfg.combine):
        one = d / "replicate.json"
        paths += [one] if one.exists() else sorted(d.glob("rep*/replicate.json"))
    reps = [json.loads(p.read_text()) for p in paths]
    if not reps:
        raise SystemExit("--combine: no replicate.json under " + ", ".join(cfg.combine))
    blocks = {(rep["block"], rep["block_seed"]): rep["sft"]["recovery"] for rep in reps}
    forks = plan["forks_per_state"]
    for rep, path in zip(reps, paths, strict=True):
        if rep["sft"]["forks_per_state"] != forks:
            raise SystemExit(f"--combine: the plan forks every bank state {forks} times; {path} differs")
        # a plan names the frozen commit, task seed and split its replicates must have run at
        code, frozen = str(rep.get("code")), plan.get("frozen_commit")
        if frozen and (not code.startswith(frozen) or code.endswith("+dirty")):
            raise SystemExit(f"--combine: {path} ran at {code}, not at the plan's frozen commit {frozen}")
        for key in ("task_seed", "evaluated_on"):
            if key in plan and rep.get(key) != plan[key]:
                raise SystemExit(f"--combine: {path} has {key} {rep.get(key)!r}; the plan says {plan[key]!r}")
        # ... and the endpoint: the final GRPO step and the bank's size
        rep["per_state"] = per_state(rep, forks)
        ran = {"grpo_steps": rep["curves"]["fork"][-1]["grpo_step"], "bank_states": len(rep["per_state"])}
        for key, value in ran.items():
            if key in plan and value != plan[key]:
                raise SystemExit(f"--combine: {path} has {key} {value}; the plan says {plan[key]}")
    diffs = [rep["curves"]["fork"][-1]["recovery"] - rep["curves"]["standard_retry"][-1]["recovery"]
             for rep in reps]
    steps = sorted({p["grpo_step"] for rep in reps for p in rep["curves"]["fork"]})
    curves = {}
    for arm in ARMS:
        curves[arm] = []
        for s in steps:
            pts = [p for rep in reps for p in rep["curves"][arm] if p["grpo_step"] == s]
            ys = [p["recovery"] for p in pts]
            curves[arm].append({"grpo_step": s, "env_steps": sum(p["env_steps"] for p in pts) / len(pts),
                                "recovery": sum(ys) / len(ys), "min": min(ys), "max": max(ys), "n": len(ys)})
    sd = statistics.stdev(diffs) if len(diffs) > 1 else None
    res = {
        "replicates": len(reps), "arms": list(ARMS), "blocks": [f"{b} seed {s}" for b, s in sorted(blocks)],
        "bank_states": len(reps[0]["per_state"]), "forks_per_state": forks,
        "grpo_steps": max(steps),
        "env_steps": {a: sum(r["env_steps"][a] for r in reps) / len(reps) for a in ARMS},
        "sft_bank_recovery": sum(blocks.values()) / len(blocks),
        "final_recovery": {a: sum(r["curves"][a][-1]["recovery"] for r in reps) / len(reps) for a in ARMS},
        "fork_minus_standard_retry": sum(diffs) / len(diffs), "diffs": diffs, "sd_diff": sd,
        # the plan's minimal detectable difference (from the dev replicates' SD), and the one this
        # run's own SD implies at the plan's last look
        "mdd": plan["mdd"], "mdd_observed_sd": mdd(sd, plan["looks"][-1], plan["alpha"]) if sd else None,
        "ci95_t": E.t_interval(diffs),
        "ci95_bootstrap": paired_bootstrap(reps, cfg.bootstrap, random.Random(0)),
        "secondary": {a: {k: E.mean([r["secondary"][a][k] for r in reps if r.get("secondary")])
                          for k in ("pass_at_1", "success_with_retry")} for a in ARMS},
        "by_cause": {a: {k: E.mean([x for r in reps if (x := r["by_cause"][a].get(k)) is not None])
                         for k in E.CAUSES} for a in ARMS},
        "curves": curves, "verdict": verdict(diffs, plan), "plan": cfg.plan,
        "runs": [str(p.parent) for p in paths], "per_replicate": reps,
    }
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    plot(res, out / "curves.png")
    print(f"{res['replicates']} replicates, bank {res['bank_states']} states x {forks} forks; SFT "
          f"{res['sft_bank_recovery']:.3f}; final fork {res['final_recovery']['fork']:.3f}, standard_retry "
          f"{res['final_recovery']['standard_retry']:.3f}; env steps {res['env_steps']}")
    print(f"verdict: {res['verdict']['text']}")
    return res


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    lines = [(f"{arm} (mean of {c[-1]['n']})", color, [p["env_steps"] for p in c], [p["recovery"] for p in c],
              [p["min"] for p in c], [p["max"] for p in c])
             for arm, color in zip(ARMS, ("tab:red", "tab:green"), strict=True) for c in [res["curves"][arm]]]
    E.band_panel(ax, lines, "environment steps (fork: stage 03's pool included)",
                 "bank Recovery@1: fork vs standard + retry, paired replicates (band: min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    cfg = C.parse_config(Config, argv)
    if cfg.combine:
        return combine(cfg)
    if not cfg.block:
        raise SystemExit("--block RUN is required (a finished experiment_learning.py --sft-only run)")
    E.require_commit(cfg.require_commit)
    if cfg.keep_block:
        copied = keep_block(Path(cfg.block), cfg.block_seed, Path(cfg.keep_block))
        print(f"kept {len(copied)} paths of {cfg.block} in {cfg.keep_block}")
        g, why = block_rule(cfg, block_parts(cfg))
        figures = (f"plain pass {g['plain_pass']:.3f} of {g['n_plain_attempts']}, bank Recovery@1 "
                   f"{g['bank_recovered']}/{g['bank_forks']} = {g['bank_recovery']:.4f}")
        print("block rule: " + (f"fails: {'; '.join(why)}" if why else f"passes ({figures})"))
        return {"kept": [str(p) for p in copied], "gate": g, "fails": why}
    b = block_parts(cfg)
    g, why = block_rule(cfg, b)
    C.dump_config(cfg, cfg.out)
    (Path(cfg.out) / "gate.json").write_text(json.dumps(g | {"threshold": cfg.gate_plain_pass,
                                                            "bank_range": cfg.bank_range}) + "\n")
    if why:
        raise SystemExit(f"block {cfg.block} fails the block rule: {'; '.join(why)}; train another block")
    done = {}
    for r in (int(x) for x in cfg.replicates.split(",")):
        path = Path(cfg.out) / f"rep{r}/replicate.json"
        done[r] = json.loads(path.read_text()) if path.exists() else run_replicate(cfg, b, r)
    return done


if __name__ == "__main__":
    C.run_main(main)
