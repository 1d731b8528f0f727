"""Stage 05 — Pass@1 on Terminal-Bench 2.0-format tasks, scored the way Harbor scores them.

Every (task, trial) runs in a fresh container: the agent acts under the task's agent timeout,
then the verifier runs even if the agent timed out; a trial with an error or no reward
counts 0. Pass@1 = mean reward over all trials. Completed trials in OUT/trials.jsonl are not
re-run, so an interrupted evaluation resumes where it stopped.

As Harbor: a task has network unless its task.toml says allow_internet = false (--no-internet
takes it from all); a pinned docker_image runs as published or the trial errors (--force-build
builds environment/ instead); /logs/agent and /logs/verifier exist from the start. A trial without
network whose commands or verifier show DNS/connection failures is an error, not a silent 0 (TB2's
test.sh downloads its test tools and writes 0 when that fails). Each trial is also written in
Harbor's job layout under OUT/harbor/ (result.json per trial with verifier_result, exception_info,
timings; agent/ and verifier/ logs), so Harbor's tools read the run.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import re
import time
import uuid
from pathlib import Path

from tqdm import tqdm

import common as C


@dataclasses.dataclass(kw_only=True)
class Config:
    """Evaluate an agent on Harbor-format tasks and report Pass@1 by category.

    Defaults: temperature 0.6 and top_p 0.95 are the sampling Qwen3's model card recommends for
    thinking mode; timeouts and network are as each task.toml says (Harbor's rules); trials = 1
    and concurrency 4 are our choices (a leaderboard run passes --trials 5)."""

    tasks: str = "tasks"  # folder of Harbor tasks (Terminal-Bench 2.0 layout)
    out: str = "runs/eval"  # output folder: trials.jsonl, summary.json, config.json
    agent: str = "oracle"  # oracle (runs solution/solve.sh) | null (does nothing) | policy
    model: str | None = None  # --agent policy: a model folder or hub name
    engine: str = "vllm"  # vllm | hf (transformers fallback)
    dtype: str = "bfloat16"  # policy weights' dtype in the engine
    temperature: float = 0.6  # sampling temperature (0 = greedy)
    top_p: float = 0.95  # nucleus sampling
    max_tokens: int | None = None  # per assistant turn (default: the model's scaffold.json)
    max_turns: int | None = None  # assistant turns per attempt (default: the model's scaffold)
    max_context: int | None = None  # tokens per attempt, the engine's max_model_len (default: scaffold)
    command_timeout: float | None = None  # seconds per bash call (default: the model's scaffold)
    seed: int = 0  # sampling seed
    recovery: bool = False  # run one recovery attempt from each failed trial's snapshot (Recovery@1)
    trials: int = 1  # k trials per task; Pass@1 averages over all (the TB2 leaderboard asks for >= 5)
    concurrency: int = 4  # trials running at once (one container each)
    docker_hosts: str = ""  # Docker engines URL[#slots],... (unix://, ssh://, tcp://); "" = the local one
    task_filter: str | None = None  # regex: only tasks whose name matches
    sample: int = 0  # draw N tasks from a seeded permutation (0 = all); see --sample-skip
    sample_skip: int = 0  # skip the permutation's first K (train = --sample N, held-out = --sample-skip N)
    split_seed: int = 0  # seed of the --sample permutation
    timeout_multiplier: float = 1.0  # scales agent and verifier timeouts from task.toml
    no_internet: bool = False  # no network for any task (default: as task.toml says, Harbor's default on)
    force_build: bool = False  # build environment/ even when task.toml pins a docker_image
    retry_errors: bool = False  # on resume, also re-run trials lost to an infrastructure error ("infra: ...")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def trial_dir(out: Path, task: str, trial: int) -> Path:
    """Harbor names a trial folder <task[:32]>__<7 chars>; ours are derived from (task, trial) so a
    resumed run finds them again."""
    short = hashlib.sha256(f"{task}:{trial}".encode()).hexdigest()[:7]
    return out / "harbor" / f"{task[:32].rstrip('_-')}__{short}"


def new_row(cfg: Config, task: C.Task, trial: int) -> dict:
    return {"task": task.name, "trial": trial, "category": task.category, "difficulty": task.difficulty,
            "reward": 0.0, "error": None, "error_type": None, "turns": 0, "agent_timed_out": False,
            "internet": task.allow_internet and not cfg.no_internet, "image": None, "image_id": None,
            "verified": False, "started_at": now(), "host": None}


def run_trial(cfg: Config, task: C.Task, trial: int, out: Path) -> dict:
    """One trial in a fresh container; never raises (errors become reward 0). Its container's
    /logs/agent and /logs/verifier are copied into the trial's Harbor folder."""
    t0, row = time.monotonic(), new_row(cfg, task, trial)
    tdir, logs = trial_dir(out, task.name, trial), []
    try:
        with C.HOSTS.slot() as row["host"], C.start_env(task, internet=not cfg.no_internet,
                                                        host=row["host"]) as env:
            row.update(image=env.image, image_id=env.image_id, environment_setup=[row["started_at"], now()])
            start = now()
            if cfg.agent == "oracle":
                env.upload(task.solution_dir, "/solution")
                res = env.bash("bash /solution/solve.sh >/logs/agent/oracle.txt 2>&1; r=$?; "
                               "tail -c 5000 /logs/agent/oracle.txt; exit $r",
                               timeout=task.agent_timeout_sec * cfg.timeout_multiplier)
                row["turns"], row["agent_timed_out"] = 1, res.timed_out
                logs.append(res.output)
            row["agent_execution"] = [start, now()]
            verdict = env.verify(task.verifier_timeout_sec * cfg.timeout_multiplier)
            row["verifier"] = [row["agent_execution"][1], now()]
            row.update(reward=verdict.reward, error=verdict.error, verified=verdict.error is None,
                       error_type=verifier_error_type(verdict.error))
            logs.append(verdict.output)
            tdir.mkdir(parents=True, exist_ok=True)
            env.download("/logs", tdir)
    except Exception as e:  # build/start failures count 0, like Harbor
        row["error"], row["error_type"] = C.infra_error("trial", e), type(e).__name__
    row["seconds"] = round(time.monotonic() - t0, 2)
    flag_network_failure(row, logs)
    return row


# What a missing network looks like in a command's or test.sh's output (curl, wget, pip, uv, apt, git).
NETWORK_FAILURE = re.compile(
    r"Could not resolve host|Temporary failure (?:in name resolution|resolving)|Name or service not known"
    r"|Network is unreachable|Failed to establish a new connection|failed to lookup address|"
    r"getaddrinfo|unable to access '[^']*': Could not|Could not connect to|dns error", re.I)


def flag_network_failure(row: dict, logs: list[str]) -> None:
    """A failed trial without network whose output shows a network failure is an error: the reward
    measures the missing network, not the agent."""
    hit = next((m for m in map(NETWORK_FAILURE.search, logs) if m), None)
    if hit and not row["internet"] and row["reward"] < 1.0:
        why = f"network unavailable in a run without network ({hit.group(0)!r})"
        row["error"] = why + (f"; {row['error']}" if row["error"] else "")
        row["error_type"], row["network_error"] = "NetworkUnavailableError", True


def verifier_error_type(error: str | None) -> str | None:
    """Harbor's exception names for what went wrong in verification."""
    if not error:
        return None
    for key, name in (("timed out", "VerifierTimeoutError"), ("no reward file", "RewardFileNotFoundError"),
                      ("unparsable", "VerifierOutputParseError")):
        if key in error:
            return name
    return "VerifierError"


def save_trial(cfg: Config, out: Path, row: dict, ep: C.Episode | None = None) -> None:
    """Append the trial's row to trials.jsonl and write its Harbor trial folder (a policy episode's
    messages and verifier output go to agent/ and verifier/)."""
    tdir = trial_dir(out, row["task"], row["trial"])
    (tdir / "agent").mkdir(parents=True, exist_ok=True)
    (tdir / "verifier").mkdir(parents=True, exist_ok=True)
    if ep is not None:
        row["verified"] = ep.verify_error is None
        (tdir / "agent" / "trajectory.json").write_text(json.dumps(ep.messages, indent=1))
        (tdir / "verifier" / "test-stdout.txt").write_text(ep.verify_output)  # its last 2,000 bytes
        if row["verified"]:
            (tdir / "verifier" / "reward.txt").write_text(f"{row['reward']}\n")
        flag_network_failure(row, [m["content"] for m in ep.messages if m["role"] == "tool"]
                             + [ep.verify_output])
    row["finished_at"] = now()
    C.append_jsonl(out / "trials.jsonl", row)
    (tdir / "result.json").write_text(json.dumps(harbor_trial_result(cfg, row, tdir), indent=2) + "\n")


def harbor_trial_result(cfg: Config, row: dict, tdir: Path) -> dict:
    """Harbor's TrialResult for one of our rows (field names and nesting as Harbor's models have them)."""
    timing = lambda k: {"started_at": row[k][0], "finished_at": row[k][1]} if row.get(k) else None
    exc = None
    if row["error"] or row["agent_timed_out"]:
        exc = {"exception_type": row["error_type"] or "AgentTimeoutError",
               "exception_message": row["error"] or "the agent ran out of time; the verifier still ran",
               "exception_traceback": "", "occurred_at": row["finished_at"]}
    task = Path(cfg.tasks).resolve() / row["task"]
    model = {"name": cfg.model, "provider": "local"} if cfg.agent == "policy" else None
    return {
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, str(tdir.resolve()))),
        "task_name": row["task"], "trial_name": tdir.name, "trial_uri": tdir.resolve().as_uri(),
        "task_id": {"path": str(task)}, "source": None,
        "task_checksum": task_checksum(task),
        "config": {"task": {"path": str(task)}, "trial_name": tdir.name, "trials_dir": str(tdir.parent),
                   "timeout_multiplier": cfg.timeout_multiplier,
                   "agent": {"name": agent_name(cfg), "model_name": cfg.model, "kwargs": {}},
                   "environment": {"type": "docker", "force_build": cfg.force_build, "delete": True},
                   "verifier": {}},
        "agent_info": {"name": agent_name(cfg), "version": "1.0", "model_info": model},
        "agent_result": {"n_input_tokens": None, "n_cache_tokens": None, "n_output_tokens": None,
                         "cost_usd": None, "metadata": {"turns": row["turns"], "end": row.get("end")}},
        "verifier_result": {"rewards": {"reward": row["reward"]}} if row["verified"] else None,
        "exception_info": exc,
        "started_at": row["started_at"], "finished_at": row["finished_at"],
        "environment_setup": timing("environment_setup"), "agent_setup": None,
        "agent_execution": timing("agent_execution"), "verifier": timing("verifier"),
    }


@functools.cache
def task_checksum(task: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(task.rglob("*")) if task.is_dir() else []:
        if p.is_file():
            h.update(str(p.relative_to(task)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def agent_name(cfg: Config) -> str:
    return "reterm-policy" if cfg.agent == "policy" else cfg.agent


def write_harbor_job(cfg: Config, out: Path, n_total: int, started_at: str) -> None:
    """The job folder's config.json and result.json (Harbor's JobResult), built from every trial's
    result.json in it, so a resumed run's job result covers all of its trials."""
    job = out / "harbor"
    job.mkdir(parents=True, exist_ok=True)
    trials = [json.loads(p.read_text()) for p in sorted(job.glob("*/result.json"))]
    evals: dict = {}
    for t in trials:
        model = (t["agent_info"]["model_info"] or {}).get("name")
        key = "__".join(x for x in (t["agent_info"]["name"], model, t["source"] or "adhoc") if x)
        e = evals.setdefault(key, {"n_trials": 0, "n_errors": 0, "metrics": [], "reward_stats": {},
                                   "exception_stats": {}, "rewards": []})
        e["rewards"].append(t["verifier_result"]["rewards"]["reward"] if t["verifier_result"] else 0.0)
        if t["verifier_result"]:
            e["n_trials"] += 1
            for k, v in t["verifier_result"]["rewards"].items():
                e["reward_stats"].setdefault(k, {}).setdefault(str(v), []).append(t["trial_name"])
        if t["exception_info"]:
            e["n_errors"] += 1
            e["exception_stats"].setdefault(t["exception_info"]["exception_type"], []).append(t["trial_name"])
    for e in evals.values():  # Harbor's default metric: the mean reward, a missing reward counts 0
        rs = e.pop("rewards")
        e["metrics"] = [{"mean": sum(rs) / len(rs)}]
    n_err = sum(1 for t in trials if t["exception_info"])
    stats = {"n_trials": len(trials), "n_errors": n_err, "n_completed_trials": len(trials),
             "n_errored_trials": n_err, "evals": evals}
    result = {"id": str(uuid.uuid5(uuid.NAMESPACE_URL, str(job.resolve()))), "started_at": started_at,
              "updated_at": now(), "finished_at": now(), "n_total_trials": n_total, "stats": stats}
    (job / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    (job / "config.json").write_text(json.dumps({
        "job_name": job.name, "jobs_dir": str(out.resolve()), "n_attempts": cfg.trials,
        "timeout_multiplier": cfg.timeout_multiplier,
        "agents": [{"name": agent_name(cfg), "model_name": cfg.model}],
        "datasets": [{"path": str(Path(cfg.tasks).resolve())}],
        "environment": {"type": "docker", "force_build": cfg.force_build, "delete": True}}, indent=2) + "\n")


def run_policy(cfg: Config, todo: list[tuple[C.Task, int, int]], out: Path, images: dict[str, dict]) -> None:
    """Policy trials on a pool of `concurrency` container slots, each on its own clock. With
    --recovery a failed trial's snapshot (committed before verification) gets one recovery
    attempt as soon as the trial ends; the trial's rows are written once both are done, so a
    resumed run never has a trial without its recovery."""
    try:  # a corrupt folder (bad JSON, truncated weights) is the user's to fix: one line, no traceback
        scaffold = C.load_scaffold(cfg.model, max_tokens=cfg.max_tokens, max_turns=cfg.max_turns,
                                   max_context=cfg.max_context, command_timeout=cfg.command_timeout)
        vllm_kw = {"max_model_len": scaffold.max_context, "seed": cfg.seed} if cfg.engine == "vllm" else {}
        engine = C.make_engine(cfg.engine, cfg.model, dtype=cfg.dtype, **vllm_kw)
    except (C.UserError, FileNotFoundError):
        raise
    except Exception as e:  # noqa: BLE001 -- transformers/vLLM raise OSError, ValueError, JSONDecodeError...
        why = (str(e).strip().splitlines() or [""])[0][:300]
        raise C.UserError(f"{cfg.model}: cannot load the model ({type(e).__name__}: {why})") from None
    sampling = C.SamplingConfig(temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed)
    rcfg = C.rollout_config(scaffold, sampling, cfg.concurrency, cfg.timeout_multiplier)
    tok = engine.tokenizer
    bar = tqdm(total=len(todo), desc="eval[policy]")
    # the engine goes with the run, after the pool (a caller may run 05 twice in one process)
    with contextlib.closing(engine), C.RolloutPool(engine, rcfg, not cfg.no_internet) as pool:
        for task, k, j in todo:  # trial j of the run (its place in tasks x trials) samples with seed + j
            ep = C.first_attempt(task, tok, rcfg, seed=cfg.seed + j)
            pool.submit(ep, commit="failed" if cfg.recovery else "none", tag=(k, j, None))
        for (k, j, trial), ep in pool.completed():
            if trial is None and ep.snapshot:  # a failed trial: fork its recovery now, with its own seeds
                pool.fork_recovery(ep, cfg.model, tag=(k, j, ep), seed=cfg.seed + j + 2**20)
                continue
            if trial is not None:  # the recovery of `trial` ended (its snapshot gone)
                save_trajectory(out, f"{ep.task.name}__{k}__recovery", ep)
                C.append_jsonl(out / "recovery.jsonl", {
                    "task": ep.task.name, "trial": k, "category": trial.category, "reward": ep.reward,
                    "turns": ep.turns, "error": ep.error or ep.verify_error})
                ep = trial
            save_trajectory(out, f"{ep.task.name}__{k}", ep)
            error_type = "EnvironmentError" if ep.error else verifier_error_type(ep.verify_error)
            save_trial(cfg, out, new_row(cfg, ep.task, k) | images[ep.task.name] | {
                "reward": ep.reward, "error": ep.error or ep.verify_error, "turns": ep.turns,
                "end": ep.end, "error_type": error_type, "error_category": ep.category,
                "agent_timed_out": ep.end == "timeout", "seconds": ep.seconds,
                "queue_s": round(ep.queue_s, 2), "host": ep.host}, ep)
            bar.update(1)
    bar.close()
    C.log0("rollout: " + ", ".join(f"{k} {v:.3g}" for k, v in pool.stats().items()))


def resolve_images(cfg: Config, out: Path, todo: list[tuple[C.Task, int, int]]) -> dict[str, dict]:
    """Each task's image (built or pulled once, before any rollout) and its id, for the rows; every
    trial of a task whose image can't be had is saved as an error row here (reward 0)."""
    def image(task: C.Task) -> dict:
        tag = C.task_image(task)
        return {"image": tag, "image_id": C.docker_client().images.get(tag).id}

    tasks = list({t.name: t for t, *_ in todo}.values())
    got = {t.name: v for t, v in C.run_concurrently(image, tasks, cfg.concurrency, desc="images")}
    for task, k, _ in todo:
        if isinstance(e := got[task.name], Exception):
            save_trial(cfg, out, new_row(cfg, task, k) | {"error": C.infra_error("image", e),
                                                           "error_type": type(e).__name__, "seconds": 0.0})
    return {name: v for name, v in got.items() if not isinstance(v, Exception)}


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
        "n_network_errors": sum(1 for r in rows if r.get("network_error")),
        "by_category": group("category"),
        "by_difficulty": group("difficulty"),
    }


def print_table(summary: dict) -> None:
    print(f"\n{'group':<32}{'trials':>8}{'pass@1':>9}")
    for key in ("by_category", "by_difficulty"):
        for name, s in summary[key].items():
            print(f"{key[3:] + ':' + name:<32}{s['n_trials']:>8}{s['pass_at_1']:>9.3f}")
    print(f"{'overall':<32}{summary['n_trials']:>8}{summary['pass_at_1']:>9.3f}"
          f"   ({summary['n_tasks']} tasks, {summary['n_errors']} trials with errors, "
          f"{summary['n_network_errors']} of them for lack of network)")
    if "recovery_at_1" in summary:
        print(f"\n{'failure category':<32}{'failures':>8}{'rec@1':>9}")
        for name, r in summary["recovery_by_category"].items():
            print(f"{name:<32}{r['n_failures']:>8}{r['recovery_at_1']:>9.3f}")
        n = sum(r["n_failures"] for r in summary["recovery_by_category"].values())
        print(f"{'recovery overall':<32}{n:>8}{summary['recovery_at_1']:>9.3f}")
    if "success_with_retry" in summary:
        print(f"success within one attempt + one recovery: {summary['success_with_retry']:.3f}")


def main(argv: list[str] | None = None) -> dict:
    cfg = C.parse_config(Config, argv)
    C.use_docker_hosts(cfg.docker_hosts)
    if cfg.agent not in ("oracle", "null", "policy"):
        raise SystemExit(f"--agent {cfg.agent!r}: choose oracle, null or policy")
    if cfg.agent == "policy" and not cfg.model:
        raise SystemExit("--agent policy needs --model PATH (a model folder or hub name)")
    tasks = C.load_tasks(cfg.tasks, cfg.task_filter, cfg.sample, cfg.sample_skip, cfg.split_seed)
    if cfg.force_build:  # build environment/ instead of the pinned image (recorded per row: image, image_id)
        tasks = [dataclasses.replace(t, docker_image=None) for t in tasks]
    out = Path(cfg.out)
    C.dump_config(cfg, out)
    trials_path, job_result = out / "trials.jsonl", out / "harbor" / "result.json"
    started = json.loads(job_result.read_text())["started_at"] if job_result.exists() else now()
    done = {(r["task"], r["trial"]) for r in C.read_jsonl(trials_path)
            if not (cfg.retry_errors and C.is_infra_error(r.get("error")))}
    todo = [(t, k, i * cfg.trials + k) for i, t in enumerate(tasks) for k in range(cfg.trials)
            if (t.name, k) not in done]
    C.log0(f"{len(tasks)} tasks x {cfg.trials} trials: {len(done)} done, {len(todo)} to run")
    with C.env_session():
        if cfg.agent == "policy":
            images = resolve_images(cfg, out, todo) if todo else {}
            todo = [x for x in todo if x[0].name in images]
            if todo:
                run_policy(cfg, todo, out, images)
        else:
            trial = lambda tk: run_trial(cfg, tk[0], tk[1], out)  # noqa: E731
            for _, row in C.run_concurrently(trial, todo, cfg.concurrency, desc=f"eval[{cfg.agent}]"):
                save_trial(cfg, out, row)
    write_harbor_job(cfg, out, len(tasks) * cfg.trials, started)
    names = {t.name for t in tasks}
    latest = {(r["task"], r["trial"]): r for r in C.read_jsonl(trials_path)}  # a retried trial's last row
    rows = [r for r in latest.values() if r["task"] in names and r["trial"] < cfg.trials]
    summary = summarize(rows, len(tasks))
    recs = [r for r in C.read_jsonl(out / "recovery.jsonl") if r["task"] in names]
    if recs:
        by = collections.defaultdict(list)
        for r in recs:
            by[r["category"]].append(r["reward"])
        summary["recovery_at_1"] = C.recovery_rate([r["reward"] for r in recs])
        summary["recovery_by_category"] = {
            k: {"recovery_at_1": C.recovery_rate(v), "n_failures": len(v)} for k, v in sorted(by.items())}
    if cfg.recovery:  # one attempt plus one recovery in the same container (Recovery-Bench's figure)
        rec_reward = {(r["task"], r["trial"]): r["reward"] for r in recs}
        summary["success_with_retry"] = sum(max(r["reward"], rec_reward.get((r["task"], r["trial"]), 0.0))
                                            for r in rows) / max(1, len(rows))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_table(summary)
    return summary


if __name__ == "__main__":
    C.run_main(main)
