"""Stage 01 — ReTerm-10K-style recovery demonstrations (SFT cold-start data).

A row pairs a FAILED first attempt (context, no loss) with a VERIFIED second attempt that
repairs the same, un-reset container (DESIGN §1). Every row is checked in real Docker: the first
attempt is snapshotted before the verifier runs and must fail; the recovery runs in a fork of
that snapshot and must pass. Teachers:
  oracle  replay the task's solution/solve.sh step by step with one injected fault (drop a
          step, a typo'd program, a wrong path, a wrong value, stop early), then recover by
          inspecting the state and redoing the steps from the faulty one (offline, no model)
  policy  a local model (--model) recovers the failures of a student (--student-model)
  openai  an OpenAI-compatible chat-completions server (--base-url, --api-model) recovers
--import PATH converts released ReTerm-10K rows (JSON / JSONL) instead, validating each row.
Rows already in --out are kept and their (task, fault) is not redone, so a killed run resumes.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import random
import re
import statistics
import threading
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import common as C


@dataclasses.dataclass
class Config:
    """Build verified recovery demonstrations (ReTerm-10K schema) from Harbor tasks."""

    tasks: str = "tasks"  # folder of Harbor tasks
    out: str = "runs/data/reterm.jsonl"  # output JSONL (stats in OUT.stats.json, config in OUT.config.json)
    teacher: str = "oracle"  # oracle | policy | openai
    import_path: str | None = None  # convert released ReTerm-10K rows (JSON/JSONL) instead; alias --import
    faults_per_task: int = 3  # oracle: distinct verified faults wanted per task
    max_tries_per_task: int = 9  # oracle: fault candidates tried per task at most
    attempts: int = 4  # policy/openai: student attempts per task (each failure gets one recovery)
    model: str | None = None  # policy: the teacher model folder
    student_model: str | None = None  # policy/openai: model for the first attempt (default: the teacher)
    engine: str = "vllm"  # policy engine: vllm | hf
    base_url: str | None = None  # openai: server root, e.g. http://127.0.0.1:8000/v1
    api_model: str | None = None  # openai: model name sent to the server
    api_key_env: str = "OPENAI_API_KEY"  # openai: environment variable holding the API key
    http_retries: int = 5  # openai: retries per request (exponential backoff)
    max_turns: int = 30  # policy/openai: tool calls per attempt at most
    temperature: float = 0.7  # policy/openai sampling temperature
    max_tokens: int = 2048  # policy/openai: tokens per assistant turn
    command_timeout: float = 180.0  # seconds per bash call
    tokenizer: str | None = None  # tokenizer for the token-length stats (default: --model, else the tiny one)
    concurrency: int = 4  # tasks worked on at once
    task_filter: str | None = None  # regex: only tasks whose name matches
    seed: int = 0  # fault choice / sampling seed


# ── rows ────────────────────────────────────────────────────────────────────

ROLES = {"system", "user", "assistant", "tool"}


def trajectory_sha256(messages: list[dict]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def make_row(task_id: str, messages: list[dict], train_from: int, meta: dict) -> dict:
    """A row in the released schema (id = task_id:sha[:16], as released) + our `meta`."""
    sha = trajectory_sha256(messages)
    return {"id": f"{task_id}:{sha[:16]}", "task_id": task_id, "messages": messages,
            "train_from_message_index": train_from, "target_attempt_index": 2,
            "trajectory_sha256": sha, "meta": meta}


def tool_call(thought: str, command: str) -> dict:
    call = {"type": "function", "function": {"name": "bash", "arguments": {"command": command}}}
    return {"role": "assistant", "content": thought, "tool_calls": [call]}


def commands_of(messages: list[dict]) -> list[str]:
    """The bash commands of the assistant turns in `messages`, in order."""
    return [c["function"]["arguments"]["command"] for m in messages for c in m.get("tool_calls") or []]


class Writer:
    """Thread-safe, deduplicating appender: each row is on disk as soon as it is verified."""

    def __init__(self, path: Path):
        self.path, self.lock = path, threading.Lock()
        self.rows = C.read_jsonl(path)
        self.seen = {r["trajectory_sha256"] for r in self.rows}
        self.duplicates = 0

    def add(self, row: dict) -> bool:
        with self.lock:
            if row["trajectory_sha256"] in self.seen:
                self.duplicates += 1
                return False
            self.seen.add(row["trajectory_sha256"])
            self.rows.append(row)
            C.append_jsonl(self.path, row)
            return True


# ── oracle teacher: solve.sh steps with one injected fault ──────────────────

STEP = re.compile(r"^\s*#\s*step:\s*(.*?)\s*$")
BUILTINS = {"cd", "echo", "export", "if", "then", "else", "fi", "for", "do", "done", "while", "read", "set",
            "true", "false", "test", "printf", "case", "esac", "exit", "return", "local", "eval", "exec",
            "cat", "ls", "head", "tail", "wc"}  # display-only programs: a typo there changes no outcome
CMD_POS = re.compile(r"(?:^|&&|\|\||[|;({]|\bthen\b|\bdo\b)[ \t]*([a-z][a-z0-9_+-]*)(?=[ \t\n]|$)", re.M)
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?[^\n]*\n(.*?\n)\1\n?", re.S)
PATH = re.compile(r"(?<![\w.$/-])/(?:app|srv|home|etc|var|opt|data|root|workspace|mnt|tmp)(?:/[\w.+-]+)+")
NUMBER = re.compile(r"(?<![\w.%$/-])(\d{1,4})(?![\w./-]|>|\])")


def split_steps(script: str) -> list[tuple[str, str]]:
    """solve.sh -> [(description, command)] by its `# step:` markers (no markers: one step)."""
    steps: list[list] = []
    for line in script.splitlines():
        m = STEP.match(line)
        if m:
            steps.append([m.group(1), []])
        elif steps:
            steps[-1][1].append(line)
    if not steps:
        body = [ln for ln in script.splitlines() if not ln.startswith(("#!", "set -"))]
        steps = [["run the solution", body]]
    return [(d, "\n".join(ls).strip()) for d, ls in steps if "\n".join(ls).strip()]


def typo(word: str) -> str:
    if len(word) <= 2:
        return word + word[-1]
    i = len(word) // 2
    swapped = word[: i - 1] + word[i] + word[i - 1] + word[i + 1:]
    return swapped if swapped != word else word[:i] + word[i + 1:]


@dataclasses.dataclass
class Fault:
    kind: str  # drop | stop | typo | path | value
    step: int  # index of the faulty step (stop: the first step never run)
    key: str  # unique within a task; resume skips keys already in the output
    commands: list[str]  # attempt 1's commands
    bad: str = ""  # what was wrong (typo'd program, wrong path, wrong value)
    good: str = ""


def candidate_faults(steps: list[tuple[str, str]], rng: random.Random) -> list[Fault]:
    """Every fault we know how to inject, shuffled within kind, then interleaved across kinds so
    the first few candidates are of different kinds."""
    cmds = [c for _, c in steps]
    n, by_kind = len(steps), collections.defaultdict(list)
    for i, cmd in enumerate(cmds):
        swap = lambda new, i=i: cmds[:i] + [new] + cmds[i + 1:]
        if i < n - 1 or n == 1:  # dropping the last step is the same trajectory as stopping early
            by_kind["drop"].append(Fault("drop", i, f"drop@{i}", cmds[:i] + cmds[i + 1:]))
        if i > 0:
            by_kind["stop"].append(Fault("stop", i, f"stop@{i}", cmds[:i]))
        shell = HEREDOC.sub(lambda m: m.group(0)[: m.start(2) - m.start()] + " " * len(m.group(2))
                            + m.group(0)[m.end(2) - m.start():], cmd)  # programs outside heredoc bodies
        progs = [m for m in CMD_POS.finditer(shell) if m.group(1) not in BUILTINS]
        for m in progs[:2]:
            bad = cmd[: m.start(1)] + typo(m.group(1)) + cmd[m.end(1):]
            by_kind["typo"].append(Fault("typo", i, f"typo@{i}:{m.start(1)}", swap(bad), typo(m.group(1)),
                                         m.group(1)))
        for p in list(dict.fromkeys(PATH.findall(cmd)))[:2]:
            parent, base = p.rsplit("/", 1)
            wrong = f"/tmp/{base}" if parent != "/tmp" else f"/tmp/{typo(base)}"
            by_kind["path"].append(Fault("path", i, f"path@{i}:{p}", swap(cmd.replace(p, wrong)), wrong, p))
        for m in list(NUMBER.finditer(cmd))[:2]:
            v = str(int(m.group(1)) + 1)
            by_kind["value"].append(Fault("value", i, f"value@{i}:{m.start(1)}",
                                          swap(cmd[: m.start(1)] + v + cmd[m.end(1):]), v, m.group(1)))
    for faults in by_kind.values():
        rng.shuffle(faults)
    kinds = sorted(by_kind, key=lambda k: rng.random())
    out = []
    for j in range(max((len(v) for v in by_kind.values()), default=0)):
        out += [by_kind[k][j] for k in kinds if j < len(by_kind[k])]
    return out


def diagnosis(steps: list[tuple[str, str]], fault: Fault) -> str:
    """A short look at the state the faulty step should have produced."""
    paths = PATH.findall(steps[min(fault.step, len(steps) - 1)][1])
    dirs = list(dict.fromkeys(p if not Path(p).suffix else str(Path(p).parent) for p in paths))[:3]
    look = f"ls -la {' '.join(dirs)}" if dirs else "pwd && ls -la"
    return f"command -v {fault.good}; {look}" if fault.kind == "typo" else look


def recovery_plan(steps: list[tuple[str, str]], fault: Fault, from_start: bool) -> list[tuple[str, str]]:
    """(thought, command) pairs of the recovery after the diagnosis."""
    desc = [d for d, _ in steps]
    i = 0 if from_start else fault.step
    d = desc[fault.step]
    why = {"drop": f"The step '{d}' was never run, so its result is missing.",
           "stop": f"The previous attempt stopped before '{d}': the remaining steps never ran.",
           "typo": f"'{fault.bad}' is a typo for '{fault.good}', so '{d}' failed.",
           "path": f"'{d}' used the wrong path {fault.bad} instead of {fault.good}.",
           "value": f"'{d}' used a wrong value ({fault.bad} instead of {fault.good})."}[fault.kind]
    plan = []
    if fault.kind == "path":
        plan.append((f"{why} First I remove the stray output.", f"rm -rf -- {fault.bad}"))
        why = "Now"
    redo = "redo the task from the first step" if from_start else "redo it and the steps after it"
    for j in range(i, len(steps)):
        thought = f"{why} I will {redo}: {desc[j]}." if j == i else f"Next: {desc[j]}."
        plan.append((thought, steps[j][1]))
    return plan


def act(env: C.Env, msgs: list[dict], thought: str, command: str, timeout: float) -> C.CmdResult:
    """One bash tool call, appended to `msgs` exactly as the rollout records it."""
    r = env.bash(command, timeout)
    msgs += [tool_call(thought, command), {"role": "tool", "content": C.format_observation(r)}]
    return r


def oracle_row(cfg: Config, task: C.Task, steps: list[tuple[str, str]], fault: Fault
               ) -> tuple[dict | None, str]:
    """Run one faulty attempt + recovery in Docker; a row only if 1 fails and 2 passes."""
    msgs = C.initial_messages(task.instruction)
    desc = [d for d, _ in steps]
    run_descs = desc[:fault.step] if fault.kind == "stop" else [
        d for j, d in enumerate(desc) if not (fault.kind == "drop" and j == fault.step)]
    ran = []  # what the rollout's classify_failure looks at
    with C.start_env(task) as env:
        for d, cmd in zip(run_descs, fault.commands, strict=True):
            r = act(env, msgs, f"Next: {d}.", cmd, cfg.command_timeout)
            ran.append({"command": cmd, "exit_code": r.exit_code, "timed_out": r.timed_out})
        msgs.append({"role": "assistant", "content": "The task is complete: " + "; ".join(run_descs) + "."})
        snap = env.snapshot()  # before the verifier touches the container (Recovery-Bench)
        first = env.verify()
    attempt = types.SimpleNamespace(end="answered", malformed=0, turns=len(ran) + 1, commands=ran)
    try:
        if first.reward >= 1.0:
            return None, "fault_did_not_fail"
        msgs.append(C.recovery_message(task.instruction))
        for from_start in (False, True):  # redo from the faulty step; if that is not enough, all
            out = list(msgs)
            with C.fork(snap, task, 1)[0] as env:
                act(env, out, "The previous attempt failed. Let me inspect the current state before "
                    "changing anything.", diagnosis(steps, fault), cfg.command_timeout)
                for thought, cmd in recovery_plan(steps, fault, from_start):
                    act(env, out, thought, cmd, cfg.command_timeout)
                d = desc[min(fault.step, len(desc) - 1)]
                done = {"drop": f"ran the skipped step '{d}'", "stop": f"ran the steps from '{d}' on",
                        "typo": f"fixed the typo in '{d}'", "path": f"redid '{d}' with the right path",
                        "value": f"redid '{d}' with the right value"}[fault.kind]
                out.append({"role": "assistant", "content": f"I {done}; every step of the task has now "
                            "run and the task is complete."})
                second = env.verify()
            if second.reward >= 1.0:
                meta = {"teacher": "oracle", "fault": fault.key, "fault_kind": fault.kind,
                        "error_category": C.classify_failure(attempt), "task_category": task.category,
                        "recovery": "from_start" if from_start else "from_fault"}
                return make_row(task.name, out, len(msgs), meta), "row"
        return None, "recovery_failed"
    finally:
        C.remove_image(snap)


def oracle_task(cfg: Config, task: C.Task, writer: Writer) -> collections.Counter:
    script = (task.solution_dir / "solve.sh").read_text()
    steps = split_steps(script)
    have = [r for r in writer.rows if r["task_id"] == task.name]
    done = {r.get("meta", {}).get("fault") for r in have}
    outcomes, n_ok = collections.Counter(), len(have)
    rng = random.Random(f"{cfg.seed}:{task.name}")
    for fault in candidate_faults(steps, rng):
        if n_ok >= cfg.faults_per_task or sum(outcomes.values()) >= cfg.max_tries_per_task:
            break
        if fault.key in done:
            continue
        row, outcome = oracle_row(cfg, task, steps, fault)
        if row is not None and writer.add(row):
            n_ok += 1
        outcomes[outcome] += 1
    return outcomes


# ── openai teacher: any OpenAI-compatible chat-completions server ───────────


def to_openai(messages: list[dict]) -> list[dict]:
    """Our messages -> the wire format (call ids, arguments as JSON strings)."""
    out, last_id = [], None
    for i, m in enumerate(messages):
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for j, c in enumerate(m["tool_calls"]):
                last_id = f"call_{i}_{j}"
                calls.append({"id": last_id, "type": "function", "function": {
                    "name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}})
            m["tool_calls"] = calls
        elif m["role"] == "tool":
            m["tool_call_id"] = last_id
        out.append(m)
    return out


def chat(cfg: Config, messages: list[dict]) -> dict:
    """One chat-completions call; connection errors, 408/429/5xx retry with exponential backoff."""
    import os

    body = json.dumps({"model": cfg.api_model, "messages": to_openai(messages), "tools": [C.BASH_TOOL],
                       "temperature": cfg.temperature, "max_tokens": cfg.max_tokens}).encode()
    headers = {"Content-Type": "application/json"}
    if os.environ.get(cfg.api_key_env):
        headers["Authorization"] = f"Bearer {os.environ[cfg.api_key_env]}"
    url = cfg.base_url.rstrip("/") + "/chat/completions"
    for i in range(cfg.http_retries + 1):
        try:
            req = urllib.request.Request(url, data=body, headers=headers)
            with urllib.request.urlopen(req, timeout=600) as r:
                return json.load(r)["choices"][0]["message"]
        except urllib.error.HTTPError as e:
            if e.code not in (408, 429) and e.code < 500 or i == cfg.http_retries:
                raise RuntimeError(f"{url}: HTTP {e.code}: {e.read()[:300]!r}") from None
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as e:
            if i == cfg.http_retries:
                raise RuntimeError(f"{url}: {type(e).__name__}: {e}") from None
        time.sleep(min(60.0, 0.5 * 2**i))
    raise AssertionError("unreachable")


def api_episode(cfg: Config, env: C.Env, messages: list[dict]) -> list[dict]:
    """Let the API model act in `env` until it answers without a tool call (or max turns);
    returns the new messages. As in the rollout, only a turn's first tool call runs and bad
    output gets an error message back."""
    new: list[dict] = []
    for _ in range(cfg.max_turns):
        reply = chat(cfg, messages + new)
        content, calls, err = reply.get("content") or "", reply.get("tool_calls") or [], None
        if not calls:  # servers without a tool parser leave the calls in the text
            calls, err = C.parse_tool_calls(content)
            content = content.split("<tool_call>")[0].strip() if calls else content
        if calls:
            f = calls[0].get("function", calls[0])
            try:
                args = f.get("arguments") or {}
                args = json.loads(args) if isinstance(args, str) else args
                assert f.get("name") == "bash" and isinstance(args.get("command"), str)
            except (ValueError, AssertionError, AttributeError):
                err = "malformed tool call: the only tool is `bash`, with a string `command`"
        if err:
            new += [{"role": "assistant", "content": content}, {"role": "user", "content": f"ERROR: {err}. "
                     "Call the bash tool, or answer without a tool call if done."}]
            continue
        if not calls:
            return new + [{"role": "assistant", "content": content}]
        act(env, new, content, args["command"], cfg.command_timeout)
    return new


def api_attempt(cfg: Config, task: C.Task) -> types.SimpleNamespace:
    """A first attempt by the API model in a fresh container (snapshot before verify)."""
    msgs = C.initial_messages(task.instruction)
    with C.start_env(task) as env:
        msgs += api_episode(cfg, env, msgs)
        snap = env.snapshot()
        reward = env.verify().reward
    if reward >= 1.0:
        C.remove_image(snap)
    return types.SimpleNamespace(task=task, messages=msgs, reward=reward, category=None,
                                 snapshot=snap if reward < 1.0 else None)


def failed_call(result: object, task: C.Task) -> bool:
    """run_concurrently hands exceptions back as results: report them, go on with the rest."""
    if isinstance(result, Exception):
        print(f"{task.name}: {type(result).__name__}: {result}")
    return isinstance(result, Exception)


def recovery_rows(cfg: Config, tasks: list[C.Task], writer: Writer) -> collections.Counter:
    """Student attempts (a local model in one batched rollout, or the API), then the teacher
    recovers from a fork of each failure; only verified recoveries become rows."""
    rcfg = C.RolloutConfig(max_turns=cfg.max_turns, command_timeout=cfg.command_timeout,
                           concurrency=cfg.concurrency, sampling=C.SamplingConfig(
                               temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed))
    done = {(r["task_id"], r.get("meta", {}).get("fault")) for r in writer.rows}
    todo = [(t, k) for t in tasks for k in range(cfg.attempts) if (t.name, f"attempt{k}") not in done]
    student = None
    if cfg.student_model or cfg.teacher == "policy":
        student = C.make_engine(cfg.engine, cfg.student_model or cfg.model)
        # snapshot="all" keeps nothing (keep=0): a killed run's snapshots are reaped on exit
        episodes, _ = C.run_attempts([t for t, _ in todo], student, rcfg, snapshot="all")
    else:
        got = dict(C.run_concurrently(lambda i: api_attempt(cfg, todo[i][0]), list(range(len(todo))),
                                      cfg.concurrency, "attempt"))
        episodes = [types.SimpleNamespace(reward=0.0, snapshot=None) if failed_call(got[i], todo[i][0])
                    else got[i] for i in range(len(todo))]
    failed = [(ep, k) for ep, (_, k) in zip(episodes, todo, strict=True) if ep.reward < 1.0 and ep.snapshot]
    outcomes = collections.Counter(attempt_passed=sum(ep.reward >= 1.0 for ep in episodes),
                                   attempt_error=sum(ep.reward < 1.0 and not ep.snapshot for ep in episodes))
    try:
        if cfg.teacher == "policy":
            same = cfg.student_model in (None, cfg.model)
            teacher = student if same else C.make_engine(cfg.engine, cfg.model)
            states = [C.FailureState.from_episode(ep, cfg.student_model or cfg.model) for ep, _ in failed]
            groups, _ = C.run_recoveries(states, {t.name: t for t in tasks}, 1, teacher, rcfg)
            results = [(g[0].messages, g[0].attempt_from, g[0].reward) for g in groups]
        else:
            def recover(i: int) -> tuple[list[dict], int, float]:
                ep = failed[i][0]
                msgs = ep.messages + [C.recovery_message(ep.task.instruction)]
                with C.fork(ep.snapshot, ep.task, 1)[0] as env:
                    rec = api_episode(cfg, env, msgs)
                    return msgs + rec, len(msgs), env.verify().reward
            got = dict(C.run_concurrently(recover, list(range(len(failed))), cfg.concurrency, "recover"))
            results = [([], 0, 0.0) if failed_call(got[i], failed[i][0].task) else got[i]
                       for i in range(len(failed))]
        for (ep, k), (messages, train_from, reward) in zip(failed, results, strict=True):
            outcomes["row" if reward >= 1.0 else "recovery_failed"] += 1
            if reward >= 1.0:
                writer.add(make_row(ep.task.name, messages, train_from, {
                    "teacher": cfg.model if cfg.teacher == "policy" else f"openai:{cfg.api_model}",
                    "fault": f"attempt{k}", "error_category": ep.category or "n/a",
                    "task_category": ep.task.category}))
    finally:
        for ep in episodes:
            if ep.snapshot:
                C.remove_image(ep.snapshot)
    return outcomes


# ── --import: released ReTerm-10K rows ──────────────────────────────────────


def convert_message(m: object, j: int) -> dict:
    """One released message -> ours (content parts joined, arguments as dicts, call ids dropped)."""
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise ValueError(f"message {j}: needs a role in {sorted(ROLES)}")
    content = m.get("content")
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if content is not None and not isinstance(content, str):
        raise ValueError(f"message {j}: content must be a string")
    out = {"role": m["role"], "content": content or ""}
    if m.get("tool_calls"):
        if m["role"] != "assistant" or not isinstance(m["tool_calls"], list):
            raise ValueError(f"message {j}: tool_calls must be a list on an assistant message")
        calls = []
        for c in m["tool_calls"]:
            f = c.get("function", c) if isinstance(c, dict) else {}
            args = f.get("arguments")
            try:
                args = json.loads(args) if isinstance(args, str) else args
            except json.JSONDecodeError:
                raise ValueError(f"message {j}: tool call arguments are not valid JSON") from None
            if f.get("name") != "bash" or not isinstance(args, dict) or type(args.get("command")) is not str:
                raise ValueError(f"message {j}: expected a `bash` tool call with a string `command`")
            calls.append({"type": "function", "function": {"name": "bash", "arguments": args}})
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
    if not 0 < tfi < len(messages):
        raise ValueError(f"train_from_message_index {tfi} outside 1..{len(messages) - 1}")
    if not any(m["role"] == "assistant" for m in messages[tfi:]):
        raise ValueError("no assistant message after train_from_message_index (nothing to train on)")
    sha = raw.get("trajectory_sha256") or trajectory_sha256(messages)
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ValueError("trajectory_sha256 must be 64 hex digits")
    return {**make_row(raw["task_id"], messages, tfi, {"teacher": "import"}), "id": raw["id"],
            "trajectory_sha256": sha}


def import_rows(path: str | Path, writer: Writer) -> tuple[int, list[str]]:
    """Convert every valid row of a JSON array / JSONL file; (n added, one error per bad row)."""
    text = Path(path).read_text()
    raws = json.loads(text) if text.lstrip().startswith("[") else [
        json.loads(line) for line in text.splitlines() if line.strip()]
    added, errors = 0, []
    for i, raw in enumerate(raws):
        try:
            added += writer.add(convert_row(raw))
        except ValueError as e:
            errors.append(f"row {i} (id={raw.get('id') if isinstance(raw, dict) else None}): {e}")
    return added, errors


# ── stats ───────────────────────────────────────────────────────────────────


def dataset_stats(rows: list[dict], n_tasks: int | None, tokenizer: object | None) -> dict:
    def dist(xs: list[float]) -> dict:
        return {"min": min(xs), "median": statistics.median(xs), "mean": round(statistics.mean(xs), 1),
                "max": max(xs)} if xs else {}

    meta = [r.get("meta", {}) for r in rows]
    stats = {"rows": len(rows), "tasks_covered": len({r["task_id"] for r in rows}), "tasks_total": n_tasks,
             "by_fault_kind": dict(collections.Counter(m.get("fault_kind", "n/a") for m in meta)),
             "by_error_category": dict(collections.Counter(m.get("error_category", "n/a") for m in meta)),
             "by_task_category": dict(collections.Counter(m.get("task_category", "n/a") for m in meta)),
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
    import sys

    argv = sys.argv[1:] if argv is None else argv
    argv = [("--import-path" + a[8:]) if a.split("=")[0] == "--import" else a for a in argv]
    cfg = C.parse_config(Config, argv)
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.config.json").write_text(json.dumps({"argv": sys.argv, **dataclasses.asdict(cfg)}, indent=2))
    writer = Writer(out)
    n_before, n_tasks = len(writer.rows), None
    if cfg.import_path:
        added, errors = import_rows(cfg.import_path, writer)
        for e in errors:
            print(e)
        C.log0(f"imported {added} rows into {out} ({len(errors)} rejected, {writer.duplicates} duplicates)")
    else:
        tasks = C.load_tasks(cfg.tasks, cfg.task_filter)
        n_tasks = len(tasks)
        if cfg.teacher not in ("oracle", "policy", "openai"):
            raise SystemExit(f"--teacher {cfg.teacher!r}: choose oracle, policy or openai")
        if cfg.teacher == "openai" and not (cfg.base_url and cfg.api_model):
            raise SystemExit("--teacher openai needs --base-url and --api-model")
        if cfg.teacher == "policy" and not cfg.model:
            raise SystemExit("--teacher policy needs --model (the teacher; --student-model defaults to it)")
        outcomes = collections.Counter()
        with C.env_session():
            if cfg.teacher != "oracle":
                outcomes = recovery_rows(cfg, tasks, writer)
            else:
                work = lambda t: oracle_task(cfg, t, writer)
                for task, res in C.run_concurrently(work, tasks, cfg.concurrency, "build[oracle]"):
                    if isinstance(res, Exception):
                        print(f"{task.name}: {type(res).__name__}: {res}")
                        res = {"error": 1}
                    outcomes.update(res)
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
