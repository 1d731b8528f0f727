"""Stage 05 — Pass@1 on Terminal-Bench 2.0-format tasks (Harbor semantics).

Every (task, trial) runs in a fresh container: the agent acts under the task's agent timeout,
then the verifier runs even if the agent timed out; a trial with an error or no reward
counts 0. Pass@1 = mean reward over all trials. Completed trials in OUT/trials.jsonl are not
re-run, so an interrupted evaluation resumes where it stopped.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from pathlib import Path

from tqdm import tqdm

import common as C


@dataclasses.dataclass
class Config:
    """Evaluate an agent on Harbor-format tasks and report Pass@1 by category."""

    tasks: str = "tasks"  # folder of Harbor tasks (Terminal-Bench 2.0 layout)
    out: str = "runs/eval"  # output folder: trials.jsonl, summary.json, config.json
    agent: str = "oracle"  # oracle (runs solution/solve.sh) | null (does nothing) | policy
    model: str | None = None  # --agent policy: a model folder or hub name
    engine: str = "vllm"  # vllm | hf (transformers fallback)
    dtype: str = "bfloat16"  # policy weights' dtype in the engine
    temperature: float = 0.6  # sampling temperature (0 = greedy)
    top_p: float = 0.95  # nucleus sampling
    max_tokens: int = 4096  # per assistant turn
    max_turns: int = 50  # assistant turns per attempt
    max_context: int = 32768  # tokens per attempt (the engine's max_model_len)
    command_timeout: float = 180.0  # seconds per bash call
    seed: int = 0  # sampling seed
    recovery: bool = False  # run one recovery attempt from each failed trial's snapshot (Recovery@1)
    trials: int = 1  # k trials per task; Pass@1 averages over all of them
    concurrency: int = 4  # trials running at once (one container each)
    docker_hosts: str = ""  # Docker engines URL[#slots],... (unix://, ssh://, tcp://); "" = the local one
    task_filter: str | None = None  # regex: only tasks whose name matches
    timeout_multiplier: float = 1.0  # scales agent and verifier timeouts from task.toml
    allow_internet: bool = False  # give containers a network when the task allows it


def run_trial(cfg: Config, task: C.Task, trial: int) -> dict:
    """One trial in a fresh container; never raises (errors become reward 0)."""
    t0 = time.monotonic()
    row = {"task": task.name, "trial": trial, "category": task.category,
           "difficulty": task.difficulty, "reward": 0.0, "error": None, "turns": 0,
           "agent_timed_out": False, "host": None}
    try:
        with C.HOSTS.slot() as row["host"], C.start_env(task, allow_internet=cfg.allow_internet,
                                                        host=row["host"]) as env:
            if cfg.agent == "oracle":
                env.upload(task.solution_dir, "/solution")
                res = env.bash("bash /solution/solve.sh",
                               timeout=task.agent_timeout_sec * cfg.timeout_multiplier)
                row["turns"], row["agent_timed_out"] = 1, res.timed_out
            verdict = env.verify(task.verifier_timeout_sec * cfg.timeout_multiplier)
            row["reward"], row["error"] = verdict.reward, verdict.error
    except Exception as e:  # build/start failures count 0, like Harbor
        row["error"] = f"{type(e).__name__}: {e}"
    row["seconds"] = round(time.monotonic() - t0, 2)
    return row


def run_policy(cfg: Config, todo: list[tuple[C.Task, int, int]], out: Path) -> None:
    """Policy trials on a pool of `concurrency` container slots, each on its own clock. With
    --recovery a failed trial's snapshot (committed before verification) gets one recovery
    attempt as soon as the trial ends; the trial's rows are written once both are done, so a
    resumed run never has a trial without its recovery."""
    vllm_kw = {"max_model_len": cfg.max_context, "seed": cfg.seed} if cfg.engine == "vllm" else {}
    engine = C.make_engine(cfg.engine, cfg.model, dtype=cfg.dtype, **vllm_kw)
    sampling = C.SamplingConfig(cfg.temperature, cfg.top_p, cfg.max_tokens, cfg.seed)
    rcfg = C.RolloutConfig(cfg.max_turns, cfg.max_context, cfg.command_timeout,
                           cfg.timeout_multiplier, cfg.concurrency, sampling)
    tok = engine.tokenizer
    bar = tqdm(total=len(todo), desc="eval[policy]")
    with C.RolloutPool(engine, rcfg, cfg.allow_internet) as pool:
        for task, k, j in todo:  # trial j of the run (its place in tasks x trials) samples with seed + j
            snapshot = "failed" if cfg.recovery else "none"
            pool.submit(C.first_attempt(task, tok, cfg.seed + j), snapshot=snapshot, tag=(k, j, None))
        for (k, j, trial), ep in pool.completed():
            if trial is None and ep.snapshot:  # a failed trial: fork its recovery now
                state = C.FailureState.from_episode(ep, cfg.model)
                rec = C.recovery_attempt(ep.task, state, tok, cfg.seed + j + 2**20)  # disjoint seeds
                pool.submit(rec, ep.snapshot, tag=(k, j, ep))
                continue
            if trial is not None:
                C.remove_image(trial.snapshot)
                save_trajectory(out, f"{ep.task.name}__{k}__recovery", ep)
                C.append_jsonl(out / "recovery.jsonl", {
                    "task": ep.task.name, "trial": k, "category": trial.category, "reward": ep.reward,
                    "turns": ep.turns, "error": ep.error or ep.verify_error})
                ep = trial
            save_trajectory(out, f"{ep.task.name}__{k}", ep)
            C.append_jsonl(out / "trials.jsonl", {
                "task": ep.task.name, "trial": k, "category": ep.task.category,
                "difficulty": ep.task.difficulty, "reward": ep.reward,
                "error": ep.error or ep.verify_error, "turns": ep.turns, "end": ep.end,
                "error_category": ep.category, "agent_timed_out": ep.end == "timeout",
                "seconds": ep.seconds, "queue_s": round(ep.queue_s, 2), "host": ep.host})
            bar.update(1)
    bar.close()
    C.log0("rollout: " + ", ".join(f"{k} {v:.3g}" for k, v in pool.stats().items()))


def save_trajectory(out: Path, name: str, ep: C.Episode) -> None:
    """Messages + token ids per trial, so a failure can be inspected (and trained on)."""
    path = out / "trajectories" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ep.record()))


def summarize(rows: list[dict], n_tasks: int) -> dict:
    """Pass@1 overall and by category / difficulty."""

    def group(key: str) -> dict:
        by = collections.defaultdict(list)
        for r in rows:
            by[r[key]].append(r["reward"])
        return {k: {"pass_at_1": sum(v) / len(v), "n_trials": len(v)} for k, v in sorted(by.items())}

    return {
        "pass_at_1": sum(r["reward"] for r in rows) / max(1, len(rows)),
        "n_tasks": n_tasks,
        "n_trials": len(rows),
        "n_errors": sum(1 for r in rows if r["error"]),
        "by_category": group("category"),
        "by_difficulty": group("difficulty"),
    }


def print_table(summary: dict) -> None:
    print(f"\n{'group':<32}{'trials':>8}{'pass@1':>9}")
    for key in ("by_category", "by_difficulty"):
        for name, s in summary[key].items():
            print(f"{key[3:] + ':' + name:<32}{s['n_trials']:>8}{s['pass_at_1']:>9.3f}")
    print(f"{'overall':<32}{summary['n_trials']:>8}{summary['pass_at_1']:>9.3f}"
          f"   ({summary['n_tasks']} tasks, {summary['n_errors']} trials with errors)")
    if "recovery_at_1" in summary:
        print(f"\n{'failure category':<32}{'failures':>8}{'rec@1':>9}")
        for name, r in summary["recovery_by_category"].items():
            print(f"{name:<32}{r['n_failures']:>8}{r['recovery_at_1']:>9.3f}")
        n = sum(r["n_failures"] for r in summary["recovery_by_category"].values())
        print(f"{'recovery overall':<32}{n:>8}{summary['recovery_at_1']:>9.3f}")


def main(argv: list[str] | None = None) -> dict:
    cfg = C.parse_config(Config, argv)
    C.use_docker_hosts(cfg.docker_hosts)
    if cfg.agent not in ("oracle", "null", "policy"):
        raise SystemExit(f"--agent {cfg.agent!r}: choose oracle, null or policy")
    if cfg.agent == "policy" and not cfg.model:
        raise SystemExit("--agent policy needs --model PATH (a model folder or hub name)")
    tasks = C.load_tasks(cfg.tasks, cfg.task_filter)
    out = Path(cfg.out)
    C.dump_config(cfg, out)
    trials_path = out / "trials.jsonl"
    done = {(r["task"], r["trial"]) for r in C.read_jsonl(trials_path)}
    todo = [(t, k, i * cfg.trials + k) for i, t in enumerate(tasks) for k in range(cfg.trials)
            if (t.name, k) not in done]
    C.log0(f"{len(tasks)} tasks x {cfg.trials} trials: {len(done)} done, {len(todo)} to run")
    with C.env_session():
        if cfg.agent == "policy":
            if todo:
                run_policy(cfg, todo, out)
        else:
            for _, row in C.run_concurrently(lambda tk: run_trial(cfg, *tk[:2]), todo, cfg.concurrency,
                                             desc=f"eval[{cfg.agent}]"):
                C.append_jsonl(trials_path, row)
    names = {t.name for t in tasks}
    rows = [r for r in C.read_jsonl(trials_path) if r["task"] in names and r["trial"] < cfg.trials]
    summary = summarize(rows, len(tasks))
    recs = [r for r in C.read_jsonl(out / "recovery.jsonl") if r["task"] in names]
    if recs:
        by = collections.defaultdict(list)
        for r in recs:
            by[r["category"]].append(r["reward"])
        summary["recovery_at_1"] = sum(r["reward"] for r in recs) / len(recs)
        summary["recovery_by_category"] = {
            k: {"recovery_at_1": sum(v) / len(v), "n_failures": len(v)} for k, v in sorted(by.items())}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_table(summary)
    return summary


if __name__ == "__main__":
    C.run_main(main)
