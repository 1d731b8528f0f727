"""Stage 01 — ReTerm-10K-style recovery demonstrations (SFT cold-start data).

A row pairs a FAILED first attempt (context, no loss) with a VERIFIED recovery of the same, un-reset
container: attempt 1 is snapshotted before the verifier runs and must fail; the recovery
runs in a fork of that snapshot and must pass. Teachers: `oracle` replays solution/solve.sh with one
injected fault (a dropped step, a typo'd program, a wrong path, input file or value, an early stop),
then inspects and makes the smallest repair that passes: the faulty step alone, else it and the steps
after it, else all (offline, no model); `policy` is a local model
(--model) recovering a student's (--student-model) failures; `openai` an OpenAI-compatible server.
--import converts released ReTerm-10K rows instead. Rows already in --out are not redone: a killed run
resumes.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import random
import re
import statistics
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import common as C


@dataclasses.dataclass(kw_only=True)
class Config:
    """Build verified recovery demonstrations (ReTerm-10K schema) from Harbor tasks.

    Defaults are guesses (the paper's teacher and data settings are not public): faults per task,
    tries, attempts, retries, concurrency; temperature 0.7 is Qwen3's model card's non-thinking one."""

    tasks: str = "tasks"  # folder of Harbor tasks
    out: str = "runs/data/reterm.jsonl"  # output JSONL (stats in OUT.stats.json, config in OUT.config.json)
    teacher: str = "oracle"  # oracle | policy | openai
    import_path: str | None = None  # convert released ReTerm-10K rows (JSON/JSONL) instead; alias --import
    faults_per_task: int = 3  # oracle: distinct verified faults wanted per task
    max_tries_per_task: int = 9  # oracle: fault candidates tried per task at most
    scopes: str = "step,from_fault,from_start"  # oracle: the repairs tried, in order (recovery_plan)
    inspect: str = "ls -la"  # oracle: the recovery's first command, on the faulty step's folders
    attempts: int = 4  # policy/openai: student attempts per task (each failure gets one recovery)
    model: str | None = None  # policy: the teacher model folder
    student_model: str | None = None  # policy/openai: model for the first attempt (default: the teacher)
    engine: str = "vllm"  # policy engine: vllm | hf
    base_url: str | None = None  # openai: server root, e.g. http://127.0.0.1:8000/v1
    api_model: str | None = None  # openai: model name sent to the server
    api_key_env: str = "OPENAI_API_KEY"  # openai: environment variable holding the API key
    http_retries: int = 5  # openai: retries per request (exponential backoff)
    max_turns: int | None = None  # policy/openai: turns per attempt (default: the scaffold, see --scaffold)
    temperature: float = 0.7  # policy/openai sampling temperature
    max_tokens: int | None = None  # policy/openai: tokens per assistant turn (default: the scaffold)
    command_timeout: float | None = None  # seconds per bash call (default: the scaffold)
    scaffold: str | None = None  # model folder whose scaffold.json the rows follow (default: the student's)
    system_prompt: str | None = None  # the rows' system prompt (default: the scaffold's)
    recovery_prompt: str | None = None  # the recovery turn, {instruction} = the task (default: scaffold)
    no_internet: bool = False  # no network for any task (default: as each task.toml says)
    tokenizer: str | None = None  # tokenizer for the token-length stats (default: --model, else the tiny one)
    concurrency: int = 4  # tasks worked on at once
    docker_hosts: str = ""  # Docker engines URL[#slots],... (unix://, ssh://, tcp://); "" = the local one
    task_filter: str | None = None  # regex: only tasks whose name matches
    seed: int = 0  # fault choice / sampling seed


# ── rows ────────────────────────────────────────────────────────────────────


def trajectory_sha256(messages: list[dict]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def make_row(task_id: str, messages: list[dict], train_from: int, meta: dict) -> dict:
    """A row in the released schema (id = task_id:sha[:16], as released) + our `meta`."""
    sha = trajectory_sha256(messages)
    return {"id": f"{task_id}:{sha[:16]}", "task_id": task_id, "messages": messages,
            "train_from_message_index": train_from, "target_attempt_index": 2,
            "trajectory_sha256": sha, "meta": meta}


def commands_of(messages: list[dict]) -> list[str]:
    return [c["function"]["arguments"]["command"] for m in messages for c in m.get("tool_calls") or []]


def act(env: C.Env, msgs: list[dict], thought: str, command: str, timeout: float) -> C.CmdResult:
    """One bash tool call, appended to `msgs` exactly as the rollout records it."""
    r = env.bash(command, timeout)
    call = {"type": "function", "function": {"name": "bash", "arguments": {"command": command}}}
    msgs += [{"role": "assistant", "content": thought, "tool_calls": [call]},
             {"role": "tool", "content": C.format_observation(r)}]
    return r


class Writer:
    """Thread-safe, deduplicating appender: each row is on disk as soon as it is verified."""

    def __init__(self, path: Path):
        self.path, self.lock, self.rows, self.duplicates = path, threading.Lock(), C.read_jsonl(path), 0
        self.seen = {r["trajectory_sha256"] for r in self.rows}

    def add(self, row: dict) -> bool:
        with self.lock:
            if row["trajectory_sha256"] in self.seen:
                self.duplicates += 1
                return False
            self.seen.add(row["trajectory_sha256"])
            self.rows.append(row)
            C.append_jsonl(self.path, row)
            return True


FAILED = types.SimpleNamespace(reward=0.0, snapshot=None, messages=[], attempt_from=0)  # a call that raised


def run_each(cfg: Config, fn, tasks: list[C.Task], desc: str, fallback: object) -> list:
    """fn(i) for each i of `tasks` on threads, in order; an exception is reported, then `fallback`."""
    got = {}
    for i, res in C.run_concurrently(fn, list(range(len(tasks))), cfg.concurrency, desc):
        if isinstance(res, Exception):
            print(f"{tasks[i].name}: {type(res).__name__}: {res}")
        got[i] = fallback if isinstance(res, Exception) else res
    return [got[i] for i in range(len(tasks))]


# ── oracle teacher: solve.sh steps with one injected fault ──────────────────

STEP = re.compile(r"^[^\S\n]*#[^\S\n]*step:[^\S\n]*(.*?)[^\S\n]*$", re.M)
BUILTINS = {"cd", "echo", "export", "if", "then", "else", "fi", "for", "do", "done", "while", "read", "set",
            "true", "false", "test", "printf", "case", "esac", "exit", "return", "local", "eval", "exec",
            "cat", "ls", "head", "tail", "wc"}  # display-only programs: a typo there changes no outcome
CMD_POS = re.compile(r"(?:^|&&|\|\||[|;({]|\bthen\b|\bdo\b)[ \t]*([a-z][a-z0-9_+-]*)(?=[ \t\n]|$)", re.M)
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?[^\n]*\n(.*?\n)\1\n?", re.S)
PATH = re.compile(r"(?<![\w.$/-])/(?:app|srv|home|etc|var|opt|data|root|workspace|mnt|tmp)(?:/[\w.+-]+)+")
NUMBER = re.compile(r"(?<![\w.%$/-])(\d{1,4})(?![\w./-]|>|\])")
# per fault kind: why attempt 1 failed, and what the recovery did ({d}: the faulty step)
EXPLAIN = {
    "drop": ("The step '{d}' was never run, so its result is missing.", "ran the skipped step '{d}'"),
    "stop": ("The previous attempt stopped before '{d}': the remaining steps never ran.",
             "ran the steps from '{d}' on"),
    "typo": ("'{bad}' is a typo for '{good}', so '{d}' failed.", "fixed the typo in '{d}'"),
    "path": ("'{d}' used the wrong path {bad} instead of {good}.", "redid '{d}' with the right path"),
    "input": ("'{d}' read the wrong file {bad} instead of {good}.", "redid '{d}' with the right file"),
    "value": ("'{d}' used a wrong value ({bad} instead of {good}).", "redid '{d}' with the right value")}


def split_steps(script: str) -> list[tuple[str, str]]:
    """solve.sh -> [(description, command)] by its `# step:` markers (no markers: one step)."""
    parts = STEP.split(script)  # [text before the first marker, desc, body, desc, body, ...]
    if len(parts) == 1:
        parts = ["", "run the solution", "\n".join(
            ln for ln in script.splitlines() if not ln.startswith(("#!", "set -")))]
    return [(d, body.strip()) for d, body in zip(parts[1::2], parts[2::2], strict=True) if body.strip()]


def typo(word: str) -> str:
    if len(word) <= 2:
        return word + word[-1]
    i = len(word) // 2
    swapped = word[: i - 1] + word[i] + word[i - 1] + word[i + 1:]
    return swapped if swapped != word else word[:i] + word[i + 1:]


@dataclasses.dataclass
class Fault:
    kind: str  # drop | stop | typo | path | input | value
    step: int  # index of the faulty step (stop: the first step never run)
    key: str  # unique within a task; resume skips keys already in the output
    commands: list[str]  # attempt 1's commands
    bad: str = ""  # what was wrong (typo'd program, wrong path, wrong value)
    good: str = ""


def candidate_faults(steps: list[tuple[str, str]], rng: random.Random,
                     siblings: dict[str, list[str]] | None = None) -> list[Fault]:
    """Every fault we can inject, shuffled, interleaved so the first few are of different kinds.
    `siblings` (see input_siblings): for an input file a step reads, the other files beside it; an
    `input` fault reads one of them instead (a plausible mix-up: the step runs, on the wrong data)."""
    cmds = [c for _, c in steps]
    n, by_kind = len(steps), collections.defaultdict(list)
    for i, cmd in enumerate(cmds):
        def wrong(kind: str, at: object, c: str, bad: str, good: str, i: int = i) -> None:  # step i -> c
            by_kind[kind].append(Fault(kind, i, f"{kind}@{i}:{at}", cmds[:i] + [c] + cmds[i + 1:], bad, good))
        if i < n - 1 or n == 1:  # dropping the last step is the same trajectory as stopping early
            by_kind["drop"].append(Fault("drop", i, f"drop@{i}", cmds[:i] + cmds[i + 1:]))
        if i > 0:
            by_kind["stop"].append(Fault("stop", i, f"stop@{i}", cmds[:i]))
        shell = HEREDOC.sub(lambda m: m.group(0)[: m.start(2) - m.start()] + " " * len(m.group(2))
                            + m.group(0)[m.end(2) - m.start():], cmd)  # programs outside heredoc bodies
        for m in [m for m in CMD_POS.finditer(shell) if m.group(1) not in BUILTINS][:2]:
            bad = typo(m.group(1))
            wrong("typo", m.start(1), cmd[: m.start(1)] + bad + cmd[m.end(1):], bad, m.group(1))
        for p in list(dict.fromkeys(PATH.findall(cmd)))[:2]:
            parent, base = p.rsplit("/", 1)
            bad = f"/tmp/{base}" if parent != "/tmp" else f"/tmp/{typo(base)}"
            wrong("path", p, cmd.replace(p, bad), bad, p)
            if (siblings or {}).get(p):
                bad = rng.choice(siblings[p])
                wrong("input", p, cmd.replace(p, bad), bad, p)
        for m in list(NUMBER.finditer(cmd))[:2]:
            bad = str(int(m.group(1)) + 1)
            wrong("value", m.start(1), cmd[: m.start(1)] + bad + cmd[m.end(1):], bad, m.group(1))
    for faults in by_kind.values():
        rng.shuffle(faults)
    kinds = sorted(by_kind, key=lambda k: rng.random())
    return [by_kind[k][j] for j in range(max(map(len, by_kind.values()), default=0))
            for k in kinds if j < len(by_kind[k])]


def recovery_plan(steps: list[tuple[str, str]], fault: Fault, scope: str, inspect: str = "ls -la"
                  ) -> list[tuple[str, str]]:
    """(thought, command)s: look at what the faulty step should have made, then redo `scope`: the
    faulty step alone ("step"), it and the steps after it ("from_fault"), or all ("from_start")."""
    d, cmd = steps[fault.step]
    dirs = list(dict.fromkeys(p if not Path(p).suffix else str(Path(p).parent) for p in PATH.findall(cmd)))
    look = f"{inspect} {' '.join(dirs[:3])}" if dirs else f"pwd && {inspect}"
    plan = [("The previous attempt failed. Let me inspect the current state before changing anything.",
             f"command -v {fault.good}; {look}" if fault.kind == "typo" else look)]
    why = EXPLAIN[fault.kind][0].format(d=d, bad=fault.bad, good=fault.good)
    if fault.kind == "path":
        plan.append((f"{why} First I remove the stray output.", f"rm -rf -- {fault.bad}"))
        why = "Now"
    i, j_end = {"step": (fault.step, fault.step + 1), "from_fault": (fault.step, len(steps)),
                "from_start": (0, len(steps))}[scope]
    redo = {"step": "redo just that step; the others did their part", "from_fault":
            "redo it and the steps after it", "from_start": "redo the task from the first step"}[scope]
    return plan + [(f"{why} I will {redo}: {d}." if j == i else f"Next: {d}.", c) for j, (d, c) in
                   enumerate(steps) if i <= j < j_end]


# The repairs oracle_row tries by default, smallest first: the first whose fork passes the tests is the
# row, so a demonstration never redoes work the failed attempt already did right (when the faulty step
# is the last one, or the attempt stopped there, "step" is "from_fault" and is skipped). --scopes
# narrows them: "from_start" alone makes every recovery a redo of the whole task.
SCOPES = ("step", "from_fault", "from_start")


def replay_attempt(env: C.Env, msgs: list[dict], steps: list[tuple[str, str]], timeout: float) -> list[dict]:
    """The oracle's attempt: each (description, command) as a tool call, then a closing answer.
    Returns what the rollout's classify_failure looks at, per command."""
    ran = []
    for d, cmd in steps:
        r = act(env, msgs, f"Next: {d}.", cmd, timeout)
        ran.append({"command": cmd, "exit_code": r.exit_code, "timed_out": r.timed_out})
    done = "; ".join(d for d, _ in steps)
    msgs.append({"role": "assistant", "content": f"The task is complete: {done}."})
    return ran


def oracle_row(cfg: Config, task: C.Task, steps: list[tuple[str, str]], fault: Fault
               ) -> tuple[dict | None, str]:
    """Run one faulty attempt + recovery in Docker; a row only if 1 fails and 2 passes."""
    msgs = C.initial_messages(task.instruction, cfg.system_prompt)
    run_descs = [d for j, (d, _) in enumerate(steps) if not (
        fault.kind == "drop" and j == fault.step or fault.kind == "stop" and j >= fault.step)]
    if fault.kind == "input":  # a mix-up, not a slip: the attempt's own words name the wrong file too
        stem = re.compile(rf"\b{re.escape(Path(fault.good).stem)}\b")
        run_descs[fault.step] = stem.sub(Path(fault.bad).stem, run_descs[fault.step])
    with C.HOSTS.slot() as host, C.start_env(task, internet=not cfg.no_internet, host=host) as env:
        faulty = list(zip(run_descs, fault.commands, strict=True))
        ran = replay_attempt(env, msgs, faulty, cfg.command_timeout)
        snap = env.snapshot()  # before the verifier touches the container (Recovery-Bench)
        first = env.verify()
    try:
        if first.reward >= 1.0:
            return None, "fault_did_not_fail"
        msgs.append(C.recovery_message(task.instruction, cfg.recovery_prompt))
        done = EXPLAIN[fault.kind][1].format(d=steps[fault.step][0])
        for scope in cfg.scopes.split(","):
            if scope == "step" and (fault.kind == "stop" or fault.step == len(steps) - 1):
                continue
            out = list(msgs)
            with C.start_env(task, snap, not cfg.no_internet, C.HOSTS.home(snap)) as env:
                for thought, cmd in recovery_plan(steps, fault, scope, cfg.inspect):
                    act(env, out, thought, cmd, cfg.command_timeout)
                out.append({"role": "assistant", "content": f"I {done}; every step of the task has now "
                            "run and the task is complete."})
                second = env.verify()
            if second.reward >= 1.0:
                attempt = types.SimpleNamespace(end="answered", malformed=0, turns=len(ran) + 1, commands=ran)
                meta = {"teacher": "oracle", "fault": fault.key, "fault_kind": fault.kind,
                        "error_category": C.classify_failure(attempt), "task_category": task.category,
                        "recovery": scope}
                return make_row(task.name, out, len(msgs), meta), "row"
        return None, "recovery_failed"
    finally:
        C.remove_image(snap)


def input_siblings(cfg: Config, task: C.Task, steps: list[tuple[str, str]]) -> dict[str, list[str]]:
    """{path: other files of its folder with its suffix} for each path the steps name that is a file
    in the task's fresh container (an input, not an output), looked up in one container."""
    paths = sorted({p for _, cmd in steps for p in PATH.findall(cmd)})
    if not paths:
        return {}
    probe = (f"for p in {' '.join(paths)}; do [ -f $p ] || continue; "
             'for s in "${p%/*}"/*; do [ -f "$s" ] && [ "$s" != "$p" ] && echo "$p $s"; done; done')
    with C.HOSTS.slot() as host, C.start_env(task, internet=not cfg.no_internet, host=host) as env:
        out = env.bash(probe, cfg.command_timeout).output
    found = collections.defaultdict(list)
    for p, s in (ln.split(" ", 1) for ln in out.splitlines() if ln.count(" ") == 1):
        if p in paths and Path(s).suffix == Path(p).suffix and PATH.fullmatch(s):
            found[p].append(s)
    return dict(found)


def oracle_task(cfg: Config, task: C.Task, writer: Writer) -> collections.Counter:
    steps = split_steps((task.solution_dir / "solve.sh").read_text())
    have = [r for r in writer.rows if r["task_id"] == task.name]
    done = {r.get("meta", {}).get("fault") for r in have}
    outcomes, n_ok = collections.Counter(), len(have)
    if n_ok >= cfg.faults_per_task:
        return outcomes
    siblings = input_siblings(cfg, task, steps)
    for fault in candidate_faults(steps, random.Random(f"{cfg.seed}:{task.name}"), siblings):
        if n_ok >= cfg.faults_per_task or sum(outcomes.values()) >= cfg.max_tries_per_task:
            break
        if fault.key in done:
            continue
        row, outcome = oracle_row(cfg, task, steps, fault)
        n_ok += row is not None and writer.add(row)
        outcomes[outcome] += 1
    return outcomes


# ── openai teacher: any OpenAI-compatible chat-completions server ───────────


def to_openai(messages: list[dict]) -> list[dict]:
    """Our messages -> the wire format (call ids, arguments as JSON strings)."""
    out, last_id = [], None
    for i, m in enumerate(messages):
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{"id": f"call_{i}_{j}", "type": "function", "function": {
                "name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}
                for j, c in enumerate(m["tool_calls"])]
            last_id = m["tool_calls"][-1]["id"]
        elif m["role"] == "tool":
            m["tool_call_id"] = last_id
        out.append(m)
    return out


def chat(cfg: Config, messages: list[dict]) -> dict:
    """One chat-completions call; connection errors, 408/429/5xx retry with exponential backoff."""
    body = json.dumps({"model": cfg.api_model, "messages": to_openai(messages), "tools": [C.BASH_TOOL],
                       "temperature": cfg.temperature, "max_tokens": cfg.max_tokens}).encode()
    headers = {"Content-Type": "application/json"}
    if os.environ.get(cfg.api_key_env):
        headers["Authorization"] = f"Bearer {os.environ[cfg.api_key_env]}"
    url = cfg.base_url.rstrip("/") + "/chat/completions"
    for i in range(cfg.http_retries + 1):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=600) as r:
                return json.load(r)["choices"][0]["message"]
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as e:
            http = isinstance(e, urllib.error.HTTPError)
            if i == cfg.http_retries or http and e.code not in (408, 429) and e.code < 500:
                why = f"HTTP {e.code}: {e.read()[:300]!r}" if http else f"{type(e).__name__}: {e}"
                raise RuntimeError(f"{url}: {why}") from None
        time.sleep(min(60.0, 0.5 * 2**i))
    raise AssertionError("unreachable")


def api_episode(cfg: Config, env: C.Env, messages: list[dict]) -> list[dict]:
    """The API model's new messages in `env`, until it answers without a tool call (or max turns).
    As in the rollout, only a turn's first tool call runs and bad output gets an error back."""
    new: list[dict] = []
    for _ in range(cfg.max_turns):
        reply = chat(cfg, messages + new)
        content, calls, err = reply.get("content") or "", reply.get("tool_calls") or [], None
        if not calls:  # servers without a tool parser leave the calls in the text
            calls, err = C.parse_tool_calls(content)
            content = content.split("<tool_call>")[0].strip() if calls else content
        if calls:  # the rollout's rules, whatever format the server used
            f = calls[0].get("function", calls[0]) if isinstance(calls[0], dict) else {}
            try:
                call = C.tool_call(f.get("name"), f.get("arguments") or {})
                command = call["function"]["arguments"]["command"]
            except ValueError as e:
                err = f"malformed tool call: {e}"
        if err:
            new += [{"role": "assistant", "content": content}, C.malformed_turn(err)]
            continue
        if not calls:
            return new + [{"role": "assistant", "content": content}]
        act(env, new, content, command, cfg.command_timeout)
    return new


def api_run(cfg: Config, task: C.Task, msgs: list[dict], snapshot: str | None = None
            ) -> types.SimpleNamespace:
    """The API model goes on from `msgs` in a fork of `snapshot` (a recovery), or else in a fresh
    container snapshotted before the verifier runs (a first attempt; the snapshot kept if it fails)."""
    net = not cfg.no_internet
    with C.HOSTS.slot(snapshot) as host, C.start_env(task, snapshot, internet=net, host=host) as env:
        new = api_episode(cfg, env, msgs)
        snap = None if snapshot else env.snapshot()
        reward = env.verify().reward
    if snap and reward >= 1.0:
        C.remove_image(snap)
    return types.SimpleNamespace(task=task, messages=msgs + new, attempt_from=len(msgs), reward=reward,
                                 category=None, snapshot=snap if reward < 1.0 else None)


def recovery_rows(cfg: Config, tasks: list[C.Task], writer: Writer, scaffold: C.Scaffold
                  ) -> collections.Counter:
    """Student attempts (a local model on a rollout pool, or the API), and the teacher's recovery
    in a fork of each failure as soon as it fails; only verified recoveries become rows."""
    sampling = C.SamplingConfig(temperature=cfg.temperature, seed=cfg.seed)
    rcfg = C.rollout_config(scaffold, sampling, cfg.concurrency)
    done = {(r["task_id"], r.get("meta", {}).get("fault")) for r in writer.rows}
    todo = [(t, k) for t in tasks for k in range(cfg.attempts) if (t.name, f"attempt{k}") not in done]
    outcomes = collections.Counter()
    teacher_name = cfg.model if cfg.teacher == "policy" else f"openai:{cfg.api_model}"

    def settle(ep, k: int, rec) -> None:  # one attempt and its recovery (None: none was possible)
        if ep.reward >= 1.0 or rec is None:
            outcomes["attempt_passed" if ep.reward >= 1.0 else "attempt_error"] += 1
            return
        outcomes["row" if rec.reward >= 1.0 else "recovery_failed"] += 1
        if rec.reward >= 1.0:
            writer.add(make_row(ep.task.name, rec.messages, rec.attempt_from, {
                "teacher": teacher_name, "fault": f"attempt{k}", "error_category": ep.category or "n/a",
                "task_category": ep.task.category}))

    def api_recover(ep):
        message = C.recovery_message(ep.task.instruction, cfg.recovery_prompt)
        return api_run(cfg, ep.task, ep.messages + [message], ep.snapshot)

    if not (cfg.student_model or cfg.teacher == "policy"):  # the API is student and teacher
        def both(i: int):
            ep = api_run(cfg, todo[i][0], C.initial_messages(todo[i][0].instruction, cfg.system_prompt))
            try:
                return ep, (api_recover(ep) if ep.reward < 1.0 and ep.snapshot else None)
            finally:
                C.remove_image(ep.snapshot)
        pairs = run_each(cfg, both, [t for t, _ in todo], "attempt+recover", (FAILED, None))
        for (ep, rec), (_, k) in zip(pairs, todo, strict=True):
            settle(ep, k, rec)
        return outcomes
    student = C.make_engine(cfg.engine, cfg.student_model or cfg.model)
    teacher = None
    if cfg.teacher == "policy":
        same = cfg.student_model in (None, cfg.model)
        teacher = student if same else C.make_engine(cfg.engine, cfg.model)
    api = ThreadPoolExecutor(max(1, cfg.concurrency))  # an API teacher's recoveries
    api_jobs = []
    try:
        with C.RolloutPool(student, rcfg, not cfg.no_internet) as pool:
            for i, (t, k) in enumerate(todo):  # commit="all" keeps nothing: a killed run's are reaped
                ep = C.first_attempt(t, student.tokenizer, rcfg, seed=cfg.seed + i)
                pool.submit(ep, commit="all", tag=(k, None))
            for (k, attempt), ep in pool.completed():
                if attempt is not None:  # the teacher's recovery of `attempt` ended (its snapshot gone)
                    settle(attempt, k, ep)
                elif ep.reward >= 1.0 or not ep.snapshot:
                    C.remove_image(ep.snapshot)
                    settle(ep, k, None)
                elif teacher is not None:
                    pool.fork_recovery(ep, cfg.student_model or cfg.model, tag=(k, ep), engine=teacher)
                else:
                    api_jobs.append((ep, k, api.submit(api_recover, ep)))
        for ep, k, job in api_jobs:
            try:
                settle(ep, k, job.result())
            except Exception as e:
                print(f"{ep.task.name}: {type(e).__name__}: {e}")
                settle(ep, k, FAILED)
            C.remove_image(ep.snapshot)
    finally:
        api.shutdown(wait=False, cancel_futures=True)
    return outcomes


# ── --import: released ReTerm-10K rows ──────────────────────────────────────

def convert_message(m: object, j: int) -> dict:
    """One released message -> ours (content parts joined, arguments as dicts, call ids dropped);
    what it must hold is C.check_row's to say, after conversion."""
    if not isinstance(m, dict):
        return m
    content = m.get("content")
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    out = {"role": m.get("role"), "content": "" if content is None else content}
    calls = m.get("tool_calls")
    if calls and isinstance(calls, list):
        fns = [c.get("function", c) if isinstance(c, dict) else {} for c in calls]
        try:  # the rollout's rules for a call; arguments given as a JSON string become a dict
            out["tool_calls"] = [C.tool_call(f.get("name"), f.get("arguments")) for f in fns]
        except ValueError as e:
            raise ValueError(f"message {j}: {e}") from None
    elif calls:  # not a list: kept as given, for check_row to name
        out["tool_calls"] = calls
    return out


def convert_row(raw: object) -> dict:
    """Validate one released row and convert it; ValueError says what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    for key, tp in (("id", str), ("task_id", str), ("messages", list), ("train_from_message_index", int)):
        if not isinstance(raw.get(key), tp) or isinstance(raw.get(key), bool) or raw.get(key) in ("", []):
            raise ValueError(f"field {key!r} missing or not {'an int' if tp is int else 'non-empty'}")
    if raw.get("target_attempt_index", 2) != 2:
        raise ValueError(f"target_attempt_index must be 2, got {raw['target_attempt_index']!r}")
    messages = [convert_message(m, j) for j, m in enumerate(raw["messages"])]
    tfi = raw["train_from_message_index"]
    C.check_row({"messages": messages, "train_from_message_index": tfi})
    sha = raw.get("trajectory_sha256") or trajectory_sha256(messages)
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ValueError("trajectory_sha256 must be 64 hex digits")
    return {**make_row(raw["task_id"], messages, tfi, {"teacher": "import"}), "id": raw["id"],
            "trajectory_sha256": sha}


def read_import(path: str) -> list[tuple[str, object]]:
    """(file:line, row) for a JSON array or JSONL file; unreadable JSON and empty input are one-line
    errors naming the file and line, and a file whose every row is refused is refused as a whole."""
    text = Path(path).read_text(errors="replace")  # FileNotFoundError names a missing path
    if text.lstrip().startswith("["):
        try:
            raws = [(f"{path} row {i + 1}", r) for i, r in enumerate(json.loads(text))]
        except json.JSONDecodeError as e:
            raise C.DataError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
    else:
        lines = {i + 1: line for i, line in enumerate(text.splitlines()) if line.strip()}
        raws = list(zip((f"{path}:{i}" for i in lines), C.read_jsonl(path, strict=True), strict=True))
    if not raws:
        raise C.DataError(f"{path}: empty (no rows to import)")
    bad = []
    for where, raw in raws:
        try:
            convert_row(raw)
        except ValueError as e:
            bad.append(f"{where}: {e}")
    if len(bad) == len(raws):
        raise C.DataError(f"{path}: no importable row; first problem: {bad[0]}")
    return raws


# ── stats · main ────────────────────────────────────────────────────────────


def dataset_stats(rows: list[dict], n_tasks: int | None, tokenizer: object | None) -> dict:
    dist = lambda xs: {"min": min(xs), "median": statistics.median(xs), "mean": round(statistics.mean(xs), 1),
                       "max": max(xs)} if xs else {}
    meta = [r.get("meta", {}) for r in rows]
    stats = {"rows": len(rows), "tasks_covered": len({r["task_id"] for r in rows}), "tasks_total": n_tasks,
             **{f"by_{k}": dict(collections.Counter(m.get(k, "n/a") for m in meta))
                for k in ("fault_kind", "error_category", "task_category")},
             "messages_per_row": dist([len(r["messages"]) for r in rows]),
             "train_from_message_index": dist([r["train_from_message_index"] for r in rows]),
             "recovery_tool_calls": dist([len(commands_of(r["messages"][r["train_from_message_index"]:]))
                                          for r in rows])}
    if tokenizer is not None and rows:
        traces = [C.tokenize_messages(tokenizer, r["messages"], r["train_from_message_index"]) for r in rows]
        stats["tokens_per_row"] = dist([len(t) for t in traces])
        stats["trained_tokens_per_row"] = dist([sum(t.mask) for t in traces])
        stats["tokenizer"] = getattr(tokenizer, "name_or_path", "") or "tiny"
    return stats


def main(argv: list[str] | None = None) -> dict:
    argv = [("--import-path" + a[8:]) if a.split("=")[0] == "--import" else a
            for a in (sys.argv[1:] if argv is None else argv)]
    cfg = C.parse_config(Config, argv)
    # One scaffold for every teacher: the rows are written under the prompts the student will see.
    keys = ("max_turns", "max_tokens", "command_timeout", "system_prompt", "recovery_prompt")
    scaffold = C.load_scaffold(cfg.scaffold or cfg.student_model or cfg.model,
                               **{k: getattr(cfg, k) for k in keys})
    cfg = dataclasses.replace(cfg, **{k: getattr(scaffold, k) for k in keys})
    C.use_docker_hosts(cfg.docker_hosts)
    out = Path(cfg.out)
    raws = read_import(cfg.import_path) if cfg.import_path else []  # refused before anything is written
    out.parent.mkdir(parents=True, exist_ok=True)
    C.DISK.guard(out.parent)  # no episode takes it below the disk floor
    Path(f"{out}.config.json").write_text(json.dumps({"argv": sys.argv, **dataclasses.asdict(cfg)}, indent=2))
    writer = Writer(out)
    n_before, n_tasks = len(writer.rows), None
    if cfg.import_path:
        rejected = 0
        for where, raw in raws:
            try:
                writer.add(convert_row(raw))
            except ValueError as e:
                rejected += 1
                print(f"{where} (id={raw.get('id') if isinstance(raw, dict) else None}): {e}")
        C.log0(f"imported {len(writer.rows) - n_before} rows into {out} ({rejected} rejected, "
               f"{writer.duplicates} duplicates)")
    else:
        tasks = C.load_tasks(cfg.tasks, cfg.task_filter)
        n_tasks = len(tasks)
        if not cfg.scopes or set(cfg.scopes.split(",")) - set(SCOPES):
            raise SystemExit(f"--scopes {cfg.scopes!r}: a comma list of {', '.join(SCOPES)}")
        if cfg.teacher not in ("oracle", "policy", "openai"):
            raise SystemExit(f"--teacher {cfg.teacher!r}: choose oracle, policy or openai")
        if cfg.teacher == "openai" and not (cfg.base_url and cfg.api_model):
            raise SystemExit("--teacher openai needs --base-url and --api-model")
        if cfg.teacher == "policy" and not cfg.model:
            raise SystemExit("--teacher policy needs --model (the teacher; --student-model defaults to it)")
        with C.env_session():
            if cfg.teacher != "oracle":
                outcomes = recovery_rows(cfg, tasks, writer, scaffold)
            else:
                outcomes = sum(run_each(cfg, lambda i: oracle_task(cfg, tasks[i], writer), tasks,
                                        "build[oracle]", collections.Counter(error=1)), collections.Counter())
        C.log0(f"{len(writer.rows) - n_before} new rows ({len(writer.rows)} total, "
               f"{writer.duplicates} duplicates dropped); outcomes {dict(outcomes)}")
    tok_path = cfg.tokenizer or cfg.model or cfg.student_model
    tokenizer = C.load_tokenizer(tok_path) if tok_path else C.make_tiny_tokenizer()
    stats = dataset_stats(writer.rows, n_tasks, tokenizer)
    Path(f"{out}.stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    print(json.dumps(stats, indent=2))
    return stats


if __name__ == "__main__":
    C.run_main(main)
