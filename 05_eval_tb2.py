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

import common as C


@dataclasses.dataclass
class Config:
    """Evaluate an agent on Harbor-format tasks and report Pass@1 by category."""

    tasks: str = "tasks"  # folder of Harbor tasks (Terminal-Bench 2.0 layout)
    out: str = "runs/eval"  # output folder: trials.jsonl, summary.json, config.json
    agent: str = "oracle"  # oracle (runs solution/solve.sh) | null (does nothing)
    trials: int = 1  # k trials per task; Pass@1 averages over all of them
    concurrency: int = 4  # trials running at once (one container each)
    task_filter: str | None = None  # regex: only tasks whose name matches
    timeout_multiplier: float = 1.0  # scales agent and verifier timeouts from task.toml
    allow_internet: bool = False  # give containers a network when the task allows it


def run_trial(cfg: Config, task: C.Task, trial: int) -> dict:
    """One trial in a fresh container; never raises (errors become reward 0)."""
    t0 = time.monotonic()
    row = {"task": task.name, "trial": trial, "category": task.category,
           "difficulty": task.difficulty, "reward": 0.0, "error": None, "turns": 0,
           "agent_timed_out": False}
    try:
        with C.start_env(task, allow_internet=cfg.allow_internet) as env:
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
    print(f"\n{'group':<28}{'trials':>8}{'pass@1':>9}")
    for key in ("by_category", "by_difficulty"):
        for name, s in summary[key].items():
            print(f"{key[3:] + ':' + name:<28}{s['n_trials']:>8}{s['pass_at_1']:>9.3f}")
    print(f"{'overall':<28}{summary['n_trials']:>8}{summary['pass_at_1']:>9.3f}"
          f"   ({summary['n_tasks']} tasks, {summary['n_errors']} trials with errors)")


def main(argv: list[str] | None = None) -> dict:
    cfg = C.parse_config(Config, argv)
    if cfg.agent not in ("oracle", "null"):
        raise SystemExit(f"--agent {cfg.agent!r}: choose oracle or null")
    tasks = C.load_tasks(cfg.tasks, cfg.task_filter)
    out = Path(cfg.out)
    C.dump_config(cfg, out)
    trials_path = out / "trials.jsonl"
    done = {(r["task"], r["trial"]) for r in C.read_jsonl(trials_path)}
    todo = [(t, k) for t in tasks for k in range(cfg.trials) if (t.name, k) not in done]
    C.log0(f"{len(tasks)} tasks x {cfg.trials} trials: {len(done)} done, {len(todo)} to run")
    with C.env_session():
        for _, row in C.run_concurrently(lambda tk: run_trial(cfg, *tk), todo, cfg.concurrency,
                                         desc=f"eval[{cfg.agent}]"):
            C.append_jsonl(trials_path, row)
    names = {t.name for t in tasks}
    rows = [r for r in C.read_jsonl(trials_path) if r["task"] in names and r["trial"] < cfg.trials]
    summary = summarize(rows, len(tasks))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_table(summary)
    return summary


if __name__ == "__main__":
    main()
