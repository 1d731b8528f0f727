"""Does ReTerm-GRPO learn? Fork vs standard GRPO on the micro task family, held-out tasks.

    python bench/experiment_learning.py --out DIR [--seeds 3]
    python bench/experiment_learning.py --combine RUN_DIR ... --out DIR   # pool finished runs' seeds
    python bench/experiment_learning.py --out DIR --sft-only ...   # a dev candidate: SFT figures only

Every stage is the real script, run as a subprocess:
  tasks  bench/microtasks.py writes train/ and held-out/ tasks (split by parameters, fixed seed):
         every train task the family has, because on 81 of them the policy memorised each task's
         arguments instead of copying them from the instruction (dev Pass@1 0.33, 358 tasks: 0.48);
         --stale-frac (default 0.5) of the tasks of every part start with a stale report.old in the
         output folder: a failure whose cause `ls` shows and whose repair is the same on every task
         (the policy's copy errors are specific to a pair: no update on other pairs fixes them);
         --stale-vary: the entry's kind (file, folder, a folder at the output path) and name vary
         by task, dev and held-out names never occur in training: a repair that must be read, and
         recovery_by_cause reports Recovery@1 per kind and blind removals of a planted name;
         --fresh-out: every solution starts by emptying the output folder, so with --scopes from_start
         (01 redoes the whole task in every recovery) a recovery passes iff it copies the arguments
         right this time, with the failed attempt's wrong ones in context (use --stale-frac 0);
  01     oracle recovery demonstrations on the TRAIN tasks only (one per task), plus each train task's oracle
         solution as a verified one-attempt row (solution_rows: a model trained from scratch must
         learn first attempts too, which the paper's pretrained base model already makes; none
         for stale-file tasks: a first attempt cannot know the file is there), plus on a seeded share
         (--plain-frac, default 0.5: demo_tasks) of the stale-file train tasks the recovery from that
         plain first attempt (plain_rows; --no-plain-demos: none);
  per seed s (model init, data order, sampling):
  02     SFT of a random-init Qwen3 (bench/microtasks.make_model) in runs of the stage script:
         a warm-up on the solutions alone (many small steps: copying an argument from the instruction
         appears abruptly, after 500 to 2,600 of them, and the recovery rows' long contexts only
         delay it; more warm-up runs follow until the loss shows it, see --copy-loss), then the
         recovery rows + solutions: loss on the recovery attempts and on the solutions, never
         on the faulty first attempts (recovering, i.e. copying the instruction's value while the failed
         attempt's wrong one is in context, appears later still: dev Recovery@1 0 after 1,200 steps,
         0.17 after 3,600). The SFT policy then fails some tasks by itself (sampling at
         temperature 1, arguments it copies wrong); a third run (--repair-steps) adds repair_rows:
         its own train failures (03), each repaired by the oracle in a fork and verified;
  05     base Pass@1 on held-out (temperature 1);
  03     failure states of the SFT policy on held-out (their pass rate is the SFT Pass@1 at
         temperature 1; the states are the fixed Recovery@1 benchmark) and on a seeded sample of
         --pool-tasks train tasks (the GRPO pool; 04 draws its fresh starts from the same sample);
         with --pool-frac > 0, of tasks on train pairs kept out of 01 and 02 instead (tasks/pool/:
         states on pairs the policy copies rather than memorised, like held-out ones);
  04     --mode fork on the train pool, in chunks of --eval-every steps (resumed); after each chunk
         --mode standard on the train tasks is run up to the same cumulative environment steps
         (--env-step-budget), so both modes are compared at an equal environment-step budget, and
         with --retry-baseline (default) --mode standard_retry too: fresh starts whose failed attempts
         go on with the recovery turn, the baseline that can reach the recovery skill without a pool;
  eval   after each chunk, both policies: Recovery@1 = --recovery-samples forks of every held-out
         failure state of the SFT policy (the same states for every policy), and 05 Pass@1 on
         held-out (temperature 1, --eval-trials per task), with --eval-retry (default) also success
         within one attempt plus one recovery in the same container (05 --recovery).
Held-out tasks appear in no SFT row, no failure pool and no GRPO group. The recipe (these defaults),
however, was chosen after judging about eight variants on the same held-out tasks. From now on recipe
choices use the dev split: --dev-frac carves held-out-like pairs from train (never trained on) and
--eval-on dev runs every evaluation above on them instead (the results' heldout_* figures are then dev
figures, and "evaluated_on" says so); held-out is for a recipe frozen before it is looked at.
Writes DIR/results.json, DIR/learning.png and every stage's own outputs under DIR/seed<s>/, with
DIR/seed<s>/progress.jsonl: each evaluation point as it is made.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import batch_rollouts as R  # noqa: E402
import microtasks  # noqa: E402

import common as C  # noqa: E402


@dataclasses.dataclass
class Config:
    """Fork vs standard ReTerm-GRPO on generated micro tasks; held-out Recovery@1 and Pass@1."""

    out: str = "runs/experiment_learning"  # work folder (tasks, data, seed<s>/, results.json, learning.png)
    seeds: int = 3  # seeds 0..K-1 (model init, SFT order, sampling); tasks and split stay fixed
    # the first of the K seeds (first_seed..first_seed+K-1): one seed per run, each run a folder of its
    # own, pooled afterwards by --combine (a protocol's seeds need not all run on one machine in one go)
    first_seed: int = 0
    n_train: int = 418  # train tasks generated (418: all on train pairs; fewer are memorised, not copied)
    n_heldout: int = 40  # held-out tasks generated (of 158)
    pool_frac: float = 0.0  # share of the train pairs kept out of SFT for the GRPO pool (0: pool = train)
    stale_frac: float = 0.5  # share of tasks (every part) with a stale /app/out/report.old (microtasks)
    # the stale entry varies by task (a file, a folder, or a folder at the output path; per-part names,
    # dev and held-out names never trained on): its repair must be read, not recalled (microtasks)
    stale_vary: bool = False
    # with stale_vary: names are STEM.EXT, one token per piece, split by (stem, extension) pair: every
    # piece is trained, no dev or held-out name is (microtasks.composed_stale_names)
    stale_compose: bool = False
    # with stale_vary: dev and held-out tasks are twins of train tasks (trained arguments) whose planted
    # entry has an unseen name, or an unseen kind: Recovery@1 then measures reading the failed state,
    # not copying unseen arguments (microtasks.twin_tasks; dev/held-out counts are n_dev/n_heldout)
    entry_split: bool = False
    plain_demos: bool = True  # plain-procedure recovery rows on stale-file train tasks (plain_rows)
    plain_frac: float = 0.5  # with plain_demos: the seeded share of stale-file train tasks that get one
    fresh_out: bool = False  # solutions start by emptying /app/out (microtasks.FRESH_STEP)
    scopes: str = "step,from_fault,from_start"  # 01: the repairs its oracle tries ("from_start": redo all)
    # 01 (and plain_rows): the oracle recovery's first command lists the folders with this; `ls -la`
    # prints ~45 tokens a line in the tiny tokenizer, `find` a full path (/app/out/NAME), the form the
    # policy's copying of the instruction's output path knows (dev runs 4-5, experiment_learning.md)
    inspect: str = "ls -la"
    heldout_frac: float = 0.25  # share of (first argument, destination) pairs held out
    dev_frac: float = 0.0  # share of the other pairs carved out as a dev split, never trained on
    n_dev: int = 40  # dev tasks generated at most
    # the split every evaluation (base, 03 failure states, Recovery@1, Pass@1) runs on: recipe choices
    # are made on dev (with --dev-frac > 0); held-out only evaluates a recipe frozen before
    eval_on: str = "heldout"
    # fork mode's environment-step budget includes stage 03's collection of its train pool (agent turns),
    # so standard GRPO, matched to that budget, gets those steps too (False: GRPO's own steps only)
    count_pool_steps: bool = True
    # 05 evaluations also fork one recovery from each failed trial: success within one attempt plus one
    # recovery (Recovery-Bench's end-to-end figure), beside Pass@1; costs the recoveries' episodes
    eval_retry: bool = True
    # a third policy, 04 --mode standard_retry at the same budget: fresh starts whose failed attempts go
    # on with the recovery turn, so the recovery skill is reachable without a pool (the fair baseline)
    retry_baseline: bool = True
    # plain 04 --mode standard at the same budget, the third policy of the protocol in bench/results/heldout
    # (False: fork and standard_retry only, as the paired protocol compares them)
    plain_standard: bool = True
    task_seed: int = 0  # the task parameters and the split (fixed across seeds)
    hidden: int = 128  # policy hidden size (head_dim 32)
    layers: int = 4  # policy transformer blocks
    faults_per_task: int = 1  # 01: verified recovery rows per train task (many tasks, not many faults)
    warmup_steps: int = 2000  # 02, phase 1: steps on the solutions alone (copying appeared at ~1,450-2,600)
    warmup_lr: float = 3e-3  # 02, phase 1: peak learning rate (from scratch)
    copy_loss: float = 0.05  # 02, phase 1: loss that shows copying (before it: ~0.11-0.13; after: ~0.01)
    warmup_extra: int = 4  # 02, phase 1: at most this many more runs of warmup_steps/2 until copy_loss
    sft_steps: int = 3600  # 02, phase 2: steps on recovery rows + solutions (none recovered after 1200)
    sft_lr: float = 1e-3  # 02, phase 2: learning rate (constant, as phase 1)
    sft_batch_tokens: int = 2048  # 02 padded tokens per step: many small steps, not few large ones
    sft_max_len: int = 2048  # 02 tokens per row (longer rows lose context from the left)
    # 02, phase 1 trains on the plain-procedure rows too (data/warmup.jsonl): a name copied from a listing
    # is shown while copying forms, not only after it (dev run 5, with --inspect find: the policy writes
    # the listed dev name in its removal; dev run 4, find alone: a trained name, not the listed one)
    warmup_plain: bool = False
    repair_steps: int = 0  # 02, phase 3: steps on repair_rows + the phase-2 data (0: no phase 3)
    attempts: int = 2  # 03: attempts per task (held-out and train)
    pool_tasks: int = 100  # 03/04: train tasks (a seeded sample) of the failure pool and of GRPO
    grpo_steps: int = 32  # 04 fork-mode steps in all
    eval_every: int = 16  # 04 steps per chunk (an evaluation point after each; = grpo_steps: at the end only)
    batch_states: int = 4  # 04 B: groups per step
    group_size: int = 8  # 04 G: attempts per group (train-state recovery is ~0.1-0.3: G=4 is mostly uniform)
    fresh_frac: float = 0.25  # 04 fork mode: share of fresh-start groups feeding the pool
    grpo_lr: float = 5e-4  # 04 learning rate (3e-4: 8 steps moved the weights 0.6%; 1e-3 lost dev recovery)
    recovery_samples: int = 4  # Recovery@1: forks per held-out failure state
    eval_trials: int = 2  # 05: trials per held-out task
    max_turns: int = 6  # assistant turns per attempt
    max_tokens: int = 160  # tokens per assistant turn (oracle turns: median 54, max 140 tokens)
    max_context: int = 4096  # tokens per attempt (+ recovery)
    engine: str = "vllm"  # vllm | hf
    # containers at once: on 2 cores a 05 evaluation of 80 trials took 66 s at 16, 83 s at 8, 68 s at 32
    concurrency: int = 16
    bootstrap: int = 2000  # bootstrap resamples for ci95
    # refuse to run unless this checkout is at this commit with no tracked file changed: a protocol's
    # seeds all run the code its recipe was frozen at (each seed's result records its commit anyway)
    require_commit: str = ""
    # stop each seed after the SFT policy's Recovery@1 (no GRPO, ~45 min of a 2-2.5 h seed): the cheap
    # first look at a recipe candidate on dev; an SFT-only results.json from each seed<s>/sft_result.json
    # (which every seed writes, so a full run stopped in GRPO is read back here, not run again)
    sft_only: bool = False
    combine: list[str] = dataclasses.field(default_factory=list)  # pool finished runs of one split and recipe


# the Config fields that decide which task is in which part and the SFT rows (a resumed --out must keep them)
SPLIT_FIELDS = ("n_train", "n_heldout", "heldout_frac", "pool_frac", "stale_frac", "task_seed", "plain_demos",
                "plain_frac", "fresh_out", "scopes", "dev_frac", "n_dev", "stale_vary",
                "stale_compose", "inspect", "entry_split")
# what a config.json from before a field existed ran with
LEGACY = {"pool_frac": 0.0, "stale_frac": 0.0, "plain_demos": False, "plain_frac": 1.0, "fresh_out": False,
          "scopes": Config.scopes, "dev_frac": 0.0, "n_dev": 40, "eval_on": "heldout",
          "count_pool_steps": False, "eval_retry": False, "stale_vary": False, "retry_baseline": False,
          "plain_standard": True, "stale_compose": False, "warmup_plain": False, "entry_split": False,
          "inspect": "ls -la"}
# recovery_by_cause keys: Recovery@1 by cause (any planted entry, none, and per kind), on the states with
# a planted entry the share of recoveries that removed it and Recovery@1 of those, and blind removals
CAUSES = ("stale", "other", *microtasks.STALE_KINDS, "stale_removed", "stale_removed_recovered",
          "blind_removal", "other_name_removal")
# every name a planted entry can have (a removal naming one of them is a removal of a planted entry)
PLANTED_NAMES = sorted({n for names in microtasks.STALE_NAMES.values() for n in names}
                       | {f"{a}.{b}" for a in microtasks.STALE_STEMS for b in microtasks.STALE_EXTS})


def modes_of(per_seed: list[dict]) -> tuple[str, ...]:
    """The GRPO policies every seed trained, fork first: of fork, standard and standard_retry, those
    that every seed has an evaluation of."""
    return tuple(m for m in ("fork", "standard", "standard_retry")
                 if per_seed and all(m in s.get("recovery_after_samples", {}) for s in per_seed))


# the Config fields that say how a run ran, not what it measured: runs that differ only in them pool
RUN_FIELDS = ("out", "seeds", "first_seed", "engine", "concurrency", "bootstrap", "combine", "require_commit")


def recipe(config: dict) -> dict:
    """What a config measured: every field but RUN_FIELDS (LEGACY, then the default, for older ones)."""
    known = dataclasses.asdict(Config()) | LEGACY
    fields = {k: config.get(k, v) for k, v in known.items() if k not in RUN_FIELDS}
    return fields | split_fields(config)


def write_tasks(cfg: Config, tasks: Path) -> dict:
    """The task folders and split.json of cfg's split (microtasks.generate; fixed by its fields)."""
    return microtasks.generate(tasks, cfg.n_train, cfg.n_heldout, cfg.heldout_frac, cfg.task_seed,
                               cfg.pool_frac, cfg.stale_frac, cfg.fresh_out, cfg.dev_frac, cfg.n_dev,
                               cfg.stale_vary, cfg.stale_compose, cfg.entry_split)


def split_fields(config: dict) -> dict:
    """The SPLIT_FIELDS a config ran with (LEGACY for older ones); plain_frac counts only with plain_demos."""
    fields = {k: config.get(k, LEGACY.get(k)) for k in SPLIT_FIELDS}
    if not fields["plain_demos"]:
        fields["plain_frac"] = None
    return fields


def code_version() -> str | None:
    """The commit this checkout is at, "+dirty" when a tracked file differs from it (None outside git)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    try:
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
        return git("rev-parse", "HEAD").strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def sh(args: list, log: Path) -> None:
    """Run one stage script (cwd = the repository) with its output in `log`; fail loudly."""
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, *map(str, args)]
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            env=os.environ | {"VLLM_LOGGING_LEVEL": "WARNING"}).returncode
    if rc:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{' '.join(map(str, args[:1]))} exited {rc}; log {log}:\n{tail}")


def roll_flags(cfg: Config) -> list:
    return ["--engine", cfg.engine, "--max-turns", cfg.max_turns, "--max-tokens", cfg.max_tokens,
            "--max-context", cfg.max_context, "--concurrency", cfg.concurrency, "--command-timeout", 30]


def grpo_tasks_dir(cfg: Config, tasks: Path) -> Path:
    """The tasks of 03's train states and of 04: tasks/pool with --pool-frac, else tasks/train."""
    return tasks / ("pool" if cfg.pool_frac else "train")


def pool_flags(cfg: Config, seed: int) -> list:
    """03/04 on the train side: the same seeded sample of train tasks (all of them when 0)."""
    return ["--sample", cfg.pool_tasks, "--split-seed", seed]


def rollout_config(cfg: Config, model: Path, seed: int | None = None) -> C.RolloutConfig:
    """What the stage scripts roll out under roll_flags, for rollouts run here: the model's own
    scaffold (its prompts), the experiment's limits, temperature 1."""
    s = C.load_scaffold(model, log=lambda _: None, max_turns=cfg.max_turns, max_tokens=cfg.max_tokens,
                        max_context=cfg.max_context, command_timeout=30.0)
    return C.rollout_config(s, C.SamplingConfig(seed=seed), cfg.concurrency)


def policy_engine(cfg: Config, model: Path, seed: int) -> C.VLLMEngine | C.HFEngine:
    kw = {"max_model_len": cfg.max_context, "seed": seed} if cfg.engine == "vllm" else {}
    return C.make_engine(cfg.engine, model, dtype="float32", **kw)


def removes(commands: list[dict], names: list[str]) -> bool:
    """Whether an attempt's commands removed something by one of `names` (an `rm` naming it)."""
    return any("rm " in (c := str(x.get("command"))) and any(n in c for n in names) for x in commands)


def load_causes(tasks: Path) -> dict[str, dict]:
    """{task: {kind, path}} of the tasks with a planted entry (split.json; a split written before
    --stale-vary existed planted /app/out/report.old on its "stale" tasks)."""
    split = json.loads((tasks / "split.json").read_text())
    return split.get("causes") or {t: {"kind": "file", "path": "/app/out/report.old"} for t in split["stale"]}


def cause_stats(rec: list[float], commands: list[list[dict]], sample_tasks: list[str],
                causes: dict[str, dict]) -> dict[str, float | None]:
    """recovery_by_cause of one policy: Recovery@1 over the samples on tasks with a planted entry
    ("stale"), without one ("other") and per kind; on the former the share of recoveries that removed
    their own entry (found the cause) and Recovery@1 of those (redid the steps right); on the latter
    the share that removed a planted name all the same: a blind repair, nothing showed a cause; and on
    states with an entry of its own name, the share that removed another planted name (one recalled
    from training, not read). None: no such sample."""
    def share(xs: list) -> float | None:
        return sum(xs) / len(xs) if xs else None

    samples = list(zip(rec, commands, sample_tasks, strict=True))
    kinds = [causes.get(t, {}).get("kind") for t in sample_tasks]
    by_kind = list(zip(rec, kinds, strict=True))
    out = {"stale": share([r for r, k in by_kind if k]), "other": share([r for r, k in by_kind if not k])}
    out |= {kind: share([r for r, k in by_kind if k == kind]) for kind in microtasks.STALE_KINDS}
    found = [(r, removes(c, [Path(causes[t]["path"]).name])) for r, c, t in samples if t in causes]
    out["stale_removed"] = share([f for _, f in found])
    out["stale_removed_recovered"] = share([r for r, f in found if f])
    out["blind_removal"] = share([removes(c, PLANTED_NAMES) for _, c, t in samples if t not in causes])
    named = [(c, Path(causes[t]["path"]).name) for _, c, t in samples if causes.get(t, {}).get("kind") in
             ("file", "folder")]
    out["other_name_removal"] = share([removes(c, [n for n in PLANTED_NAMES if n not in own])
                                       for c, own in named])
    return out


def recovery_at_1(cfg: Config, model: Path, failures: Path, tasks: Path, seed: int
                  ) -> tuple[list[float], list[list[dict]]]:
    """One 0/1 per (held-out failure state, sample): `samples` recovery attempts forked from each;
    and per sample the commands it ran (cause_stats reads them)."""
    import gc
    import importlib

    grpo = importlib.import_module("04_reterm_grpo")
    states = grpo.load_failures(failures)
    if not states:
        return [], []
    by_name = {t.name: t for t in C.load_tasks(tasks)}
    engine = policy_engine(cfg, model, seed)
    with C.env_session():
        rcfg = rollout_config(cfg, model)
        groups, _ = R.run_recoveries(states, by_name, cfg.recovery_samples, engine, rcfg)
    del engine
    gc.collect()
    eps = [ep for g in groups for ep in g]
    return [float(ep.reward >= 1.0) for ep in eps], [ep.commands for ep in eps]


def pass_at_1(cfg: Config, model: Path, tasks: Path, out: Path, seed: int, log: Path) -> float:
    """05's Pass@1; with --eval-retry its run also forks one recovery from every failed trial, and
    out/summary.json holds success_with_retry (read by success_with_retry)."""
    sh(["05_eval_tb2.py", "--tasks", tasks, "--agent", "policy", "--model", model, "--out", out,
        "--dtype", "float32", "--temperature", 1.0, "--top-p", 1.0, "--trials", cfg.eval_trials,
        "--seed", seed, *roll_flags(cfg), *(["--recovery"] if cfg.eval_retry else [])], log)
    return json.loads((out / "summary.json").read_text())["pass_at_1"]


def success_with_retry(out: Path) -> float | None:
    """Share of 05's trials that passed in one attempt plus one recovery (None without --eval-retry)."""
    return json.loads((out / "summary.json").read_text()).get("success_with_retry")


def grpo_chunk(cfg: Config, mode: str, sft: Path, out: Path, steps: int, budget: int, tasks_dir: Path,
               failures: Path, seed: int, last: bool, log: Path) -> int:
    """Run (or resume) 04 up to `steps` steps / `budget` env steps; returns its env steps so far."""
    args = ["04_reterm_grpo.py", "--model", sft, "--out", out, "--tasks", tasks_dir, "--mode", mode,
            "--steps", steps, "--env-step-budget", budget, "--groups-per-step", cfg.batch_states,
            "--group-size", cfg.group_size, "--fresh-frac", cfg.fresh_frac, "--lr", cfg.grpo_lr,
            "--dtype", "float32", "--seed", seed, "--save-every", 1, *pool_flags(cfg, seed), *roll_flags(cfg)]
    if mode == "fork":
        args += ["--failures", failures]
    if not last:  # the pool's snapshots must outlive this chunk: the next one resumes from them
        args += ["--keep-pool"]
    sh(args, log)
    rows = C.read_jsonl(out / "metrics.jsonl")
    return rows[-1]["env_steps_total"] if rows else 0


def solution_rows(tasks_dir: Path, path: Path, concurrency: int, skip: set[str] = frozenset()) -> int:
    """Each task's solution/solve.sh replayed step by step as bash tool calls in a real container and
    kept as a one-attempt row (loss on all its assistant turns) if the tests pass; returns the rows.

    The paper's base model can already solve tasks, so its SFT data only teaches recovery; a model
    trained from scratch must also learn first attempts, and the recovery rows' first attempts are
    all faulty by construction (training on them teaches the policy to fail every time).
    `skip`: tasks with no such row, the stale-file ones: their solution removes report.old before
    it has seen it, and a first attempt cannot know the file is there (the instruction does not say),
    so the policy's first attempts are the plain procedure and fail the tests because of it."""
    import importlib

    build = importlib.import_module("01_build_data")
    writer = build.Writer(path)
    done = {r["task_id"] for r in writer.rows}
    todo = [t for t in C.load_tasks(tasks_dir) if t.name not in done | skip]

    def solve(task: C.Task) -> None:
        steps = build.split_steps((task.solution_dir / "solve.sh").read_text())
        msgs = C.initial_messages(task.instruction, microtasks.SYSTEM_PROMPT)
        with C.start_env(task, internet=False) as env:
            build.replay_attempt(env, msgs, steps, 30.0)
            if env.verify().reward < 1.0:
                raise RuntimeError(f"{task.name}: the oracle solution does not pass")
        row = build.make_row(task.name, msgs, 2, {"teacher": "oracle", "solution": True})
        writer.add(row | {"target_attempt_index": 1})

    with C.env_session():
        for _, res in C.run_concurrently(solve, todo, concurrency, "solution rows"):
            if isinstance(res, Exception):
                raise res
    return len(writer.rows)


def plain_rows(tasks_dir: Path, stale: set[str], path: Path, concurrency: int, skip: set[str],
               inspect: str = "ls -la") -> int:
    """One more oracle recovery row per stale-file train task: its first attempt is the plain
    procedure (solve.sh without the removal of report.old, 01's fault `drop@0`), the recovery lists
    /app/out and removes the file (01's smallest repair: the other steps did their part); kept if
    attempt 1 fails and 2 passes.

    That first attempt is the one the policy makes on every stale-file task (no solution row shows
    the removal before the file is seen), so its failure states all look like this one; 01's one
    random fault per task puts a demonstration there on ~16 of ~200 such tasks, and the SFT policy
    then recovered 1% of these states: too few successes in a group of G forks for GRPO to learn
    from. With these rows (seed 0) the SFT policy removed the file in 67% of its recoveries of
    held-out stale-file states and recovered 33% of them, and fork GRPO did not raise that in 16
    steps (bench/experiment_learning.md). `skip`: the tasks whose 01 row is this one already.
    Returns the rows in `path`."""
    import importlib

    build = importlib.import_module("01_build_data")
    writer = build.Writer(path)
    done = {r["task_id"] for r in writer.rows}
    todo = [t for t in C.load_tasks(tasks_dir) if t.name in stale - done - skip]
    bcfg = build.Config(system_prompt=microtasks.SYSTEM_PROMPT, recovery_prompt=C.RECOVERY_PROMPT,
                        command_timeout=30.0, no_internet=True, inspect=inspect)

    def demo(task: C.Task) -> None:
        steps = build.split_steps((task.solution_dir / "solve.sh").read_text())
        if not microtasks.is_stale_step(steps[0][0]):
            raise RuntimeError(f"{task.name}: solve.sh does not remove the planted entry first")
        fault = build.Fault("drop", 0, "drop@0", [c for _, c in steps[1:]])
        row, outcome = build.oracle_row(bcfg, task, steps, fault)
        if row is None:
            raise RuntimeError(f"{task.name}: no plain-procedure recovery row ({outcome})")
        writer.add(row)

    with C.env_session():
        for _, res in C.run_concurrently(demo, todo, concurrency, "plain-procedure rows"):
            if isinstance(res, Exception):
                raise res
    return len(writer.rows)


def demo_tasks(split: dict, frac: float, seed: int) -> set[str]:
    """The stale-file train tasks that get a plain-procedure row: a seeded share `frac` of them.

    The share sets how sure the SFT policy is of the repair. With every such task (1.0) it removed
    the file in ~2/3 of its recoveries, and each state's forks agreed on whether it did (a state's
    outcome set by the state: no contrast inside a group). With 01's ~16 rows alone it did so in ~1%
    of them, too rarely for a group of G forks to hold a success. The train-side figures of both
    runs put a share in between where the repair is neither certain nor absent. At 0.5 (seed 0) the
    policy removed the file in 70% of its held-out recoveries, the forks of 14 of its 48 held-out
    states disagreed, and fork GRPO raised Recovery@1 from 0.276 to 0.349; over all runs of this
    share the gain was uneven (README, Results; bench/experiment_learning.md)."""
    stale = sorted(set(split["stale"]) & set(split["train"]))
    k = round(frac * len(stale))
    return set(random.Random(f"plain:{seed}").sample(stale, k))


def repair_rows(failures: Path, tasks_dir: Path, path: Path, concurrency: int) -> int:
    """Recovery rows from the policy's OWN failure states (03's snapshots): in a fork of each, the
    oracle inspects, removes what the failed attempt added that the solution never names (a file
    under a wrong name, say), and replays solve.sh from the first step; kept only if the tests
    pass. Stage 01's faults are guesses at how an attempt fails; these first attempts are the
    policy's own (wrong destinations, wrong words, malformed calls), so their recoveries are
    the ones it needs. Returns the rows in `path`."""
    import functools
    import importlib

    build = importlib.import_module("01_build_data")
    grpo = importlib.import_module("04_reterm_grpo")
    writer = build.Writer(path)
    done = {r["meta"]["state"] for r in writer.rows}
    by_name = {t.name: t for t in C.load_tasks(tasks_dir)}
    todo = [s for s in grpo.load_failures(failures) if s.id not in done and s.task in by_name]

    def files(env: C.Env, roots: list[str]) -> set[str]:
        out = env.bash(f"find {' '.join(roots)} -xdev -mindepth 1 2>/dev/null", 30.0).output
        return {ln for ln in out.splitlines() if ln.startswith("/") and "/.reterm" not in ln}

    @functools.cache  # per task, not per state: every state of a task shares its solution and image
    def solution(name: str) -> tuple[list[tuple[str, str]], set[str], list[str], set[str]]:
        """(steps, paths the solution names + their folders, folders to list, files of a fresh container)"""
        task = by_name[name]
        steps = build.split_steps((task.solution_dir / "solve.sh").read_text())
        named = {p for _, c in steps for p in build.PATH.findall(c)}
        named |= {str(Path(p).parent) for p in named}
        roots = sorted({"/tmp"} | {"/" + p.split("/")[1] for p in named})
        with C.start_env(task, internet=False) as env:
            return steps, named, roots, files(env, roots)

    def repair(state: C.FailureState) -> None:
        task = by_name[state.task]
        steps, named, roots, fresh = solution(task.name)
        # the context a recovery rollout sees (the experiment keeps the default recovery prompt)
        msgs = state.messages + [C.recovery_message(task.instruction, C.RECOVERY_PROMPT)]
        train_from = len(msgs)
        with R.fork(state.snapshot, task, 1, internet=False)[0] as env:
            added = files(env, roots) - fresh - named
            stray = sorted(p for p in added if not any(p.startswith(q + "/") for q in added))
            dirs = sorted(p for p in named if not Path(p).suffix)
            build.act(env, msgs, "The previous attempt failed. Let me inspect the current state before "
                      "changing anything.", f"ls -la {' '.join(dirs[:3]) or '.'}", 30.0)
            if stray:
                it = "it" if len(stray) == 1 else "them"
                build.act(env, msgs, f"The previous attempt left {', '.join(stray)}, which the task does "
                          f"not ask for. First I remove {it}.", f"rm -rf -- {' '.join(stray)}", 30.0)
            for j, (d, cmd) in enumerate(steps):
                build.act(env, msgs, f"I will redo the task from the first step: {d}." if j == 0 else
                          f"Next: {d}.", cmd, 30.0)
            msgs.append({"role": "assistant", "content": "I redid every step of the task; it is complete."})
            if env.verify().reward < 1.0:
                return
        meta = {"teacher": "oracle-repair", "state": state.id, "error_category": state.category}
        writer.add(build.make_row(task.name, msgs, train_from, meta))

    with C.env_session():
        for _, res in C.run_concurrently(repair, todo, concurrency, "repair rows"):
            if isinstance(res, Exception):
                print(f"repair: {type(res).__name__}: {res}")
    return len(writer.rows)


def train_loss(model: Path, last: int = 100) -> float:
    """Mean training loss of the last `last` steps of the 02 run that wrote `model` (its final/)."""
    rows = C.read_jsonl(model.parent / "metrics.jsonl")[-last:]
    return sum(r["loss"] for r in rows) / len(rows)


def snapshots_present(failures: Path) -> bool:
    """Whether every snapshot image a failures.jsonl names still exists (True if none)."""
    import importlib

    collect = importlib.import_module("03_collect_failures")
    return all(collect.snapshot_exists(r["snapshot"], r.get("host")) for r in C.read_jsonl(failures))


def run_seed(cfg: Config, seed: int, tasks: Path, data: Path, code: str | None) -> dict:
    out = Path(cfg.out) / f"seed{seed}"
    log = out / "log.txt"
    # "held" is the evaluation split (--eval-on): held-out, or dev while a recipe is being chosen
    train_dir, held_dir = tasks / "train", tasks / cfg.eval_on
    grpo_dir = grpo_tasks_dir(cfg, tasks)
    warm_rows = data.parent / ("warmup.jsonl" if cfg.warmup_plain else "solutions.jsonl")
    modes = ("fork", *(["standard"] if cfg.plain_standard else []),  # the GRPO policies, fork first
             *(["standard_retry"] if cfg.retry_baseline else []))
    res: dict = {"seed": seed, "wall_s": {}, "code": code}  # code: the commit it runs at (code_version)
    t = time.monotonic()

    def lap(name: str) -> None:
        nonlocal t
        res["wall_s"][name] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        C.log0(f"seed {seed}: {name} done ({res['wall_s'][name]:.0f} s)")

    base = out / "base"
    if not (base / "config.json").exists():
        words = microtasks.STALE_PIECES if cfg.stale_compose else []
        microtasks.make_model(base, cfg.hidden, cfg.layers, heads=cfg.hidden // 32, seed=seed, words=words)

    def sft_phase(phase: str, rows: Path, start: Path, steps: int, lr: float) -> Path:
        # a constant learning rate without weight decay: a decaying one ends before copying appears
        if not (out / phase / "final/config.json").exists():
            sh(["02_sft.py", "--data", rows, "--model", start, "--out", out / phase, "--max-steps", steps,
                "--lr", lr, "--warmup-steps", max(1, steps // 24), "--min-lr-ratio", 1, "--weight-decay", 0,
                "--max-len", cfg.sft_max_len, "--micro-batch-tokens", cfg.sft_batch_tokens, "--grad-accum", 1,
                "--save-every", 0, "--no-activation-checkpointing", "--seed", seed], log)
        return out / phase / "final"

    warm = sft_phase("warmup", warm_rows, base, cfg.warmup_steps, cfg.warmup_lr)
    # Copying appears abruptly after a seed- and data-dependent number of steps (~1,450 to ~2,600
    # measured), so phase 1 goes on, one fresh 02 run from the last at a time, until its loss shows it.
    runs, loss = 1, train_loss(warm)
    while loss > cfg.copy_loss and runs <= cfg.warmup_extra:
        warm = sft_phase(f"warmup{runs}", warm_rows, warm, cfg.warmup_steps // 2, cfg.warmup_lr)
        runs, loss = runs + 1, train_loss(warm)
    res["warmup_runs"], res["warmup_loss"] = runs, loss
    sft = sft_phase("sft", data, warm, cfg.sft_steps, cfg.sft_lr)
    if cfg.repair_steps:  # phase 3: recoveries of this policy's own train failures, repaired by the oracle
        repairs = out / "repair_rows.jsonl"
        if not repairs.exists():
            pre = out / "failures_pre"
            sh(["03_collect_failures.py", "--tasks", train_dir, "--model", sft, "--out", pre, "--attempts",
                cfg.attempts, "--seed", seed + 1000, "--temperature", 1.0, *pool_flags(cfg, seed + 1000),
                *roll_flags(cfg)], log)
            (pre / "failures.jsonl").touch()
            try:
                repair_rows(pre / "failures.jsonl", train_dir, pre / "repair_rows.jsonl", cfg.concurrency)
            finally:
                C.remove_snapshots(pre / "failures.jsonl")
            (pre / "repair_rows.jsonl").touch()
            (pre / "repair_rows.jsonl").rename(repairs)  # complete: a resumed run does not redo it
        mix = out / "sft_repair.jsonl"
        mix.write_text(repairs.read_text() + data.read_text())
        res["n_repair_rows"] = len(C.read_jsonl(repairs))
        sft = sft_phase("repair", mix, sft, cfg.repair_steps, cfg.sft_lr)
    sft_rows = C.read_jsonl(sft.parent / "metrics.jsonl")
    res["sft_loss"] = [sft_rows[0]["loss"], sft_rows[-1]["loss"]]
    lap("sft")
    res["base_pass_at_1"] = pass_at_1(cfg, base, held_dir, out / "eval_base", seed, log)
    retry = {"base": success_with_retry(out / "eval_base")}  # success within one attempt + one recovery
    lap("eval_base")
    fail = {}
    for part, d in (("heldout", held_dir), ("train", grpo_dir)):
        pool = pool_flags(cfg, seed) if part == "train" else []
        if not snapshots_present(out / f"failures_{part}/failures.jsonl"):
            # an interrupted seed removed its snapshots on the way out: collect the states again
            shutil.rmtree(out / f"failures_{part}")
        sh(["03_collect_failures.py", "--tasks", d, "--model", sft, "--out", out / f"failures_{part}",
            "--attempts", cfg.attempts, "--seed", seed, "--temperature", 1.0, *pool, *roll_flags(cfg)], log)
        fail[part] = out / f"failures_{part}/failures.jsonl"
        fail[part].touch()
        summary = json.loads((out / f"failures_{part}/summary.json").read_text())
        res[f"sft_{part}_pass_at_1"] = summary["pass_rate"]
    res["sft_pass_at_1"] = res["sft_heldout_pass_at_1"]
    # the environment steps (agent turns) stage 03 spent finding the fork pool's failure states
    res["env_steps_pool"] = sum(a["turns"] for a in C.read_jsonl(out / "failures_train/attempts.jsonl"))
    pool_steps = res["env_steps_pool"] if cfg.count_pool_steps else 0
    states = C.read_jsonl(fail["heldout"])
    solved = {a["task"] for a in C.read_jsonl(out / "failures_heldout/attempts.jsonl") if a["reward"] >= 1.0}
    res["n_heldout_failures"] = len(states)
    # A state whose task failed in every attempt shows a systematic error (the policy copies one argument
    # wrong on that pair each time), not bad luck: recovering means doing what it never does there.
    res["heldout_failures_unsolved_frac"] = sum(s["task"] not in solved for s in states) / max(1, len(states))
    # the other failure cause: an entry an earlier run left in the output folder (load_causes)
    causes = load_causes(tasks)
    res["heldout_failures_stale_frac"] = sum(s["task"] in causes for s in states) / max(1, len(states))
    # the held-out task of every sample (every policy forks the same states in the same order)
    res["recovery_sample_tasks"] = [st["task"] for st in states for _ in range(cfg.recovery_samples)]

    def by_cause(rec: list[float], commands: list[list[dict]]) -> dict[str, float | None]:
        return cause_stats(rec, commands, res["recovery_sample_tasks"], causes)
    lap("collect_failures")
    try:
        before, commands = recovery_at_1(cfg, sft, fail["heldout"], held_dir, seed)
        res["recovery_before"] = before
        res["heldout_recovery_before"] = sum(before) / max(1, len(before))
        res["recovery_by_cause"] = {"before": by_cause(before, commands)}
        # SFT's from stage 03: its attempts that passed, plus each failure state's share of recovered forks
        attempts = C.read_jsonl(out / "failures_heldout/attempts.jsonl")
        retry["sft"] = ((sum(a["reward"] >= 1.0 for a in attempts) + sum(before) / cfg.recovery_samples)
                        / max(1, len(attempts)))
        lap("recovery_before")
        res["sft_success_with_retry"] = retry["sft"]
        # the SFT policy's figures, as --sft-only reports them: kept even if the seed is stopped later
        (out / "sft_result.json").write_text(json.dumps(res) + "\n")
        if cfg.sft_only:
            return res
        curve = {m: [{"env_steps": 0, "recovery": res["heldout_recovery_before"],
                      "pass_at_1": res["sft_pass_at_1"]}] for m in modes}
        # every evaluation point as it is made: a seed stopped in a later chunk keeps the earlier ones
        progress = out / "progress.jsonl"
        progress.unlink(missing_ok=True)  # a resumed seed evaluates every point again
        C.append_jsonl(progress, {"policy": "sft", **curve["fork"][0],
                                  "by_cause": res["recovery_by_cause"]["before"], "samples": before})
        res["recovery_after_samples"], res["env_steps"] = {}, {}
        n_chunks = -(-cfg.grpo_steps // cfg.eval_every)
        for c in range(1, n_chunks + 1):
            last = c == n_chunks
            steps = min(cfg.grpo_steps, c * cfg.eval_every)
            budget = pool_steps + grpo_chunk(cfg, "fork", sft, out / "fork", steps, 0, grpo_dir,
                                             fail["train"], seed, last, log)
            used = {"fork": budget} | {m: grpo_chunk(cfg, m, sft, out / m, 10**6, budget, grpo_dir,
                                                     fail["train"], seed, last, log) for m in modes[1:]}
            lap(f"grpo_chunk{c}")
            for mode, steps_used in used.items():
                rec, commands = recovery_at_1(cfg, out / mode / "final", fail["heldout"], held_dir, seed)
                p = pass_at_1(cfg, out / mode / "final", held_dir, out / f"eval_{mode}_{c}", seed, log)
                curve[mode].append({"env_steps": steps_used, "recovery": sum(rec) / max(1, len(rec)),
                                    "pass_at_1": p})
                res["recovery_after_samples"][mode] = rec
                res["recovery_by_cause"][mode] = by_cause(rec, commands)
                res["env_steps"][mode] = steps_used
                retry[mode] = success_with_retry(out / f"eval_{mode}_{c}")
                C.append_jsonl(progress, {"policy": mode, "chunk": c, **curve[mode][-1],
                                          "by_cause": res["recovery_by_cause"][mode], "samples": rec})
            lap(f"eval_chunk{c}")
        res["curve"] = curve
        res["heldout_recovery_after"] = {m: curve[m][-1]["recovery"] for m in curve}
        res["heldout_pass_at_1_after"] = {m: curve[m][-1]["pass_at_1"] for m in curve}
        res["heldout_success_with_retry"] = retry if cfg.eval_retry else None
        res["nonuniform_group_frac"] = {}
        for mode in modes:
            rows = C.read_jsonl(out / mode / "metrics.jsonl")
            groups = sum(r["groups"] for r in rows)
            res["nonuniform_group_frac"][mode] = 1 - sum(r["groups_dropped"] for r in rows) / max(1, groups)
            res[f"train_reward_{mode}"] = [(r["env_steps_total"], r["reward"]) for r in rows]
    finally:
        C.remove_snapshots(fail["heldout"], fail["train"])
    return res


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def bootstrap(per_seed: list[dict], stat, n: int, rng: random.Random) -> list[float]:
    """95% interval of stat(list of resampled seed results): seeds are resampled, and within each
    seed the held-out failure states' recovery samples are resampled (both sources of noise)."""
    vals = []
    for _ in range(n):
        seeds = [rng.choice(per_seed) for _ in per_seed]
        draws = []
        for s in seeds:
            d = dict(s)
            for key in ("before", *s["recovery_after_samples"]):
                xs = s["recovery_before"] if key == "before" else s["recovery_after_samples"][key]
                d[key] = mean([rng.choice(xs) for _ in xs]) if xs else float("nan")
            draws.append(d)
        vals.append(stat(draws))
    vals.sort()
    return [vals[int(0.025 * (n - 1))], vals[int(0.975 * (n - 1))]]


def task_bootstrap(per_seed: list[dict], n: int, rng: random.Random) -> dict[str, list[float]] | None:
    """Paired 95% intervals over held-out TASKS: each draw resamples the task list once, and every
    seed and policy is averaged over the samples of the drawn tasks (a task's states and forks stay
    together, and before / fork / standard share the draw). Seeds are not resampled: the seed-level
    t-interval covers them. None when a run kept no task per sample (runs before that field)."""
    if not per_seed or any("recovery_sample_tasks" not in s for s in per_seed):
        return None
    tasks = sorted({t for s in per_seed for t in s["recovery_sample_tasks"]})
    modes = modes_of(per_seed)
    policies = {"before": lambda s: s["recovery_before"],
                **{m: lambda s, m=m: s["recovery_after_samples"][m] for m in modes}}
    # per seed, policy and task: (sum of rewards, number of samples)
    sums = [{p: {t: [0.0, 0] for t in tasks} for p in policies} for _ in per_seed]
    for seed_sums, s in zip(sums, per_seed, strict=True):
        for p, get in policies.items():
            for t, r in zip(s["recovery_sample_tasks"], get(s), strict=True):
                seed_sums[p][t][0] += r
                seed_sums[p][t][1] += 1
    stats = {**{f"recovery_gain_{p}": lambda m, p=p: m[p] - m["before"] for p in modes},
             **{f"recovery_fork_minus_{p}": lambda m, p=p: m["fork"] - m[p] for p in modes[1:]}}
    vals: dict[str, list[float]] = {k: [] for k in stats}
    for _ in range(n):
        draw = [rng.choice(tasks) for _ in tasks]
        per = []
        for seed_sums in sums:
            tot = {p: [sum(seed_sums[p][t][i] for t in draw) for i in (0, 1)] for p in policies}
            per.append({p: r / k if k else float("nan") for p, (r, k) in tot.items()})
        for k, f in stats.items():
            vals[k].append(mean([f(m) for m in per]))
    return {k: [sorted(v)[int(0.025 * (n - 1))], sorted(v)[int(0.975 * (n - 1))]] for k, v in vals.items()}


# Student-t 0.975 quantiles by degrees of freedom (1-10); 1.96 (normal) beyond, a slight understatement.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]


def t_interval(xs: list[float]) -> list[float] | None:
    """95% Student-t interval of the mean of per-seed values: the seed is the unit of replication
    (None with fewer than 2 seeds)."""
    if len(xs) < 2:
        return None
    m, n = mean(xs), len(xs)
    half = (_T975[n - 2] if n - 1 <= len(_T975) else 1.96) * statistics.stdev(xs) / n ** 0.5
    return [m - half, m + half]


def summarize(cfg: Config, per_seed: list[dict], split: dict) -> dict:
    modes = modes_of(per_seed)
    def avg(key: str) -> dict:
        return {m: mean([s[key][m] for s in per_seed]) for m in modes}

    res = {
        "seeds": [s["seed"] for s in per_seed],
        "heldout_tasks": split["heldout"], "train_tasks": split["train"], "pool_tasks": split["pool"],
        "dev_tasks": split.get("dev", []), "evaluated_on": cfg.eval_on,  # the heldout_* figures' split
        "sft_pass_at_1": mean([s["sft_pass_at_1"] for s in per_seed]),
        "sft_train_pass_at_1": mean([s["sft_train_pass_at_1"] for s in per_seed]),
        "base_pass_at_1": mean([s["base_pass_at_1"] for s in per_seed]),
        "heldout_recovery_before": mean([s["heldout_recovery_before"] for s in per_seed]),
        "heldout_recovery_after": avg("heldout_recovery_after"),
        "heldout_pass_at_1_after": avg("heldout_pass_at_1_after"),
        "env_steps": {m: round(mean([s["env_steps"][m] for s in per_seed])) for m in modes},
        # None where a run predates the figure
        "heldout_success_with_retry": ({p: mean([s["heldout_success_with_retry"][p] for s in per_seed])
                                        for p in ("base", "sft", *modes)}
                                       if all(s.get("heldout_success_with_retry") for s in per_seed)
                                       else None),
        # stage 03's pool collection (inside env_steps["fork"] when config.count_pool_steps)
        "env_steps_pool": (mean([s["env_steps_pool"] for s in per_seed])
                           if all("env_steps_pool" in s for s in per_seed) else None),
        "nonuniform_group_frac": avg("nonuniform_group_frac"),
        "heldout_failures_unsolved_frac": mean([s["heldout_failures_unsolved_frac"] for s in per_seed
                                                if "heldout_failures_unsolved_frac" in s]),
        "heldout_failures_stale_frac": mean([s.get("heldout_failures_stale_frac", 0.0) for s in per_seed]),
        # Recovery@1 of the states on stale-file tasks and of the others, per policy (mean over seeds)
        "recovery_by_cause": {p: {c: mean([x for s in per_seed if (x := s.get("recovery_by_cause", {})
                                                                   .get(p, {}).get(c)) is not None])
                                  for c in CAUSES} for p in ("before", *modes)},
        # the share of recoveries on states without the stale file that removed it all the same
        "blind_repair_rate": {p: mean([x for s in per_seed if (x := s.get("recovery_by_cause", {})
                                                               .get(p, {}).get("blind_removal")) is not None])
                              for p in ("before", *modes)},
    }
    rng = random.Random(0)
    res["ci95"] = {
        "heldout_recovery_before": bootstrap(per_seed, lambda d: mean([x["before"] for x in d]),
                                             cfg.bootstrap, rng),
        **{f"heldout_recovery_after_{m}": bootstrap(per_seed, lambda d, m=m: mean([x[m] for x in d]),
                                                    cfg.bootstrap, rng) for m in modes},
        **{f"recovery_gain_{m}": bootstrap(per_seed, lambda d, m=m: mean([x[m] - x["before"] for x in d]),
                                           cfg.bootstrap, rng) for m in modes},
        **{f"recovery_fork_minus_{m}": bootstrap(per_seed, lambda d, m=m: mean([x["fork"] - x[m] for x in d]),
                                                 cfg.bootstrap, rng) for m in modes[1:]}}

    def seed_ci(f) -> list[float] | None:  # f(one seed's results) -> a number
        return t_interval([f(s) for s in per_seed])

    after, passed = "heldout_recovery_after", "heldout_pass_at_1_after"
    res["ci95_seeds"] = {
        "heldout_recovery_before": seed_ci(lambda s: s["heldout_recovery_before"]),
        **{f"heldout_recovery_after_{m}": seed_ci(lambda s, m=m: s[after][m]) for m in modes},
        **{f"recovery_gain_{m}": seed_ci(lambda s, m=m: s[after][m] - s["heldout_recovery_before"])
           for m in modes},
        **{f"recovery_fork_minus_{m}": seed_ci(lambda s, m=m: s[after]["fork"] - s[after][m])
           for m in modes[1:]},
        **{f"pass_at_1_fork_minus_{m}": seed_ci(lambda s, m=m: s[passed]["fork"] - s[passed][m])
           for m in modes[1:]}}
    res["ci95_tasks"] = task_bootstrap(per_seed, cfg.bootstrap, rng)
    res["per_seed"] = per_seed
    # the commits the seeds ran at ("None": a run from before the field, or outside git)
    res["code"] = sorted({str(s.get("code")) for s in per_seed})
    res["config"] = dataclasses.asdict(cfg)
    return res


def policy_tables(res: dict) -> str:
    """The README's two tables: per policy its budget, Recovery@1 with the gain over SFT and both
    95% intervals (seed-level t, task-level paired bootstrap), Pass@1 and success within one attempt
    plus one recovery; then per policy Recovery@1 by the cause of the failure state, the share of
    recoveries that removed their own planted entry, and blind removals (a planted name removed
    where nothing was planted)."""
    def f(x: float | None) -> str:
        return "-" if x is None or x != x else f"{x:.3f}"

    def ci(intervals: dict | None, key: str) -> str:
        iv = (intervals or {}).get(key)
        return "-" if not iv else f"[{iv[0]:+.3f}, {iv[1]:+.3f}]"

    modes, swr = modes_of(res["per_seed"]), res.get("heldout_success_with_retry") or {}
    before, after = res["heldout_recovery_before"], res["heldout_recovery_after"]
    rows = ["| policy | env steps | Recovery@1 | gain over SFT | t-ci95 (seeds) | ci95 (tasks, paired) "
            "| Pass@1 (T=1) | success, attempt + recovery |", "|---" * 8 + "|",
            f"| base (random init) | - | - | - | - | - | {f(res['base_pass_at_1'])} | {f(swr.get('base'))} |",
            f"| SFT | 0 | {f(before)} | - | - | - | {f(res['sft_pass_at_1'])} | {f(swr.get('sft'))} |"]

    def both(key: str) -> str:
        return f"{ci(res.get('ci95_seeds'), key)} | {ci(res.get('ci95_tasks'), key)}"

    rows += [f"| {m} | {res['env_steps'][m]:,} | {f(after[m])} | {after[m] - before:+.3f} "
             f"| {both(f'recovery_gain_{m}')} | {f(res['heldout_pass_at_1_after'][m])} | {f(swr.get(m))} |"
             for m in modes]
    rows += [f"| fork minus {m} | | | {after['fork'] - after[m]:+.3f} "
             f"| {both(f'recovery_fork_minus_{m}')} | | |" for m in modes[1:]]
    cause, kinds = res["recovery_by_cause"], microtasks.STALE_KINDS
    rows += ["", "| policy | " + " | ".join(f"Recovery@1: {k}" for k in kinds) + " | no planted entry "
             "| removed its own entry / Recovery@1 of those | blind removals |",
             "|---" * (len(kinds) + 4) + "|"]
    for p, c in cause.items():
        removed = f"{f(c.get('stale_removed'))} / {f(c.get('stale_removed_recovered'))}"
        rows.append(f"| {'SFT' if p == 'before' else p} | " + " | ".join(f(c.get(k)) for k in kinds)
                    + f" | {f(c.get('other'))} | {removed} | {f(c.get('blind_removal'))} |")
    return "\n".join(rows)


def run_table(per_seed: list[dict], labels: list[str]) -> str:
    """One markdown row per run: held-out Recovery@1 after SFT and after each mode's last chunk (its
    gain in brackets), the share of stale-file recoveries that removed the planted entry, Pass@1, the
    share of the fork run's groups (forks and fresh starts) that were non-uniform, and the seed's minutes
    (its phases; a data build, shared by the seeds that copy it, is not counted)."""
    def share(s: dict, policy: str) -> str:
        x = s.get("recovery_by_cause", {}).get(policy, {}).get("stale_removed")
        return "-" if x is None else f"{x:.2f}"

    modes = modes_of(per_seed)
    names = " / ".join(modes)
    rows = [f"| run | SFT Pass@1 | held-out states (stale share) | Recovery@1 SFT | {' | '.join(modes)} "
            f"| stale: removed the entry, SFT → {names} | Pass@1 {names} | non-uniform groups (fork run) "
            "| min (no data build) |", "|---" * (8 + len(modes)) + "|"]
    for label, s in zip(labels, per_seed, strict=True):
        before, after = s["heldout_recovery_before"], s["heldout_recovery_after"]
        recovery = " | ".join(f"{after[m]:.3f} ({after[m] - before:+.3f})" for m in modes)
        removed = f"{share(s, 'before')} → " + " / ".join(share(s, m) for m in modes)
        passed = " / ".join(f"{s['heldout_pass_at_1_after'][m]:.3f}" for m in modes)
        states = f"{s['n_heldout_failures']} ({s.get('heldout_failures_stale_frac', 0.0):.2f})"
        rows.append(f"| {label} | {s['sft_pass_at_1']:.3f} | {states} | {before:.3f} | {recovery} "
                    f"| {removed} | {passed} | {s['nonuniform_group_frac']['fork']:.2f} "
                    f"| {sum(s['wall_s'].values()) / 60:.0f} |")
    return "\n".join(rows)


def combine(cfg: Config) -> dict:
    """Pool the seeds of finished runs (--combine DIR ...) of one task split and one recipe (their
    configs may differ in RUN_FIELDS only): results.json, learning.png and the per-run table in --out,
    as if one run had made them all. Runs nothing."""
    out = Path(cfg.out)
    if (out / "tasks").exists():
        raise SystemExit(f"--out {out} holds a run: give --combine a folder of its own")
    per_seed, labels, split, first, configs = [], [], None, None, {}
    for d in map(Path, cfg.combine):
        r = json.loads((d / "results.json").read_text())
        s = {"heldout": r["heldout_tasks"], "train": r["train_tasks"], "pool": r["pool_tasks"],
             "dev": r.get("dev_tasks", [])}
        rec = recipe(r["config"])
        if split is not None and s != split:
            raise SystemExit(f"{d} evaluated other tasks than {cfg.combine[0]}: runs of one split only")
        if first is not None and (diff := [k for k in rec if rec[k] != first[k]]):
            raise SystemExit(f"{d} ran another recipe than {cfg.combine[0]} ({', '.join(diff)} differ): "
                             "runs of one recipe only")
        split, first = s, first or rec
        configs[str(d)] = r["config"]
        per_seed += r["per_seed"]
        labels += [f"{d.name} seed {x['seed']}" for x in r["per_seed"]]
    out.mkdir(parents=True, exist_ok=True)
    res = summarize(cfg, per_seed, split) | {"runs": labels, "run_configs": configs}
    res["config"] = first | {"combine": cfg.combine}  # the pooled runs' recipe, not this command's defaults
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    plot(res, out / "learning.png")
    report(res, split, out, labels)
    return res


def band_panel(ax, lines: list[tuple[str, str, list[float], list[float], list[float], list[float]]],
               xlabel: str, title: str) -> None:
    """One panel of curves with a min-max band each: (label, color, xs, mean, low, high) per line."""
    for label, color, xs, ys, lo, hi in lines:
        ax.plot(xs, ys, "o-", color=color, label=label)
        ax.fill_between(xs, lo, hi, color=color, alpha=0.15)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = ((axes[0], "recovery", "held-out Recovery@1"), (axes[1], "pass_at_1", "held-out Pass@1"))
    for ax, key, title in panels:
        lines = []
        for mode, color in zip(modes_of(res["per_seed"]), ("tab:red", "tab:blue", "tab:green"), strict=False):
            curves = [s["curve"][mode] for s in res["per_seed"]]
            n = min(map(len, curves))
            xs = [mean([c[i]["env_steps"] for c in curves]) for i in range(n)]
            ys = [[c[i][key] for c in curves] for i in range(n)]
            lines.append((f"{mode} (mean of {len(curves)})", color, xs, [mean(y) for y in ys],
                          [min(y) for y in ys], [max(y) for y in ys]))
        band_panel(ax, lines, "environment steps (GRPO rollouts)", title)
    fig.suptitle("ReTerm-GRPO on micro tasks: fork vs baselines at equal environment steps (band: min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def require_commit(commit: str) -> str | None:
    """This checkout's code_version(); refuse to run unless it is a clean one at `commit` (a frozen
    protocol's runs) where one is named."""
    version = code_version()
    if commit and not (version and version.startswith(commit) and not version.endswith("+dirty")):
        raise SystemExit(f"--require-commit {commit}: this checkout is at {version}; run from "
                         f"a clean checkout of it (git worktree add DIR {commit})")
    return version


def main(argv: list[str] | None = None) -> dict:
    cfg = C.parse_config(Config, argv)
    if cfg.combine:
        return combine(cfg)
    version = require_commit(cfg.require_commit)
    out = Path(cfg.out)
    if (out / "config.json").exists():  # a resumed run: its task folders and 01 rows must still be right
        old, new = split_fields(json.loads((out / "config.json").read_text())), split_fields(vars(cfg))
        changed = [k for k in SPLIT_FIELDS if old[k] != new[k]]
        if changed:
            raise SystemExit(f"{out} holds the tasks and data of another split ({', '.join(changed)} "
                             "changed): use a fresh --out")
    C.check_choice("--eval-on", cfg.eval_on, ("heldout", "dev"))
    if cfg.eval_on == "dev" and cfg.dev_frac <= 0 and not cfg.entry_split:
        raise SystemExit("--eval-on dev needs a dev split: pass --dev-frac > 0 (or --entry-split)")
    if cfg.entry_split and not cfg.stale_vary:
        raise SystemExit("--entry-split plants the entries of --stale-vary: add --stale-vary")
    if not 0.0 <= cfg.plain_frac <= 1.0:
        raise SystemExit("--plain-frac is a share in [0, 1]")
    if cfg.stale_compose and not cfg.stale_vary:
        raise SystemExit("--stale-compose chooses the names of --stale-vary: add --stale-vary")
    if cfg.plain_demos and cfg.fresh_out:
        raise SystemExit("--fresh-out solutions remove the stale file that --plain-demos rows repair: "
                         "add --no-plain-demos")
    C.dump_config(cfg, out)
    t0 = time.monotonic()
    tasks = out / "tasks"
    split = write_tasks(cfg, tasks)
    recoveries, plain, solutions, data = (out / "data" / f for f in ("reterm.jsonl", "plain.jsonl",
                                                                      "solutions.jsonl", "sft.jsonl"))
    sh(["01_build_data.py", "--tasks", tasks / "train", "--teacher", "oracle", "--out", recoveries,
        "--faults-per-task", cfg.faults_per_task, "--concurrency", cfg.concurrency, "--seed", cfg.task_seed,
        "--scopes", cfg.scopes, "--inspect", cfg.inspect, "--system-prompt", microtasks.SYSTEM_PROMPT],
       out / "log.txt")
    plain.touch()
    plain_tasks = demo_tasks(split, cfg.plain_frac, cfg.task_seed) if cfg.plain_demos else set()
    if plain_tasks:
        have = {r["task_id"] for r in C.read_jsonl(recoveries) if r["meta"]["fault"] == "drop@0"}
        plain_rows(tasks / "train", plain_tasks, plain, cfg.concurrency, skip=have, inspect=cfg.inspect)
    # with --fresh-out a first attempt removes a stale file without knowing of it: every task has its row
    no_row = set() if cfg.fresh_out else set(split["stale"])
    solution_rows(tasks / "train", solutions, cfg.concurrency, skip=no_row)
    # plain.jsonl may hold rows of a larger --plain-frac (a copied data folder): only the chosen tasks' go in
    plain_kept = [r for r in C.read_jsonl(plain) if r["task_id"] in plain_tasks]
    data.write_text(recoveries.read_text() + "".join(json.dumps(r) + "\n" for r in plain_kept)
                    + solutions.read_text())
    if cfg.warmup_plain:
        (out / "data/warmup.jsonl").write_text(solutions.read_text() + "".join(json.dumps(r) + "\n"
                                                                             for r in plain_kept))
    build_s = round(time.monotonic() - t0, 1)
    per_seed = []
    for seed in range(cfg.first_seed, cfg.first_seed + cfg.seeds):
        path = out / f"seed{seed}" / ("sft_result.json" if cfg.sft_only else "result.json")
        if path.exists():  # a finished seed is not redone
            per_seed.append(json.loads(path.read_text()))
            continue
        r = run_seed(cfg, seed, tasks, data, version)
        if not cfg.sft_only:  # run_seed wrote sft_result.json itself
            path.write_text(json.dumps(r) + "\n")
        per_seed.append(r)
    if cfg.sft_only:
        return sft_report(cfg, per_seed, split, out)
    res = summarize(cfg, per_seed, split)
    res["n_sft_rows"] = {"recovery": len(C.read_jsonl(recoveries)), "plain": len(plain_kept),
                         "solution": len(C.read_jsonl(solutions))}
    res["wall_s"] = {"total": round(time.monotonic() - t0, 1), "build_data": build_s}
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    plot(res, out / "learning.png")
    report(res, split, out, [f"seed {s['seed']}" for s in per_seed])
    return res


def sft_report(cfg: Config, per_seed: list[dict], split: dict, out: Path) -> dict:
    """--sft-only: the SFT policy's figures per seed and their mean (results.json), printed."""
    keys = ("base_pass_at_1", "sft_pass_at_1", "sft_train_pass_at_1", "heldout_recovery_before",
            "sft_success_with_retry", "heldout_failures_stale_frac", "n_heldout_failures")
    res = {"sft_only": True, "seeds": [s["seed"] for s in per_seed], "evaluated_on": cfg.eval_on,
           **{f"{k}_tasks": split.get(k, []) for k in ("heldout", "train", "pool", "dev")},
           **{k: mean([s[k] for s in per_seed]) for k in keys}}
    before = [s["recovery_by_cause"]["before"] for s in per_seed]
    res |= {"recovery_by_cause": {"before": {c: mean([b[c] for b in before if b.get(c) is not None])
                                             for c in CAUSES}},
            "per_seed": per_seed, "code": sorted({str(s.get("code")) for s in per_seed}),
            "config": dataclasses.asdict(cfg)}
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"\nSFT only, evaluated on {cfg.eval_on} ({len(split[cfg.eval_on])} tasks), seeds {res['seeds']}")
    for k in keys:
        print(f"{k:<30}{res[k]:>8.3f}   per seed {[round(s[k], 3) for s in per_seed]}")
    by_cause = res["recovery_by_cause"]["before"].items()
    print("Recovery@1 by cause: " + ", ".join(f"{c} {x:.3f}" for c, x in by_cause if x == x))  # nan: none
    print(f"wrote {out / 'results.json'}")
    return res


def report(res: dict, split: dict, out: Path, labels: list[str]) -> None:
    ci = res["ci95"]

    def r3(xs: list[float]) -> list[float]:
        return [round(x, 3) for x in xs]

    part = res.get("evaluated_on", "heldout")  # every "held-out" figure below is on this split
    print(f"\nevaluated on {part}: {len(split[part])} tasks; train: {len(split['train'])} tasks; "
          f"seeds {res['seeds']}")
    print(f"Pass@1 (T=1, held-out)  base {res['base_pass_at_1']:.3f}   SFT {res['sft_pass_at_1']:.3f}")
    print(f"held-out failure states on tasks the SFT policy failed in every attempt: "
          f"{res['heldout_failures_unsolved_frac']:.2f}")
    print(f"{'policy':<16}{'env steps':>10}{'Recovery@1':>12}{'ci95':>18}{'Pass@1':>9}{'non-uniform':>13}")
    print(f"{'SFT':<16}{0:>10}{res['heldout_recovery_before']:>12.3f}"
          f"{str(r3(ci['heldout_recovery_before'])):>18}{res['sft_pass_at_1']:>9.3f}")
    modes = modes_of(res["per_seed"])
    for m in modes:
        print(f"{m:<16}{res['env_steps'][m]:>10}{res['heldout_recovery_after'][m]:>12.3f}"
              f"{str(r3(ci[f'heldout_recovery_after_{m}'])):>18}"
              f"{res['heldout_pass_at_1_after'][m]:>9.3f}{res['nonuniform_group_frac'][m]:>13.2f}")

    def intervals(ci: dict, keys: tuple[str, ...]) -> str:
        return ", ".join(f"{k.replace('recovery_', '').replace('_', ' ')} {r3(ci[k])}"
                         for k in keys if k in ci)

    gains = tuple(f"recovery_gain_{m}" for m in modes) + tuple(f"recovery_fork_minus_{m}" for m in modes[1:])
    print(f"Recovery@1 ci95 (bootstrap over seeds and forks): {intervals(ci, gains)}")
    if len(res["seeds"]) > 1:
        print("seed-level t-ci95: " + intervals(res["ci95_seeds"], gains + tuple(
            f"pass_at_1_fork_minus_{m}" for m in modes[1:])))
    if res.get("ci95_tasks"):
        print(f"task-level paired bootstrap ci95: {intervals(res['ci95_tasks'], gains)}")
    if res["heldout_failures_stale_frac"]:
        cause = res["recovery_by_cause"]
        print(f"held-out failure states on stale-file tasks: {res['heldout_failures_stale_frac']:.2f}; "
              "Recovery@1 stale / other: " + ", ".join(
                  f"{p} {cause[p]['stale']:.3f} / {cause[p]['other']:.3f}" for p in cause))
    print("\n" + policy_tables(res) + "\n")
    print(run_table(res["per_seed"], labels))
    print(f"wrote {out / 'results.json'} and {out / 'learning.png'}")


if __name__ == "__main__":
    C.run_main(main)
