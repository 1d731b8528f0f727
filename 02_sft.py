"""Stage 02 — SFT cold start on ReTerm-10K recovery demonstrations.

Each row is a failed first attempt (context) followed by the successful recovery attempt; the
loss covers only the recovery attempt's assistant tokens, tokenised by the same function the RL
rollout uses, so SFT and GRPO see identical tokens. The loop is hand-written: AdamW, warmup +
cosine, gradient accumulation, clipping, bf16 on GPU, FSDP2 under torchrun, exact resume.

    torchrun --nproc_per_node 8 02_sft.py --data reterm10k.jsonl --model Qwen/Qwen3.5-9B --out runs/sft
    python 02_sft.py --data rows.jsonl --model SMALL_MODEL --out runs/sft   # one GPU or CPU

One process cannot hold 9B: fp32 weights, gradients and AdamW state take 16 bytes per parameter
(143 GB) before any activation; 8 ranks shard them (bench/memory_plan.py has the per-GPU plan).

Batching rule (--batching auto): on GPU, rows are packed best-fit into one sequence of
--micro-batch-tokens tokens, which needs the varlen kernels: flash-attn for full attention,
flash-linear-attention and causal-conv1d for Qwen3.5's linear attention (without them its torch
fallback runs across row boundaries). Whether the loaded model's layers actually call them is read
from the functions those layers bind; a missing one stops the run with the two ways out (install
it, or --batching pad). On CPU (where a packed sequence is one dense block-diagonal attention,
quadratic in the budget) rows of similar length are padded together into micro-batches of the
same budget.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import hashlib
import json
import math
import multiprocessing
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import common as C


@dataclasses.dataclass(kw_only=True)
class Config:
    """SFT cold start (ReTerm stage 02). Defaults are our choices for a paper-scale run (8 GPUs): the
    paper's hyper-parameters are not public. torchtitan's AdamW defaults: weight_decay 0.1, beta2
    0.95, grad_clip 1.0. transformers' TrainingArguments: 3 epochs. Guesses: lr 1e-5 (TRL's SFTConfig
    uses 2e-5), warmup, min_lr_ratio (torchtitan decays to 0), grad_accum, save_every, workers;
    max_len and micro_batch_tokens: 32k tokens, room for a long failed attempt and its recovery."""

    data: str  # ReTerm-10K-schema JSONL (id, task_id, messages, train_from_message_index, ...)
    model: str = "Qwen/Qwen3.5-9B"  # base model: local folder or hub name
    out: str = "runs/sft"  # run folder: config.json, metrics.jsonl, ckpt/ (resumed from), final/
    max_len: int = 32768  # tokens per row; longer rows lose context from the left, or are dropped
    micro_batch_tokens: int = 32768  # token budget of one micro-batch (packed row, or rows x width)
    batching: str = "auto"  # auto | pack | pad (auto: pack on GPU with the varlen kernels, see above)
    grad_accum: int = 4  # micro-batches per rank per optimizer step
    epochs: int = 3  # passes over the data (ignored when --max-steps is set)
    max_steps: int = 0  # optimizer steps; 0 = as many as --epochs take
    lr: float = 1e-5  # peak learning rate
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    warmup_steps: int = 30  # linear warmup from 0
    weight_decay: float = 0.1  # AdamW decoupled weight decay
    adam_beta2: float = 0.95  # AdamW beta2 (beta1 0.9)
    grad_clip: float = 1.0  # max global gradient norm
    all_assistant: bool = False  # train on every assistant turn (ordinary trajectories), not just recovery
    activation_checkpointing: bool = True  # recompute each block in backward (long contexts)
    tokenize_workers: int = 8  # processes per rank tokenising rows (used for >= 32 rows per rank)
    save_every: int = 100  # steps between resumable checkpoints (0: only at the end)
    stop_after: int = 0  # end this invocation after N steps with a checkpoint (preemptible jobs); 0 = off
    seed: int = 0  # data order and init RNG
    tensorboard: str = ""  # also write the metrics as TensorBoard events here (needs the tensorboard package)


# ── data ────────────────────────────────────────────────────────────────────

def load_rows(path: str, all_assistant: bool) -> list[dict]:
    """Every row, checked: a bad one is a one-line DataError naming file:line (a torn last line too).

    Returned in an order set by their content (a hash of messages and train index), not by the
    file's: stage 01 writes rows as its threads finish, so two builds of the same rows list them in
    different orders, and the seeded epoch order (epoch_plan) would give each a different run."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: data file does not exist")
    rows = C.read_jsonl(path, strict=True)
    text = Path(path).read_text(errors="replace")
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if line.strip()]
    for line, row in zip(lines, rows, strict=True):
        try:
            C.check_row(row, all_assistant)
        except ValueError as e:
            where = f"{path}:{line}" + (f" (id={row.get('id')!r})" if isinstance(row, dict) else "")
            raise C.DataError(f"{where}: {e}") from None
    return sorted(rows, key=content_key)


def content_key(row: dict) -> str:
    body = json.dumps([row["messages"], row.get("train_from_message_index")], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def scaffold_from_rows(rows: list[dict], base: C.Scaffold) -> tuple[C.Scaffold, str]:
    """The scaffold the rows were written under, for final/scaffold.json: their most common system
    prompt, and their recovery turn with the row's task put back as {instruction} (imported ReTerm-10K
    rows bring their own); `base` (the base model's) for whatever the rows don't carry."""
    prompts, templates = collections.Counter(), collections.Counter()
    for r in rows:
        msgs, i = r["messages"], r.get("train_from_message_index") or 0
        if msgs[0]["role"] == "system":
            prompts[msgs[0]["content"]] += 1
        task = next((m["content"] for m in msgs if m["role"] == "user"), "")
        rec = msgs[i - 1] if i > 2 else {}
        if rec.get("role") == "user" and task and task in rec["content"] and rec["content"] != task:
            templates[rec["content"].replace(task, "{instruction}")] += 1
    s = dataclasses.replace(base)
    if prompts:
        s.system_prompt = prompts.most_common(1)[0][0]
    if templates:
        s.recovery_prompt = templates.most_common(1)[0][0]
    how = (f"system prompt of {prompts.most_common(1)[0][1]}/{len(rows)} rows ({len(prompts)} distinct)"
           if prompts else "no system prompt in the rows: the base model's")
    how += (f", recovery message of {sum(templates.values())} rows" if templates
            else ", the base model's recovery message")
    return s, how


def fit(trace: C.TokenTrace, max_len: int) -> C.TokenTrace | None:
    """Keep the last max_len tokens when only context (mask 0) is cut; None when the trained span
    alone is longer than max_len (the row is dropped)."""
    if len(trace) <= max_len:
        return trace
    if len(trace) - trace.mask.index(1) > max_len:
        return None
    cut = len(trace) - max_len
    return C.TokenTrace(trace.ids[cut:], trace.logprobs[cut:], trace.mask[cut:])


_TOK = None  # the tokenizer, inherited by forked tokenising workers


def tokenize_row(job: tuple) -> tuple:
    """((ids int32, mask int8) or None when dropped, whether it was truncated) for one row."""
    row, max_len, all_assistant = job
    full = C.tokenize_messages(_TOK, row["messages"], row.get("train_from_message_index"),
                               all_assistant=all_assistant)
    t = fit(full, max_len)
    if t is None:
        return None, False
    # numpy, not torch: a tensor returned from a worker comes back as shared memory that holds a file
    # descriptor open in the parent per row (thousands of rows exceed the usual limit of 1024)
    return (np.array(t.ids, dtype=np.int32), np.array(t.mask, dtype=np.int8)), t is not full


def tokenize_rows(cfg: Config, rows: list[dict], tok, out: Path, rank: int, world: int
                  ) -> tuple[list[tuple], dict]:
    """Every row as compact (ids, mask) tensors fitted to --max-len. Rendering chat-template deltas
    costs O(turns^2) on long rows (seconds for a 200-message row), so each rank tokenises every
    world-th row with a process pool, and the shards are cached in the run folder for resumes."""
    global _TOK
    # "content order": shards of a run from before load_rows sorted its rows are not reused
    salt = repr((tok.chat_template, len(tok), cfg.max_len, cfg.all_assistant, "content order"))
    key = hashlib.sha256(Path(cfg.data).read_bytes() + salt.encode()).hexdigest()
    shard = out / f"tokens.{rank}-of-{world}.pt"
    out.mkdir(parents=True, exist_ok=True)
    if not (shard.exists() and torch.load(shard, weights_only=False)["key"] == key):
        _TOK = tok
        jobs = [(rows[i], cfg.max_len, cfg.all_assistant) for i in range(rank, len(rows), world)]
        bar = {"desc": "tokenise", "total": len(jobs), "disable": rank != 0 or len(jobs) < 100}
        workers = min(cfg.tokenize_workers, len(jobs) // 16)
        if workers > 1:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                done = list(tqdm(pool.map(tokenize_row, jobs, chunksize=4), **bar))
        else:
            done = [tokenize_row(j) for j in tqdm(jobs, **bar)]
        done = [((torch.from_numpy(t[0]), torch.from_numpy(t[1])) if t else None, c) for t, c in done]
        torch.save({"key": key, "done": done}, shard)
    C.barrier()
    parts = [torch.load(out / f"tokens.{r}-of-{world}.pt", weights_only=False)["done"] for r in range(world)]
    done = [parts[i % world][i // world] for i in range(len(rows))]
    traces = [t for t, _ in done if t is not None]
    if not traces:
        raise ValueError(f"{cfg.data}: every row was dropped (trained span > --max-len {cfg.max_len})")
    stats = {"rows": len(rows), "truncated": sum(c for _, c in done), "dropped": len(rows) - len(traces),
             "scaffold": scaffold_from_rows(rows, C.load_scaffold(cfg.model))}
    return traces, stats


def as_trace(t: tuple) -> C.TokenTrace:
    ids, mask = t
    return C.TokenTrace(ids.tolist(), [0.0] * len(ids), mask.tolist())


# The functions Qwen3.5's linear-attention layers call (module globals of transformers' modelling
# file; older releases bound them on the layer) and the package that provides each kernel.
LINEAR_KERNELS = {"causal-conv1d": ("causal_conv1d_fn",),
                  "flash-linear-attention": ("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule")}


def linear_attention_layer(model):
    """A linear-attention (Gated DeltaNet) layer of the loaded model, or None (full attention only)."""
    return next((m for m in model.modules() if getattr(m, "layer_type", None) == "linear_attention"), None)


def resolved_kernel(layer, names: tuple[str, ...]):
    """The kernel a linear-attention layer will call for one of `names` (its own attribute, else a
    global of its class's modelling module), unwrapped from transformers' fallback decorator, which
    binds the package's kernel at import or, when that import fails, the torch reference; None when
    the layer would run a torch reference (a function of its own modelling module) or nothing."""
    homes = {c.__module__ for c in type(layer).__mro__}  # a wrapper class (FSDP's) keeps the original's
    places = [layer, *(sys.modules[m] for m in sorted(homes) if m in sys.modules)]
    fn = next((f for n in names for p in places if (f := getattr(p, n, None)) is not None), None)
    free = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    impl = fn.__closure__[free.index("implementation")].cell_contents if "implementation" in free else fn
    return None if impl is None or getattr(impl, "__module__", None) in homes else impl


def leaking_kernels(model) -> list[str]:
    """Packages whose kernels the model's linear-attention layers did NOT load, read from the functions
    those layers will call (not from package metadata: a kernel that fails to import, e.g. an ABI
    mismatch with torch, leaves transformers' torch reference in place). Those references ignore
    cu_seqlens / seq_idx: the convolution and the Gated-DeltaNet recurrence run across the rows of a
    packed sequence, which then see each other. Full attention keeps packed rows apart by itself
    (restarting position_ids: block-diagonal mask for sdpa, varlen for flash-attention)."""
    layer = linear_attention_layer(model)
    if layer is None:
        return []
    return [pkg for pkg, names in LINEAR_KERNELS.items() if resolved_kernel(layer, names) is None]


def packing_supported(model) -> bool:
    """Whether rows packed into one sequence stay invisible to each other: full attention always;
    linear attention only with its CUDA varlen kernels loaded (leaking_kernels) on a GPU."""
    return linear_attention_layer(model) is None or (torch.cuda.is_available() and not leaking_kernels(model))


def missing_kernels(model) -> list[str]:
    """The varlen kernels the GPU path needs that the loaded model does not use: flash-attn (the
    attention implementation it was built with; without it a packed row is SDPA with a materialised
    block-diagonal mask, O(T^2) memory at 32k) and leaking_kernels."""
    types_ = getattr(C.text_config(model), "layer_types", None) or ["full_attention"]
    flash = model.config._attn_implementation == "flash_attention_2"
    return (["flash-attn"] if "full_attention" in types_ and not flash else []) + leaking_kernels(model)


def choose_packing(batching: str, model, gpu: bool) -> bool:
    """--batching: pad; pack (refused when packed rows would leak: leaking_kernels); auto: pad on CPU
    (a packed row is one dense masked attention there), pack on GPU and refuse unless every varlen
    kernel is loaded (missing_kernels): nobody chooses a slow or leaking path without knowing."""
    C.check_choice("--batching", batching, ("auto", "pack", "pad"))
    if batching == "pad" or (batching == "auto" and not gpu):
        return False
    missing = missing_kernels(model) if batching == "auto" else leaking_kernels(model)
    if missing:
        why = "packed rows leak into each other" if leaking_kernels(model) else "SDPA builds a T x T mask"
        them = "them" if len(missing) > 1 else "it"
        raise C.UserError(f"--batching {batching}: this model did not load {', '.join(missing)} "
                          f"(without {them} {why}): pip install --no-build-isolation {' '.join(missing)} "
                          "(versions in requirements.txt) or pass --batching pad")
    return True


def best_fit(lengths: list[int], budget: int, order: list[int]) -> list[list[int]]:
    """Best-fit decreasing: rows, longest first (ties in `order`), each go into the open bin whose
    free space they fill most tightly; a new bin when none fits."""
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (free tokens, bin index)
    for i in sorted(order, key=lambda i: -lengths[i]):
        k = bisect.bisect_left(free, (lengths[i], -1))
        if k == len(free):
            bins.append([i])
            bisect.insort(free, (budget - lengths[i], len(bins) - 1))
        else:
            room, j = free.pop(k)
            bins[j].append(i)
            bisect.insort(free, (room - lengths[i], j))
    return bins


def epoch_plan(lengths: list[int], budget: int, packed: bool, seed: int, epoch: int) -> list[list[int]]:
    """One epoch of micro-batches (lists of row indices) in a seeded random order."""
    rng = random.Random(seed * 100_003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    groups = (best_fit if packed else C.length_buckets)(lengths, budget, order)
    rng.shuffle(groups)
    return groups


def padding_share(groups: list[list[int]], lengths: list[int], budget: int, packed: bool) -> float:
    real = sum(lengths[i] for g in groups for i in g)
    total = len(groups) * budget if packed else sum(len(g) * max(lengths[i] for i in g) for g in groups)
    return 1 - real / total


def lr_lambda(cfg: Config, total: int):
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        p = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(p, 1.0)))
    return f


def sft_loss(model, batch: dict, n_tokens: float, world: int) -> tuple[torch.Tensor, float]:
    """Sum of masked token NLLs / trained tokens of the whole global step. The ×world undoes
    FSDP's averaging of gradients over ranks, so N ranks equal one process on the same batch."""
    mask = batch["loss_mask"]
    nll = -(C.token_logprobs(model, batch) * mask).sum()
    return nll * world / n_tokens, nll.item()


# Dense bf16 tensor-core peak per GPU (vendor datasheets, no sparsity).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "H20": 148e12, "B200": 2250e12,
                   "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L4": 121e12, "A10G": 70e12,
                   "4090": 165e12}


def peak_flops(device: torch.device) -> float | None:
    """The device's bf16 peak FLOP/s, or None (CPU, unknown GPU: MFU is then not reported)."""
    if getattr(device, "type", device) != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def flops_per_token(model: torch.nn.Module, seq_len: float) -> float:
    """Training FLOPs per token: 6 × non-embedding parameters (forward + backward matmuls) plus
    causal attention scores, 6 · heads · head_dim · seq_len per full-attention layer (the
    PaLM/nanoGPT estimate; linear-attention layers count through their parameters only)."""
    cfg = C.text_config(model)
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    n = sum(p.numel() for p in model.parameters()) - emb.numel() + (head.numel() if head is emb else 0)
    types_ = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 6 * n + 6 * types_.count("full_attention") * cfg.num_attention_heads * head_dim * seq_len


# ── main ────────────────────────────────────────────────────────────────────


def build_model(cfg: Config, device, world: int) -> tuple:
    """The model to train (FSDP2-sharded under torchrun, built on the meta device and filled from one
    read of the checkpoint), whether its micro-batches are packed rows (choose_packing), and its
    optimizer."""
    gpu = device.type == "cuda"
    model = C.load_model_sharded(cfg.model, device, world, mixed_precision=gpu,
                                 activation_checkpointing=cfg.activation_checkpointing)
    model.config.use_cache = False
    packed = choose_packing(cfg.batching, model, gpu)
    if not packed:
        C.log0(f"batching: padding rows ({'--batching pad' if gpu else 'CPU'}); "
               f"attention: {model.config._attn_implementation}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, cfg.adam_beta2),
                                  weight_decay=cfg.weight_decay)
    return model, packed, optimizer


def make_plan(cfg: Config, lengths: list[int], packed: bool, world: int) -> tuple[list[list[int]], int]:
    """A flat list of micro-batches over epochs, and the number of steps. Step s takes world x
    grad_accum of them and rank r every world-th, so the global batch doesn't depend on the world size."""
    per_step = world * cfg.grad_accum
    plan = epoch_plan(lengths, cfg.micro_batch_tokens, packed, cfg.seed, 0)
    total = cfg.max_steps or max(1, cfg.epochs * len(plan) // per_step)
    epoch = 0
    while len(plan) < total * per_step:
        epoch += 1
        plan += epoch_plan(lengths, cfg.micro_batch_tokens, packed, cfg.seed, epoch)
    return plan, total


def resume(out: Path, model, optimizer, scheduler, cfg: Config, world: int) -> int:
    """The step to start from: the checkpoint's (same world x grad_accum), with its RNG states."""
    extra = C.load_checkpoint(out / "ckpt", model, optimizer)
    if extra is None:
        return 0
    if (extra["world"], extra["grad_accum"]) != (world, cfg.grad_accum):
        raise C.UserError(f"{out / 'ckpt'}: saved with world x grad_accum {extra['world']} x "
                          f"{extra['grad_accum']}; resume with the same")
    scheduler.load_state_dict(extra["scheduler"])
    torch.set_rng_state(extra["torch_rng"])
    random.setstate(extra["py_rng"])
    C.log0(f"resumed from {out / 'ckpt'} at step {extra['step']}")
    return extra["step"]


def train_step(model, optimizer, scheduler, batches: list[dict], cfg: Config, device, world: int) -> dict:
    """One optimizer step over this rank's micro-batches: Σ masked NLL / the step's trained tokens."""
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    n_tokens = C.all_reduce_sum(sum(b["loss_mask"].sum().item() for b in batches))
    nll = 0.0
    # FSDP reduce-scatters after every micro-batch, and the sharded fp32 gradients accumulate: skipping
    # the sync until the last one would keep an unsharded fp32 gradient of the whole model between
    # micro-batches (~36 GB per rank at 9B). One more reduce-scatter per 32k-token micro-batch is cheap.
    for b in batches:
        b = {key: v.to(device) if torch.is_tensor(v) else v for key, v in b.items()}
        with autocast:
            loss, part = sft_loss(model, b, n_tokens, world)
        loss.backward()
        nll += part
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": C.all_reduce_sum(nll) / n_tokens, "lr": lr, "grad_norm": grad_norm.item(),
            "trained_tokens": n_tokens}


def main(argv: list[str] | None = None) -> Path:
    cfg = C.parse_config(Config, argv)
    C.check_tensorboard(cfg.tensorboard)
    rank, world, device = C.init_distributed()
    out = Path(cfg.out)
    if cfg.micro_batch_tokens < cfg.max_len:
        raise C.UserError(f"--micro-batch-tokens {cfg.micro_batch_tokens} must be >= --max-len {cfg.max_len}")
    rows = load_rows(cfg.data, cfg.all_assistant)  # before anything is written: refused input leaves nothing
    tok = C.load_tokenizer(cfg.model)  # FileNotFoundError naming a missing model path
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        C.dump_config(cfg, out)
    C.barrier()
    traces, stats = tokenize_rows(cfg, rows, tok, out, rank, world)
    lengths = [len(ids) for ids, _ in traces]
    torch.manual_seed(cfg.seed)
    model, packed, optimizer = build_model(cfg, device, world)
    flops_tok, peak = flops_per_token(model, sum(lengths) / len(lengths)), peak_flops(device)
    plan, total = make_plan(cfg, lengths, packed, world)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total))
    step = start = resume(out, model, optimizer, scheduler, cfg, world)
    per_step, first = world * cfg.grad_accum, epoch_plan(lengths, cfg.micro_batch_tokens, packed, cfg.seed, 0)
    C.log0(f"{stats['rows']} rows -> {len(traces)} trained ({stats['truncated']} truncated from the left, "
           f"{stats['dropped']} dropped: trained span > {cfg.max_len}); "
           f"{'packed best-fit' if packed else 'length-bucketed padding'} into "
           f"{cfg.micro_batch_tokens}-token micro-batches, padding "
           f"{padding_share(first, lengths, cfg.micro_batch_tokens, packed):.1%}; "
           f"{total} steps x {per_step} micro-batches on {world} x {device.type}")
    model.train()
    bar = tqdm(total=total, initial=step, disable=rank != 0, desc="sft", file=sys.stdout)
    tensorboard = C.tensorboard_writer(cfg.tensorboard) if rank == 0 else None
    while step < total:
        t0 = time.perf_counter()
        groups = plan[step * per_step + rank:(step + 1) * per_step:world]
        batches = [C.collate([as_trace(traces[i]) for i in g], tok.pad_token_id, packed,
                             width=cfg.micro_batch_tokens if packed else None) for g in groups]
        metrics = {"step": step + 1} | train_step(model, optimizer, scheduler, batches, cfg, device, world)
        step += 1
        seen = C.all_reduce_sum(sum(lengths[i] for g in groups for i in g))  # real (non-pad) tokens
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        metrics |= {"tokens": seen, "tokens_per_s": seen / dt, "seconds": dt,
                    "mfu": flops_tok * seen / dt / (peak * world) if peak else None, "peak_mem_gib":
                    torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None}
        if rank == 0:
            C.append_jsonl(out / "metrics.jsonl", metrics)
            C.log_scalars(tensorboard, metrics)
            mfu = f" | mfu {metrics['mfu']:.1%}" if peak else ""
            bar.write(f"step {step}/{total} | loss {metrics['loss']:.4f} | lr {metrics['lr']:.2e} | "
                      f"grad-norm {metrics['grad_norm']:.3f} | tok/s {metrics['tokens_per_s']:,.0f}{mfu}")
            bar.update(1)
        stop = cfg.stop_after and step - start >= cfg.stop_after and step < total
        if (cfg.save_every and step % cfg.save_every == 0) or step == total or stop:
            state = {"scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
                     "py_rng": random.getstate()}
            C.save_checkpoint(out / "ckpt", model, optimizer,
                              {"step": step, "world": world, "grad_accum": cfg.grad_accum, **state})
        if stop:
            C.log0(f"stopping after {cfg.stop_after} steps; rerun with the same --out to resume")
            C.teardown_distributed()
            return out / "ckpt"
    bar.close()
    final = C.export_hf(model, tok, out / "final", dtype=torch.bfloat16 if device.type == "cuda" else None)
    if rank == 0:  # the scaffold it was trained under travels with the weights (stages 03-05 load it)
        scaffold, how = stats["scaffold"]
        scaffold.save(final)
        C.log0(f"scaffold.json: {how}")
    C.log0(f"saved {final}")
    C.teardown_distributed()
    return final


if __name__ == "__main__":
    C.run_main(main)
