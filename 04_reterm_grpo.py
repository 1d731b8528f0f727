"""Stage 04 — ReTerm-GRPO: online RL from the agent's own failure states.

One step:
  1. draw B failure states from the pool and fork G containers from each snapshot; G recovery
     attempts run from the failed attempt's exact tokens + the recovery message (temperature 1);
  2. with --fresh-frac, some groups are G fresh attempts of a task instead; their failed attempts
     are snapshotted and ADDED to the pool, so the agent keeps learning from its newest failures;
  3. reward = the task's tests; group advantages; clipped token-level policy loss; optimizer step;
  4. the new weights go into the running engine (no restart).
--mode standard is the paper's baseline: G fresh attempts per task, no forks, same everything else.

Pool rule: weight(s) = max(--floor, 1 - p(s)), p(s) = the success rate of the latest group forked
from s (unseen: 0); B states drawn without replacement (Efraimidis-Spirakis keys); fresh groups and
--mode standard draw tasks the same way. A state whose last --retire-after groups all succeeded is
mastered and leaves, as do the lowest-weight, oldest states above --pool-max. The pool owns one
image tag per state (stage 03's snapshots are re-tagged, never removed), untagged as it leaves.

Distributed: torchrun + FSDP2. Rank 0 owns the engine and the containers, runs the rollouts and
broadcasts the training rows; every rank trains on its micro-batches; the gathered full state dict
goes into the engine. vLLM is colocated on GPU 0 (rollouts are dominated by container time: a GPU
of its own would idle through every environment and optimizer step, while colocated all N GPUs
train) and sleeps at level 1 while training (weights to CPU, KV cache freed; level 2 would discard
the weights reload_weights copies into); on CPU it stays awake (a 1 GiB KV cache). Under torchrun
the engine core gets a process of its own (in-process vLLM would build its groups on torchrun's
world and hang) and weights pass through a safetensors file in /dev/shm; one process hands tensors
over by reference. Verified on CPU (2 gloo ranks); the GPU sleep/wake path has not run yet.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import random
import time
from pathlib import Path

import torch

import common as C


@dataclasses.dataclass
class Config:
    """ReTerm-GRPO: fork G recovery attempts from each failure state and learn from the group."""

    model: str  # starting policy (the SFT checkpoint's final/ folder)
    out: str  # output folder: ckpt/, metrics.jsonl, pool.json, final/
    failures: str | None = None  # failures.jsonl from stage 03 (the initial pool)
    tasks: str = "tasks"  # folder of Harbor tasks the failures come from
    steps: int = 200  # optimizer steps (rollout batches)
    mode: str = "fork"  # fork (ReTerm) | standard (GRPO from fresh starts, the ablation)
    batch_states: int = 16  # B: groups per step (failure states, or tasks in standard mode)
    group_size: int = 8  # G: attempts per group
    fresh_frac: float = 0.25  # fork mode: share of groups that start fresh and feed the pool
    floor: float = 0.1  # pool sampling weight floor: mastered states are still drawn sometimes
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
    concurrency: int = 64  # containers stepped at once
    docker_hosts: str = ""  # Docker engines URL[#slots],... (unix://, ssh://, tcp://); "" = the local one
    engine: str = "vllm"  # vllm | hf (transformers fallback)
    dtype: str = "bfloat16"  # engine weights' dtype
    gpu_memory_utilization: float = 0.35  # vLLM's share of GPU 0 (colocated with training)
    sleep: bool = True  # GPU: put vLLM to sleep (level 1) while training
    env_step_budget: int = 0  # stop once this many environment steps were spent (0 = no limit)
    save_every: int = 10  # checkpoint every N steps (and at the end)
    keep_pool: bool = False  # keep the pool's snapshot images after the last step (to go on later)
    seed: int = 0  # sampling / pool seed


# ── the GRPO math (DESIGN §8) ─────────────────────────────────────────────────────────────────────


def group_advantages(rewards, use_std: bool = True) -> torch.Tensor:
    """A_i = (r_i - mean r) / (std r + 1e-6) over the last dim (unbiased std, as TRL); without
    std A_i = r_i - mean r (Dr. GRPO). An all-equal group gets zeros: no signal."""
    r = torch.as_tensor(rewards, dtype=torch.float32)
    a = r - r.mean(-1, keepdim=True)
    if not use_std or r.shape[-1] < 2:
        return a
    return a / (r.std(-1, unbiased=True, keepdim=True) + 1e-6)


def drop_uniform_groups(groups: list[list]) -> tuple[list[list], int]:
    """Keep groups whose rewards differ; all-equal groups carry no gradient. Returns (kept, dropped)."""
    kept = [g for g in groups if len({ep.reward for ep in g}) > 1]
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
                        weights: torch.Tensor | None = None) -> torch.Tensor:
    """ℓ_t = -min(ρ_t A, clip(ρ_t, 1-eps_low, 1+eps_high) A), ρ_t = exp(logp - old_logp), each
    token optionally scaled by `weights` (the truncated IS weight); loss = Σ mask·ℓ / Σ mask over
    the whole batch (token-level, DAPO: long attempts weigh by their tokens). [B,T],[B,T],[B],[B,T]."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None].to(ratio.dtype)
    per_tok = -torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
    if weights is not None:
        per_tok = per_tok * weights
    m = mask.bool()
    return torch.where(m, per_tok, 0.0).sum() / m.sum().clamp(min=1)


# ── the failure-state pool ────────────────────────────────────────────────────────────────────────

def load_failures(path: str | Path) -> list[C.FailureState]:
    names = {f.name for f in dataclasses.fields(C.FailureState)}  # stage 03's extra keys are ignored
    return [C.FailureState(**{k: v for k, v in row.items() if k in names}) for row in C.read_jsonl(path)]


def weight(hist: list[float], floor: float) -> float:
    return max(floor, 1.0 - (hist[-1] if hist else 0.0))


def sample_by_mastery(keys: list[str], hist: dict, k: int, floor: float, rng: random.Random) -> list[str]:
    """k keys without replacement, P ∝ max(floor, 1 - latest success rate) (Efraimidis-Spirakis)."""
    scored = sorted(keys, key=lambda s: rng.random() ** (1.0 / weight(hist.get(s, []), floor)), reverse=True)
    return scored[:k]


def pool_add(pool: dict, state: C.FailureState, image: str, step: int) -> None:
    pool["states"][state.id] = {"state": dataclasses.asdict(state) | {"snapshot": image}, "added": step}
    C.HOSTS.note(image, state.host)


def pool_drop_lost(pool: dict) -> int:
    """States whose snapshot went with a lost Docker engine leave the pool; a copy elsewhere keeps one."""
    lost = 0
    for sid, s in list(pool["states"].items()):
        homes = C.HOSTS.homes(s["state"]["snapshot"])
        if not homes:
            del pool["states"][sid]
            lost += 1
        elif s["state"].get("host") not in homes:
            s["state"]["host"] = homes[0]
    return lost


def pool_prune(pool: dict, cfg: Config) -> list[str]:
    """Retire mastered states and trim to --pool-max; their images are removed. Returns the ids."""
    hist, states = pool["hist"], pool["states"]
    gone = [s for s in states if len(hist.get(s, [])) >= cfg.retire_after
            and all(h == 1.0 for h in hist[s][-cfg.retire_after:])]
    rest = sorted((s for s in states if s not in gone),
                  key=lambda s: (weight(hist.get(s, []), cfg.floor), states[s]["added"]))
    gone += rest[: max(0, len(rest) - cfg.pool_max)]
    for s in gone:
        C.remove_image(states.pop(s)["state"]["snapshot"])
    return gone


def fits(state: C.FailureState, tasks: dict, tok, rcfg: C.RolloutConfig, min_tokens: int) -> bool:
    """Whether the failed attempt + recovery message leave at least `min_tokens` of the context: a
    state that fills it would get no recovery turn, score 0 forever and never leave the pool."""
    prefix = len(C.recovery_attempt(tasks[state.task], state, tok, rcfg).trace)
    return rcfg.max_context - prefix >= (min_tokens or 2 * rcfg.sampling.max_tokens)


def init_pool(cfg: Config, out: Path, tasks: dict, tok, rcfg: C.RolloutConfig) -> dict:
    pool = {"states": {}, "hist": {}, "retired": 0, "skipped_long": 0}
    if cfg.mode == "fork" and cfg.failures:
        repo = "reterm-pool/" + hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:12]
        for s in load_failures(cfg.failures):
            if s.task not in tasks or s.id in pool["states"]:
                continue
            try:  # a tag of the pool's own: dropping it later never touches the original image
                if s.host not in C.HOSTS.live():
                    raise C.EnvError(f"its engine {s.host} is not among --docker-hosts")
                image = C.docker_client(s.host).images.get(s.snapshot)
            except Exception as e:
                C.log0(f"  skip state: snapshot {s.snapshot} unusable ({type(e).__name__}: {e})")
                continue
            if not fits(s, tasks, tok, rcfg, cfg.min_recovery_tokens):
                pool["skipped_long"] += 1
                continue
            image.tag(repo, s.id)
            pool_add(pool, s, f"{repo}:{s.id}", 0)
        if pool["skipped_long"]:
            C.log0(f"skipped {pool['skipped_long']} failure states whose prefix leaves less than the minimum "
                   f"recovery budget of the {rcfg.max_context}-token context")
    return pool


def _write_live(out: Path, pool: dict) -> None:
    """Every image the pool owns now: on resume, those of steps after the checkpoint are removed."""
    images = sorted([s["state"]["snapshot"], s["state"].get("host")] for s in pool["states"].values())
    (out / "pool_live.json").write_text(json.dumps(images))


def _gc_orphans(out: Path, pool: dict) -> None:
    """On (re)start: remove images no state owns; drop states whose image is gone (a finished
    run removes them unless --keep-pool)."""
    live = out / "pool_live.json"
    owned = {s["state"]["snapshot"] for s in pool["states"].values()}
    if live.exists():
        for image, host in ((x, None) if isinstance(x, str) else x for x in json.loads(live.read_text())):
            if image not in owned:
                C.remove_image(image, host)
    for sid, s in list(pool["states"].items()):
        try:  # an engine that is not among this run's hosts cannot fork it either
            if s["state"].get("host") not in C.HOSTS.live():
                raise C.EnvError("its engine is not among --docker-hosts")
            C.docker_client(s["state"].get("host")).images.get(s["state"]["snapshot"])
            C.HOSTS.note(s["state"]["snapshot"], s["state"].get("host"))
        except Exception:
            del pool["states"][sid]
    _write_live(out, pool)


# ── rollouts ──────────────────────────────────────────────────────────────────────────────────────


def collect(step: int, cfg: Config, pool: dict, tasks: dict, engine, rcfg: C.RolloutConfig):
    """One step's groups: [(kind, key, category, episodes)], rollout stats, failure states added."""
    rng = random.Random(f"{cfg.seed}-{step}")
    n_fresh = cfg.batch_states if cfg.mode == "standard" else round(cfg.batch_states * cfg.fresh_frac)
    picked = sample_by_mastery(sorted(pool["states"]), pool["hist"], cfg.batch_states - n_fresh,
                               cfg.floor, rng)
    n_fresh = cfg.batch_states - len(picked)  # an exhausted pool is topped up with fresh groups
    fresh = sample_by_mastery(sorted(tasks), pool["hist"], n_fresh, cfg.floor, rng)
    fresh = [fresh[i % len(fresh)] for i in range(n_fresh)] if fresh else []
    # Forks and fresh attempts share one pool of container slots: no group waits for another.
    tok, snap = engine.tokenizer, "failed" if cfg.mode == "fork" else "none"
    states = [C.FailureState(**pool["states"][k]["state"]) for k in picked]
    jobs = [(("fork", s.id, s.category), C.recovery_attempt(tasks[s.task], s, tok, rcfg), s.snapshot)
            for s in states for _ in range(cfg.group_size)]
    jobs += [(("fresh", t, "fresh", i), C.first_attempt(tasks[t], tok, rcfg), None)
             for i, t in enumerate(fresh) for _ in range(cfg.group_size)]
    with C.RolloutPool(engine, rcfg, not cfg.no_internet) as rollouts:
        for _, ep, image in jobs:
            rollouts.submit(ep, image, snapshot="none" if image else snap)
        for _ in rollouts.completed():
            pass
    by_tag = collections.defaultdict(list)  # groups in submission order: the step is reproducible
    for tag, ep, _ in jobs:
        by_tag[tag].append(ep)
    stats, added, errors, groups = rollouts.stats(), 0, 0, []
    for (kind, key, cat, *_), g in by_tag.items():
        errors += sum(ep.error is not None for ep in g)  # an environment failure says nothing of the policy
        groups.append((kind, key, cat, [ep for ep in g if ep.error is None]))
        for ep in (ep for ep in g if kind == "fresh" and ep.snapshot):
            state = C.FailureState.from_episode(ep, f"step{step}")
            if state.id in pool["states"]:  # the very same failed attempt: one image is enough
                C.remove_image(ep.snapshot)
            elif not fits(state, tasks, tok, rcfg, cfg.min_recovery_tokens):
                C.remove_image(ep.snapshot)
                pool["skipped_long"] = pool.get("skipped_long", 0) + 1
            else:  # a new failure of the current policy
                pool_add(pool, state, ep.snapshot, step)
                added += 1
    stats["env_errors"] = errors
    stats["states_lost"] = pool_drop_lost(pool)
    stats |= {k: C.HOSTS.counts[k] for k in ("moves", "move_s", "hosts_lost") if C.HOSTS.counts[k]}
    for _, key, _, g in (x for x in groups if x[3]):
        pool["hist"].setdefault(key, []).append(sum(ep.reward >= 1.0 for ep in g) / len(g))
    return groups, dict(stats), added


def group_rows(groups: list, use_std: bool) -> list[dict]:
    rows = []
    for _, _, _, g in groups:
        adv = group_advantages([ep.reward for ep in g], use_std)
        rows += [{"trace": ep.trace, "adv": a.item()} for ep, a in zip(g, adv, strict=True)]
    return rows


def step_metrics(groups: list, dropped: int, pool: dict) -> dict:
    eps = [ep for _, _, _, g in groups for ep in g]
    by = collections.defaultdict(list)
    for kind, _, cat, g in groups:
        if kind == "fork":
            by[cat] += [ep.reward for ep in g]
    fork = [x for v in by.values() for x in v]
    fresh = [ep.reward >= 1.0 for kind, _, _, g in groups if kind == "fresh" for ep in g]
    return {"reward": sum(ep.reward for ep in eps) / max(1, len(eps)),
            "recovery": C.recovery_rate(fork),  # Recovery@1 exactly as stage 05 reports it
            "recovery_by_category": {k: C.recovery_rate(v) for k, v in sorted(by.items())},
            "fresh_pass": sum(fresh) / len(fresh) if fresh else None,
            "groups": len(groups), "groups_dropped": dropped, "pool": len(pool["states"]),
            "pool_skipped_long": pool.get("skipped_long", 0)}


# ── training ──────────────────────────────────────────────────────────────────────────────────────


def micro_batches(rows: list[dict], micro_tokens: int, world: int) -> list[list[dict]]:
    """Rows sorted by length, cut into micro-batches of ≤ micro_tokens padded tokens, padded with
    empty (mask 0) batches to a multiple of the world size so every rank runs the same count."""
    out, cur = [], []
    for r in sorted(rows, key=lambda r: len(r["trace"])):
        if cur and len(r["trace"]) * (len(cur) + 1) > micro_tokens:
            out.append(cur)
            cur = []
        cur.append(r)
    out += [cur] if cur else []
    while len(out) % world:
        t = out[0][0]["trace"]
        out.append([{"trace": C.TokenTrace(t.ids[:8], t.logprobs[:8], [0] * len(t.ids[:8])), "adv": 0.0}])
    return out


def _to(b: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()}


def train_on_batch(model, optimizer, rows: list[dict], cfg: Config, device, pad_id: int,
                   ref_model=None, rank: int = 0, world: int = 1) -> dict:
    """cfg.updates optimizer steps over `rows` ({"trace": TokenTrace, "adv": float}); every rank
    passes the same rows. π_old = this model's logprobs before the first update."""
    order = list(range(len(rows)))
    random.Random(len(rows)).shuffle(order)
    minis = [[rows[i] for i in order[k::cfg.updates]] for k in range(cfg.updates)]
    minis = [micro_batches(m, cfg.micro_tokens, world) for m in minis if m]
    batches = [[C.collate([r["trace"] for r in mb], pad_id) | {"adv": torch.tensor([r["adv"] for r in mb])}
                for i, mb in enumerate(m) if i % world == rank] for m in minis]
    with torch.no_grad():
        for b in (b for m in batches for b in m):
            if cfg.updates > 1:  # later minibatches are off-policy: keep π_old from before any update
                b["old"] = C.token_logprobs(model, _to(b, device)).cpu()
            if ref_model is not None:
                b["ref"] = C.token_logprobs(ref_model, _to(b, device)).cpu()
    acc = collections.Counter()
    for m, mb_rows in zip(batches, minis, strict=True):
        n_tok = sum(sum(r["trace"].mask) for mb in mb_rows for r in mb)
        for b in m:
            b = _to(b, device)
            mask = b["loss_mask"].bool()
            logp = C.token_logprobs(model, b)
            old = b["old"] if "old" in b else logp.detach()
            w = truncated_is_weight(old, b["logprobs"], cfg.is_cap) if cfg.is_cap > 0 else None
            loss = clipped_policy_loss(logp, old, b["adv"], mask, cfg.eps_low, cfg.eps_high, w)
            if ref_model is not None:
                kl = torch.where(mask, k3_kl(logp, b["ref"]), 0.0).sum() / mask.sum().clamp(min=1)
                loss = loss + cfg.kl_beta * kl
            n = mask.sum().item()
            # Σ_batch mask·ℓ / Σ_batch mask over all micro-batches; × world because FSDP averages ranks
            (loss * n / max(n_tok, 1) * world).backward()
            with torch.no_grad():
                ratio = torch.exp(logp - old)
                adv = b["adv"][:, None].expand_as(ratio)
                clipped = ((ratio < 1 - cfg.eps_low) & (adv < 0)) | ((ratio > 1 + cfg.eps_high) & (adv > 0))
                stats = {"clip_frac": clipped, "approx_kl": k3_kl(logp, old), "entropy": -old,
                         "mismatch_kl": k3_kl(b["logprobs"], old), "is_weight": ratio if w is None else w}
                for k, v in stats.items():
                    acc[k] += torch.where(mask, v.float(), 0.0).sum().item()
                acc["loss"] += loss.item() * n
                acc["tokens"] += n
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        gnorm = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
        acc["grad_norm"] += float(gnorm) / len(batches)
    keys = ("loss", "clip_frac", "approx_kl", "entropy", "mismatch_kl", "is_weight")
    tot = {k: C.all_reduce_sum(acc[k]) for k in (*keys, "tokens")}
    n = max(tot["tokens"], 1)
    return {k: tot[k] / n for k in keys} | {"grad_norm": acc["grad_norm"], "train_tokens": int(tot["tokens"])}


def push_weights(model, engine) -> None:
    """Gather the full state dict (a collective: every rank calls) and load it into rank 0's engine."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if engine is not None:
        engine.update_weights(sd.items())


# ── main ──────────────────────────────────────────────────────────────────────────────────────────


def main(argv: list[str] | None = None) -> Path:
    cfg = C.parse_config(Config, argv)
    if cfg.mode not in ("fork", "standard"):
        raise SystemExit(f"--mode {cfg.mode!r}: choose fork or standard")
    if cfg.mode == "fork" and not cfg.failures and cfg.fresh_frac <= 0:
        raise SystemExit("--mode fork needs --failures FILE (stage 03) or --fresh-frac > 0")
    rank, world, device = C.init_distributed()
    out = Path(cfg.out)
    if rank == 0:
        C.dump_config(cfg, out)
    torch.manual_seed(cfg.seed)
    tok = C.load_tokenizer(cfg.model)
    model = C.load_model(cfg.model).to(device)
    gpu = device.type == "cuda"
    if world > 1:
        C.shard_model(model, mixed_precision=gpu)
    ref = C.load_model(cfg.model).to(device).eval().requires_grad_(False) if cfg.kl_beta > 0 else None
    if ref is not None and world > 1:
        C.shard_model(ref, mixed_precision=gpu)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    extra = C.load_checkpoint(out / "ckpt", model, opt)
    start, env_total = (extra["step"], extra["env_steps"]) if extra else (0, 0)
    engine = pool = None
    tasks = {t.name: t for t in C.load_tasks(cfg.tasks, None, cfg.sample, cfg.sample_skip, cfg.split_seed)}
    scaffold = C.load_scaffold(cfg.model, max_tokens=cfg.max_tokens, max_turns=cfg.max_turns,
                               max_context=cfg.max_context, command_timeout=cfg.command_timeout)
    # the engine is seeded; sampling.max_tokens comes from the scaffold
    rcfg = C.rollout_config(scaffold, C.SamplingConfig(cfg.temperature, 1.0), cfg.concurrency,
                            cfg.timeout_multiplier)
    with C.env_session():
        if rank == 0:  # the only rank that talks to Docker engines
            C.use_docker_hosts(cfg.docker_hosts)
            pool = extra["pool"] if extra else init_pool(cfg, out, tasks, tok, rcfg)
            _gc_orphans(out, pool)
            if cfg.mode == "fork" and cfg.failures and not extra and not pool["states"]:
                raise C.UserError(f"--mode fork: no usable failure state in {cfg.failures} (none for these "
                                  "tasks, or their snapshot images are gone); collect some with stage 03, or "
                                  "drop --failures and pass --fresh-frac > 0 to find failures on the way")
            C.log0(f"{cfg.mode}: pool {len(pool['states'])} states, {len(tasks)} tasks, B={cfg.batch_states} "
                   f"G={cfg.group_size}, " + (f"resumed after step {start}" if extra else "from scratch"))
            kw = {"max_model_len": scaffold.max_context, "seed": cfg.seed, "gpu_memory_utilization":
                  cfg.gpu_memory_utilization, "enable_sleep_mode": gpu and cfg.sleep,
                  "in_process": world == 1} if cfg.engine == "vllm" else {}
            engine = C.make_engine(cfg.engine, cfg.model, dtype=cfg.dtype, **kw)
        sleeps = isinstance(engine, C.VLLMEngine) and gpu and cfg.sleep  # rank 0 only: it owns the engine
        if extra:
            push_weights(model, engine)  # the engine starts from the checkpoint's weights
        done = saved = start
        for step in range(start + 1, cfg.steps + 1):
            if cfg.env_step_budget and env_total >= cfg.env_step_budget:
                C.log0(f"environment-step budget {cfg.env_step_budget} spent after step {step - 1}")
                break
            done = step
            t0 = time.monotonic()
            msg = [None]
            if rank == 0:
                groups, stats, added = collect(step, cfg, pool, tasks, engine, rcfg)
                kept, dropped = drop_uniform_groups([g for *_, g in groups])
                keep_ids = {id(g) for g in kept}
                row = step_metrics(groups, dropped, pool) | {"added": added, **stats}
                msg = [(group_rows([x for x in groups if id(x[3]) in keep_ids], cfg.adv_std), row)]
                if sleeps:
                    engine.llm.sleep(level=1)
            if world > 1:
                torch.distributed.broadcast_object_list(msg, src=0)
            rows, row = msg[0]
            t1 = time.monotonic()
            if rows:
                model.train()
                row |= train_on_batch(model, opt, rows, cfg, device, tok.pad_token_id, ref, rank, world)
            if sleeps:
                engine.llm.wake_up()
            push_weights(model, engine)
            t2 = time.monotonic()
            env_total += row.get("env_steps", 0)
            n_tok = row.get("gen_tokens", 0) + row.get("train_tokens", 0)
            row |= {"step": step, "rollout_s": round(t1 - t0, 2), "train_s": round(t2 - t1, 2),
                    "tokens_per_s": round(n_tok / (t2 - t0)), "env_steps_total": env_total}
            if rank == 0:
                row |= {"retired": len(pool_prune(pool, cfg)), "pool": len(pool["states"])}
                C.append_jsonl(out / "metrics.jsonl", row)
                _write_live(out, pool)
                rec = "-" if row["recovery"] is None else f"{row['recovery']:.3f}"
                fit = (f"clip {row['clip_frac']:.3f} | kl {row['approx_kl']:.2e} | ent {row['entropy']:.2f}"
                       if rows else "no update (every group uniform)")
                C.log0(f"step {step:4d} | reward {row['reward']:.3f} | recovery {rec} | dropped "
                       f"{row['groups_dropped']}/{row['groups']} | {fit} | {row['tokens_per_s']:.0f} tok/s | "
                       f"roll {row['rollout_s']:.1f}s train {row['train_s']:.1f}s | pool {row['pool']}")
            if step % cfg.save_every == 0:
                C.save_checkpoint(out / "ckpt", model, opt,
                                  {"step": step, "env_steps": env_total, "pool": pool})
                saved = step
        if done > saved:  # the last step, or the one the environment-step budget stopped at
            C.save_checkpoint(out / "ckpt", model, opt, {"step": done, "env_steps": env_total, "pool": pool})
        final = C.export_hf(model, tok, out / "final")
        if rank == 0:  # trained under this scaffold: stage 05 evaluates under it too
            scaffold.save(final)
        if rank == 0 and not cfg.keep_pool:
            for s in pool["states"].values():
                C.remove_image(s["state"]["snapshot"])
    C.log0(f"saved {final}")
    if world > 1:
        C.teardown_distributed()
    return final


if __name__ == "__main__":
    C.run_main(main)
