"""Stage 03 — collect failure states: the policy's own failed attempts, frozen as snapshots.

The policy attempts every training task k times (a fresh container each, `concurrency` at once).
A failed attempt's container is committed to an image *before* the verifier touches it
(Recovery-Bench does the same), and becomes a record in OUT/failures.jsonl: id, task, snapshot
image, the attempt's messages and exact token ids, error category, policy. ReTerm-GRPO (stage 04)
forks G recovery attempts from each. Successful attempts are only counted.

Snapshot images are kept (label reterm.keep=1) until `--gc` finds no record referring to them;
`--gc` also drops records whose image is gone. Every attempt is logged in OUT/attempts.jsonl,
so a killed run resumes with the attempts it has not done.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
from pathlib import Path

import common as C


@dataclasses.dataclass(kw_only=True)
class Config:
    """Run the policy on training tasks and keep every failed attempt as a forkable snapshot.

    Defaults are our choices for a paper-scale run (the paper's hyper-parameters are not public):
    temperature 1 and top_p 1 sample the full distribution, as stage 04's rollouts do (TRL's
    GRPOConfig defaults), so the pool holds failures GRPO itself would meet; timeouts are the
    tasks' own; attempts and concurrency are guesses."""

    tasks: str = "tasks"  # folder of Harbor training tasks
    model: str | None = None  # policy model folder (required unless --gc)
    out: str = "runs/failures"  # output folder: failures.jsonl, attempts.jsonl, summary.json, runs.txt
    engine: str = "vllm"  # vllm | hf
    attempts: int = 4  # k attempts per task
    concurrency: int = 16  # container slots (attempts running at once)
    docker_hosts: str = ""  # Docker engines URL[#slots],... (unix://, ssh://, tcp://); "" = the local one
    max_turns: int | None = None  # assistant turns per attempt (default: the model's scaffold.json)
    max_context: int | None = None  # tokens per attempt (default: the model's scaffold)
    max_tokens: int | None = None  # tokens per assistant turn (default: the model's scaffold)
    temperature: float = 1.0  # sampling temperature
    top_p: float = 1.0  # nucleus sampling
    command_timeout: float | None = None  # seconds per bash call (default: the model's scaffold)
    timeout_multiplier: float = 1.0  # scales task.toml timeouts
    seed: int = 0  # sampling seed
    task_filter: str | None = None  # regex: only tasks whose name matches
    sample: int = 0  # draw N tasks of a large corpus from a seeded permutation (0 = all)
    sample_skip: int = 0  # skip the permutation's first K (a held-out set disjoint from --sample K)
    split_seed: int = 0  # seed of the --sample permutation
    no_internet: bool = False  # no network for any task (default: as each task.toml says)
    policy: str | None = None  # policy identifier stored in records (default: the model folder)
    retry_errors: bool = False  # on resume, also re-run attempts lost to an infrastructure error
    gc: bool = False  # only garbage-collect: remove unreferenced snapshots and records whose image is gone


def snapshot_exists(tag: str, host: str | None = None) -> bool:
    """False only when the engine says the image is gone; an unreachable engine is an error."""
    import docker

    try:
        C.docker_client(host).images.get(tag)
        return True
    except docker.errors.NotFound:
        return False


def gc(out: Path) -> tuple[int, int]:
    """Remove kept snapshot images of this folder's runs that no record refers to, and records
    whose image is gone. Scoped to runs.txt so other folders' failure states are never touched."""
    path = out / "failures.jsonl"
    records = C.read_jsonl(path)
    alive = [r for r in records if snapshot_exists(r["snapshot"], r.get("host"))]
    if len(alive) < len(records):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in alive))
        os.replace(tmp, path)
    runs = set((out / "runs.txt").read_text().split()) if (out / "runs.txt").exists() else set()
    referenced = {r["snapshot"] for r in alive}
    removed = 0
    kept = {"label": ["reterm.kind=snapshot", "reterm.keep=1"]}
    for host in {*C.HOSTS.live(), *(r.get("host") for r in records)}:
        for im in C.docker_client(host).images.list(filters=kept):
            if im.labels.get("reterm.run") in runs and not referenced & set(im.tags):
                C.remove_image(im.id, host)
                removed += 1
    return removed, len(records) - len(alive)


def summarize(attempts: list[dict], records: list[dict], n_tasks: int) -> dict:
    by_cat = collections.Counter(a["category"] for a in attempts if a["reward"] < 1.0)
    return {"n_tasks": n_tasks, "n_attempts": len(attempts),
            "n_success": sum(a["reward"] >= 1.0 for a in attempts),
            "n_failures": sum(a["reward"] < 1.0 for a in attempts), "n_records": len(records),
            "pass_rate": sum(a["reward"] for a in attempts) / max(1, len(attempts)),
            "by_category": dict(by_cat.most_common()),
            "by_task": {t: {"attempts": len(v), "failures": sum(a["reward"] < 1.0 for a in v)}
                        for t, v in sorted(_group(attempts).items())}}


def _group(attempts: list[dict]) -> dict[str, list[dict]]:
    by = collections.defaultdict(list)
    for a in attempts:
        by[a["task"]].append(a)
    return by


def collect(cfg: Config, engine: object | None = None) -> dict:
    """Attempt every (task, k) not yet done; write a record per failure. `engine` may be passed
    in (tests use a scripted one); by default it is built from --engine/--model."""
    out = Path(cfg.out)
    C.dump_config(cfg, out)
    tasks = C.load_tasks(cfg.tasks, cfg.task_filter, cfg.sample, cfg.sample_skip, cfg.split_seed)
    fail_path, log_path = out / "failures.jsonl", out / "attempts.jsonl"
    done = {(a["task"], a["attempt"]) for a in C.read_jsonl(log_path)
            if not (cfg.retry_errors and C.is_infra_error(a.get("error")))}
    todo = [(t, k, i * cfg.attempts + k) for i, t in enumerate(tasks) for k in range(cfg.attempts)
            if (t.name, k) not in done]
    C.log0(f"{len(tasks)} tasks x {cfg.attempts} attempts: {len(done)} done, {len(todo)} to run")
    policy = cfg.policy or str(Path(cfg.model).resolve() if Path(cfg.model).exists() else cfg.model)
    with open(out / "runs.txt", "a") as f:  # which runs' kept snapshots --gc may remove
        f.write(C.RUN_ID + "\n")
    scaffold = C.load_scaffold(cfg.model, max_turns=cfg.max_turns, max_context=cfg.max_context,
                               max_tokens=cfg.max_tokens, command_timeout=cfg.command_timeout)
    sampling = C.SamplingConfig(temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed)
    rcfg = C.rollout_config(scaffold, sampling, cfg.concurrency, cfg.timeout_multiplier)
    own = bool(todo) and engine is None  # an engine made here goes with the run, after the pool
    if own:
        engine = C.make_engine(cfg.engine, cfg.model,
                               **({"max_model_len": scaffold.max_context} if cfg.engine == "vllm" else {}))
    from tqdm import tqdm

    bar = tqdm(total=len(todo), desc="collect")
    # Each attempt is written as soon as it ends (a killed run loses only those in flight); a
    # failed attempt keeps its snapshot (keep=1), committed before the verifier ran.
    with C.env_session(), contextlib.closing(engine) if own else contextlib.nullcontext(), \
            C.RolloutPool(engine, rcfg, not cfg.no_internet) as pool:
        for task, k, j in todo:  # attempt j of tasks x attempts samples with seed + j, resumed or not
            ep = C.first_attempt(task, engine.tokenizer, rcfg, seed=cfg.seed + j)
            pool.submit(ep, commit="failed", tag=k)
        for k, ep in pool.completed():
            rid = None
            if ep.reward < 1.0 and ep.snapshot:
                state = C.FailureState.from_episode(ep, policy)
                rid = state.id
                C.append_jsonl(fail_path, dataclasses.asdict(state))
            C.append_jsonl(log_path, {"task": ep.task.name, "attempt": k, "reward": ep.reward,
                                      "category": ep.category, "turns": ep.turns, "end": ep.end,
                                      "failure": rid, "error": ep.error, "seconds": ep.seconds,
                                      "queue_s": round(ep.queue_s, 2), "host": ep.host})
            bar.update(1)
            stats = pool.stats()
            bar.set_postfix(engine_idle=stats["engine_idle_frac"], env_steps=stats.get("env_steps", 0))
    bar.close()
    names = {t.name for t in tasks}
    latest = {(a["task"], a["attempt"]): a for a in C.read_jsonl(log_path)}  # a retried attempt's last row
    attempts = [a for a in latest.values() if a["task"] in names]
    summary = summarize(attempts, C.read_jsonl(fail_path), len(tasks))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\n{'category':<24}{'failures':>9}")
    for cat, n in summary["by_category"].items():
        print(f"{cat:<24}{n:>9}")
    print(f"{summary['n_attempts']} attempts, {summary['n_success']} succeeded (pass rate "
          f"{summary['pass_rate']:.3f}), {summary['n_records']} failure states in {fail_path}")
    return summary


def main(argv: list[str] | None = None) -> dict:
    cfg = C.parse_config(Config, argv)
    C.use_docker_hosts(cfg.docker_hosts)
    if cfg.gc:
        removed, dropped = gc(Path(cfg.out))
        print(f"gc: removed {removed} unreferenced snapshot images, "
              f"dropped {dropped} records whose image is gone")
        return {"removed_images": removed, "dropped_records": dropped}
    if not cfg.model:
        raise SystemExit("--model is required (the policy to collect failures from)")
    return collect(cfg)


if __name__ == "__main__":
    C.run_main(main)
