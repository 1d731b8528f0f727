"""Memory plan: per-GPU peak memory of 02 (SFT) and of 04's three phases (training; weight push;
rollout), computed from the real model config on the meta device (exact parameter counts, no
weights read) and from the stages' own settings (read from 02's and 04's Config defaults; flags
override them).

    python bench/memory_plan.py --model qwen3.5-9b --gpus 8 --gpu-gb 80 [--json]
    python bench/memory_plan.py --model runs/sft/final --gpus 8      # this machine's GPU size

--model is a local model folder (its config.json) or the built-in `qwen3.5-9b`, the text config of
Qwen/Qwen3.5-9B as its public model card gives it (no hub at run time). --gpu-gb defaults to the
total memory this machine's GPU reports (an H100 ~85.0 GB, an H200 ~150 GB), else 80. With --json
the last line is {"sft_peak_gb", "grpo_train_peak_gb", "grpo_rollout_peak_gb", "push_peak_gb",
"kv_contexts_per_rank", "slots_per_rank", "gpu_gb", "fits"} (GB = 1e9 bytes).

What the plan models (the code as it runs under torchrun on GPUs):
  state      fp32 master parameters, fp32 gradients and AdamW's two fp32 moments, all sharded by
             FSDP2 over the ranks (02 and 04 reduce-scatter every micro-batch, so no unsharded
             fp32 gradient outlives one); a single process holds them whole.
  gathered   bf16 copies FSDP all-gathers: the root (embeddings, final norm, lm_head) for the whole
             step, two decoder blocks at a time (the current one and the prefetched next), the
             block's unsharded bf16 gradient and its fp32 copy for the reduce-scatter; at the end
             of backward the root's gradient, its fp32 copy and the reduce-scatter's output.
  activations  with activation checkpointing each block's input (tokens x hidden) plus, during
             one block's backward, that block's recomputed activations and their gradients
             (ACTIVATION_ELEMENTS, per token, measured on CPU from the same transformers code;
             the norms' fp32 internals at 4 bytes on GPU, NORM_FP32); without it every block's.
             The chunked lm_head (common.token_logprobs) holds chunk x vocab logits in a few fp32
             copies (HEAD_COPIES, measured).
  04 rollout vLLM's pool (gpu_memory_utilization x the GPU: bf16 weights, its activations, its CUDA
             graphs, KV cache) beside what FSDP keeps while the engine runs (parameters + Adam,
             sharded). kv_contexts_per_rank: full --max-context sequences the KV cache holds, against
             slots_per_rank, the rank's share of --concurrency (a warning when below: vLLM then
             preempts and recomputes near full context).
  04 push    vLLM's weights awake (KV cache still asleep), FSDP's parameters + Adam, one parameter
             gathered in bf16 at a time.
  04 train   as 02 at 04's micro_tokens, vLLM asleep at level 2 (weights discarded, KV freed).
  --kl-beta > 0 adds the frozen reference in every phase: its fp32 shards and its root, left
             unsharded by its no-grad forward (--updates > 1 adds nothing: see reference_bytes).
`fits`: every peak plus OVERHEAD_GB (CUDA context, NCCL buffers, allocator fragmentation: a guess)
is within --gpu-gb, and vLLM's pool holds at least one --max-context sequence.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common as C  # noqa: E402

GB = 1e9
# Qwen/Qwen3.5-9B's text model (config.json's text_config on the public model card; the vision
# tower is not trained here). 32 layers, every 4th full attention (gated, 16 heads of 256, 4 KV
# heads), the rest Gated DeltaNet (16 key heads, 32 value heads of 128); 248,320-token vocabulary,
# untied lm_head.
QWEN35_9B = {
    "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 32, "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 8,
    "full_attention_interval": 4, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
    "attn_output_gate": True, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
    "tie_word_embeddings": False, "mamba_ssm_dtype": "float32",
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_interleaved": True, "mrope_section": [11, 11, 10]},
}
BUILTIN = {"qwen3.5-9b": QWEN35_9B}

# Live elements per token while one block runs its backward (its recomputed activations and their
# gradients), as linear coefficients of the block's widths. Measured here on CPU (fp32, MemTracker)
# from transformers' Qwen3.5 blocks at 1-2k tokens: exactly linear in tokens; the MLP + norms
# + residual part is 4 x hidden + 7 x intermediate; full attention adds 8 per query element
# (gated q) and 4.25 per key/value element; Gated DeltaNet (its torch fallback) adds 4 per key
# element, 13 per (expanded key + value) element and 202 per value head (the chunk matrices).
# On GPU the same elements count 2 bytes (bf16 autocast), and flash-attn / flash-linear-attention
# are assumed to keep no more than these fallbacks, plus fla's per-chunk recurrent states (value
# heads x dk x dv / 64 fp32 per token): unmeasured until bench/gpu_check.py runs on a GPU.
ACTIVATION_ELEMENTS = {"hidden": 4.0, "intermediate": 7.0, "q": 8.0, "kv": 4.25,
                       "lin_key": 4.0, "lin_expanded": 13.0, "lin_head": 202.0}
# fp32 elements a norm keeps for its backward, per element of its width, when its input is bf16
# (measured here with saved_tensors_hooks on transformers' Qwen3.5 modules in bf16): RMSNorm upcasts
# its input and keeps it and the normalised product (8 bytes), the gated norm of Gated DeltaNet
# also its gate and silu(gate) (12 bytes). The coefficients above count them at 2 bytes on GPU.
NORM_FP32 = {"rms": 2.0, "gated": 3.0}
HEAD_COPIES = 4.25  # fp32 copies of one chunk's logits live at once (measured on CPU: 4.25)
HEAD_CHUNK = 1024  # common.token_logprobs' default chunk
OVERHEAD_GB = 3.0  # CUDA context (~0.5-1), NCCL buffers, allocator fragmentation: a guess
# vLLM 0.33 captures CUDA graphs (04 does not pass enforce_eager on GPU) and charges their memory
# against its own gpu_memory_utilization budget; the engine's start-up log prints the figure.
VLLM_CUDA_GRAPH_GB = 1.5  # a guess for 9B at vLLM's default capture sizes
VLLM_ASLEEP_GB = VLLM_CUDA_GRAPH_GB + 0.5  # level-2 sleep keeps the graphs' pools and allocator state
VLLM_RESERVE_GB = 2.0  # vLLM's own activations + sampler at its default batch limits: a guess


@dataclasses.dataclass
class Shape:
    params: int  # all trainable parameters
    root: int  # embeddings + final norm + lm_head (FSDP's root unit)
    block_max: int  # the largest decoder block
    layers: list[str]  # layer types
    hidden: int
    intermediate: int
    vocab: int
    q: int  # query width, heads x head_dim (the measured coefficient includes Qwen3.5's output gate)
    kv: int  # key/value width of full attention
    lin: dict  # Gated DeltaNet widths: key (nk*dk), expanded (nv*dk + nv*dv), heads (nv), state, value
    kv_bytes_per_token: int  # vLLM's KV cache per token (full-attention layers, bf16)
    seq_state_bytes: int  # linear-attention state per sequence (recurrent fp32 + conv bf16)
    largest: int  # elements of the largest single parameter (the weight push gathers one at a time)


def load_config(spec: str):
    """A built-in name, or a local folder's config (its text config for a multimodal checkpoint)."""
    from transformers import AutoConfig, Qwen3_5TextConfig

    if spec in BUILTIN:
        return Qwen3_5TextConfig(**{k: v for k, v in BUILTIN[spec].items() if k != "model_type"})
    if not Path(spec).is_dir():
        raise C.UserError(f"--model {spec}: not a local folder nor a built-in ({', '.join(BUILTIN)})")
    cfg = AutoConfig.from_pretrained(spec)
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def shape_of(config) -> Shape:
    """Exact parameter counts from the model built on the meta device, and the widths the
    activation and KV-cache terms need."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    params = count(model)
    blocks = [count(b) for b in model.model.layers]
    types_ = list(getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers)
    hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    nk, nv = getattr(config, "linear_num_key_heads", 0), getattr(config, "linear_num_value_heads", 0)
    dk, dv = getattr(config, "linear_key_head_dim", 0), getattr(config, "linear_value_head_dim", 0)
    n_lin, n_full = types_.count("linear_attention"), types_.count("full_attention")
    conv = 2 * nk * dk + nv * dv
    k = getattr(config, "linear_conv_kernel_dim", 4)
    return Shape(params=params, root=params - sum(blocks), block_max=max(blocks), layers=types_,
                 hidden=config.hidden_size, intermediate=config.intermediate_size, vocab=config.vocab_size,
                 q=config.num_attention_heads * hd, kv=config.num_key_value_heads * hd,
                 lin={"key": nk * dk, "expanded": nv * (dk + dv), "heads": nv, "state": nv * dk * dv,
                      "value": nv * dv},
                 kv_bytes_per_token=n_full * 2 * config.num_key_value_heads * hd * 2,
                 seq_state_bytes=n_lin * (nv * dk * dv * 4 + conv * (k - 1) * 2),
                 largest=max(p.numel() for p in model.parameters()))


def block_bytes(s: Shape, kind: str, gpu: bool, fla: bool = True) -> float:
    """Live activation bytes per token during one block's backward (ACTIVATION_ELEMENTS): bf16 on
    GPU, fp32 on CPU; on GPU the norms' fp32 internals (NORM_FP32: the block's two RMSNorms, the
    q/k norms of full attention, Gated DeltaNet's gated norm) at 4 bytes, and Gated DeltaNet's own
    part in fp32 too when flash-linear-attention is missing (transformers' torch fallback computes
    in fp32), else bf16 plus fla's chunk states (fp32)."""
    e, a = ACTIVATION_ELEMENTS, (2 if gpu else 4)
    up = 2 if gpu else 0  # bytes a norm's fp32 element takes beyond the 2 counted for it
    mlp = (e["hidden"] * s.hidden + e["intermediate"] * s.intermediate) * a
    mlp += up * NORM_FP32["rms"] * 2 * s.hidden
    if kind == "full_attention":
        return mlp + (e["q"] * s.q + e["kv"] * s.kv) * a + up * NORM_FP32["rms"] * (s.q + s.kv)
    own = e["lin_key"] * s.lin["key"] + e["lin_expanded"] * s.lin["expanded"] + e["lin_head"] * s.lin["heads"]
    gated_norm = up * NORM_FP32["gated"] * s.lin["value"]
    if gpu and fla:
        return mlp + own * 2 + gated_norm + s.lin["state"] / 64 * 4
    return mlp + own * 4 + gated_norm


def train_peak(s: Shape, *, world: int, tokens: int, gpu: bool, checkpointing: bool = True,
               chunk: int = HEAD_CHUNK, fla: bool = True, kept: int | None = None) -> dict:
    """Per-rank peak bytes of one training step of `tokens` tokens per micro-batch, by term, as the
    maximum over its phases (the lm_head chunks; one block's backward; the optimizer step). `kept`:
    the positions that predict a trained token (default: all); fewer than a chunk shrink the head."""
    mp = gpu and world > 1  # FSDP mixed precision: bf16 compute; a single GPU autocasts fp32 params
    a = 2 if gpu else 4  # bytes per activation element
    c = 2 if mp else 4  # bytes per element of what FSDP gathers (parameters, unsharded gradients)
    up = 4 if mp else 0  # the fp32 copy of a bf16 gradient for the fp32 reduce-scatter
    shard = s.params / world
    state = {"params": 4 * shard, "grads": 4 * shard, "adam": 8 * shard}
    root = c * s.root if world > 1 else 0  # the root gathered (its gradient, once backward starts, too)
    cast_cache = 2 * (s.params - s.root) if gpu and world == 1 else 0  # autocast's bf16 weight copies
    saved = len(s.layers) * tokens * s.hidden * (2 if mp else 4)  # each block's input
    blocks = [block_bytes(s, k, gpu, fla) * tokens for k in s.layers]
    acts = saved + max(blocks) if checkpointing else sum(blocks)
    chunk = min(chunk, kept or tokens)
    # on GPU also the bf16 logits and their fp32 upcast (a no-op for CPU's fp32 logits), and the
    # final norm's fp32 internals
    logits = (HEAD_COPIES * 4 + (2 + 4 if gpu else 0)) * chunk * s.vocab
    head = logits + 3 * tokens * s.hidden * a + (2 * NORM_FP32["rms"] * tokens * s.hidden if gpu else 0)
    fsdp_block = (3 * c + up) * s.block_max if world > 1 else 0  # 2 gathered, its gradient (+ fp32 copy)
    phases = {
        "lm_head chunks": 2 * root + cast_cache + saved + head,
        "block backward": 2 * root + acts + fsdp_block,
        # end of backward (every activation freed): the root's parameters and unsharded gradient,
        # its fp32 copy and the reduce-scatter's fp32 output shard
        "root reduce-scatter": 2 * root + (up + 4 / world) * s.root if world > 1 else 0,
        "optimizer step": 4 * shard if gpu else 0,  # foreach AdamW's full-size intermediate
    }
    phase = max(phases, key=phases.get)
    terms = state | {"phase: " + phase: phases[phase]}
    return {"peak": sum(terms.values()), "terms": terms, "phase": phase}


def reference_bytes(s: Shape, *, world: int, kl_beta: float) -> dict:
    """What 04 keeps beside the policy in every phase for --kl-beta > 0: the frozen reference, an
    FSDP2 model in fp32 shards whose root (embeddings, lm_head), gathered in bf16 by a forward
    under no_grad, stays unsharded for good (FSDP2 does not reshard the root after forward and
    reshards it after a backward, which the reference never runs). The policy's own no-grad
    forward (--updates > 1, for pi_old) leaves its root gathered only until its first backward: the
    training phases count that root already."""
    if kl_beta <= 0:
        return {}
    c = 2 if world > 1 else 4
    return {"reference shards": 4 * s.params / world, "reference root left unsharded": c * s.root}


def rollout_peak(s: Shape, *, world: int, gpu_bytes: float, utilization: float, max_context: int,
                 resident: dict | None = None) -> dict:
    """Per-rank bytes while the engine rolls out: vLLM's pool (utilization x the GPU) beside FSDP's
    sharded parameters and Adam moments (gradients are freed by zero_grad) and `resident` (the
    reference), and how many max-context sequences the pool's KV cache holds after the bf16
    weights, vLLM's reserve and its CUDA graphs (charged against the same budget)."""
    pool = utilization * gpu_bytes
    kv = pool - 2 * s.params - (VLLM_RESERVE_GB + VLLM_CUDA_GRAPH_GB) * GB
    per_seq = s.kv_bytes_per_token * max_context + s.seq_state_bytes
    terms = {"vllm pool": pool, "fsdp params + adam": 12 * s.params / world} | (resident or {})
    return {"peak": sum(terms.values()), "terms": terms, "kv_cache": kv,
            "max_context_seqs": int(max(kv, 0) // per_seq)}


def push_peak(s: Shape, *, world: int, resident: dict | None = None) -> dict:
    """Per-rank bytes while the new weights stream into the engine (vLLM's weights awake, its KV
    cache still asleep): vLLM's bf16 weights and what its sleep keeps, FSDP's sharded parameters
    and Adam moments, and one parameter at a time cast to bf16 and gathered (the largest: the
    embeddings or lm_head)."""
    terms = {"vllm weights": 2 * s.params, "vllm asleep": VLLM_ASLEEP_GB * GB,
             "fsdp params + adam": 12 * s.params / world,
             "one gathered tensor": 2 * s.largest * (1 + 1 / world if world > 1 else 1)}
    terms |= resident or {}
    return {"peak": sum(terms.values()), "terms": terms}


class _LiveBytes(TorchDispatchMode):
    """Bytes of every tensor storage alive, counted as ops create them and as they die (weak
    references), with the peak: torch's MemTracker does the same but refuses a module called twice
    in one pass (gradient accumulation runs the model once per micro-batch)."""

    def __init__(self, initial: list[torch.Tensor]):
        super().__init__()
        self.seen: dict[int, int] = {}
        self.now = self.peak = 0
        for t in initial:
            self._add(t)

    def _drop(self, key: int) -> None:
        self.now -= self.seen.pop(key, 0)

    def _add(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self.seen or st.nbytes() == 0 or t.device.type == "meta":
            return
        self.seen[key] = st.nbytes()
        self.now += st.nbytes()
        self.peak = max(self.peak, self.now)
        weakref.finalize(st, self._drop, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t)
        return out


def measure_peaks(fn, device, model, optimizer) -> tuple[float, float]:
    """(allocated, reserved) peak bytes while fn() runs, everything live counted (parameters,
    gradients, optimizer state, activations): the CUDA allocator's statistics on GPU (reserved: what
    its cache held, fragmentation included); on CPU a dispatch mode that follows every tensor storage
    (_LiveBytes), starting from the model's and the optimizer's tensors, both figures that peak."""
    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated()), float(torch.cuda.max_memory_reserved())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    moments = [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
    initial = [*model.parameters(), *model.buffers(), *grads, *moments]
    with _LiveBytes(initial) as live:
        fn()
    return float(live.peak), float(live.peak)


def measure_peak(fn, device, model, optimizer) -> float:
    """The allocated peak of measure_peaks."""
    return measure_peaks(fn, device, model, optimizer)[0]


def stage_defaults() -> dict:
    """The settings 02 and 04 run with by default (their Config dataclasses)."""
    def field(cls, name, fallback):
        f = {f.name: f for f in dataclasses.fields(cls)}.get(name)
        return fallback if f is None or f.default is dataclasses.MISSING else f.default

    sft, grpo = importlib.import_module("02_sft").Config, importlib.import_module("04_reterm_grpo").Config
    return {"sft_tokens": field(sft, "micro_batch_tokens", 32768),
            "sft_checkpointing": field(sft, "activation_checkpointing", True),
            "grpo_tokens": field(grpo, "micro_tokens", 32768),
            "grpo_checkpointing": field(grpo, "activation_checkpointing", True),
            "gpu_memory_utilization": field(grpo, "gpu_memory_utilization", 0.35),
            "max_context": field(grpo, "max_context", None) or C.Scaffold().max_context,
            "concurrency": field(grpo, "concurrency", 64), "kl_beta": field(grpo, "kl_beta", 0.0)}


def plan(s: Shape, *, gpus: int, gpu_gb: float, sft_tokens: int, grpo_tokens: int,
         gpu_memory_utilization: float, max_context: int, sft_checkpointing: bool = True,
         grpo_checkpointing: bool = True, gpu: bool = True, concurrency: int = 64, kl_beta: float = 0.0
         ) -> dict:
    sft = train_peak(s, world=gpus, tokens=sft_tokens, gpu=gpu, checkpointing=sft_checkpointing)
    train = train_peak(s, world=gpus, tokens=grpo_tokens, gpu=gpu, checkpointing=grpo_checkpointing)
    ref = reference_bytes(s, world=gpus, kl_beta=kl_beta)
    for name, b in {"vllm asleep (level 2)": VLLM_ASLEEP_GB * GB, **ref}.items():
        train["peak"] += b
        train["terms"][name] = b
    roll = rollout_peak(s, world=gpus, gpu_bytes=gpu_gb * GB, utilization=gpu_memory_utilization,
                        max_context=max_context, resident=ref)
    push = push_peak(s, world=gpus, resident=ref)
    limit = (gpu_gb - OVERHEAD_GB) * GB
    peaks = [sft["peak"], train["peak"], roll["peak"], push["peak"]]
    fits = max(peaks) <= limit and roll["max_context_seqs"] >= 1
    slots = -(-concurrency // gpus)  # 04's share of --concurrency per rank
    return {"sft": sft, "grpo_train": train, "grpo_rollout": roll, "push": push, "fits": fits,
            "kv_contexts_per_rank": roll["max_context_seqs"], "slots_per_rank": slots}


def report(s: Shape, p: dict, args) -> str:
    lines = [f"{args.model}: {s.params / 1e9:.3f}B parameters ({s.root / 1e9:.3f}B in embeddings + lm_head), "
             f"{len(s.layers)} layers; {args.gpus} x {args.gpu_gb:g} GB",
             f"  02: {args.sft_tokens} tokens/micro-batch; 04: {args.grpo_tokens} tokens/micro-batch, vLLM "
             f"{args.gpu_memory_utilization:g} of the GPU, context {args.max_context}, --concurrency "
             f"{args.concurrency}, --kl-beta {args.kl_beta:g}"]
    for name in ("sft", "grpo_train", "grpo_rollout", "push"):
        r = p[name]
        terms = ", ".join(f"{k} {v / GB:.1f}" for k, v in r["terms"].items())
        lines.append(f"  {name:13s} {r['peak'] / GB:6.1f} GB  ({terms})")
    r = p["grpo_rollout"]
    lines.append(f"  vLLM KV cache {r['kv_cache'] / GB:.1f} GB: {r['max_context_seqs']} sequences of "
                 f"{args.max_context} tokens at once, for {p['slots_per_rank']} container slots per rank; "
                 f"fits (with {OVERHEAD_GB:g} GB overhead): {p['fits']}")
    if p["kv_contexts_per_rank"] < p["slots_per_rank"]:
        lines.append(f"WARNING: the KV cache holds {p['kv_contexts_per_rank']} full contexts per rank, fewer "
                     f"than its {p['slots_per_rank']} slots: near full context vLLM preempts and recomputes; "
                     "raise --gpu-memory-utilization or lower --concurrency")
    return "\n".join(lines)


def device_gb() -> float | None:
    """This machine's GPU memory (GB = 1e9 bytes, as the device reports it), or None without one."""
    return torch.cuda.get_device_properties(0).total_memory / GB if torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> dict:
    d = stage_defaults()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3.5-9b", help="local model folder or built-in name")
    ap.add_argument("--gpus", type=int, default=8, help="ranks (one GPU each)")
    ap.add_argument("--gpu-gb", type=float, default=None,
                    help="memory per GPU, GB (default: this machine's GPU as it reports it, else 80)")
    ap.add_argument("--sft-tokens", type=int, default=d["sft_tokens"], help="02's --micro-batch-tokens")
    ap.add_argument("--grpo-tokens", type=int, default=d["grpo_tokens"], help="04's --micro-tokens")
    ap.add_argument("--gpu-memory-utilization", type=float, default=d["gpu_memory_utilization"], help="04's")
    ap.add_argument("--max-context", type=int, default=d["max_context"], help="04's engine max_model_len")
    ap.add_argument("--concurrency", type=int, default=d["concurrency"], help="04's (all ranks together)")
    ap.add_argument("--kl-beta", type=float, default=d["kl_beta"], help="04's (> 0: a reference model)")
    ap.add_argument("--json", action="store_true", help="last line: the summary as JSON")
    args = ap.parse_args(argv)
    args.gpu_gb = args.gpu_gb or device_gb() or 80.0
    s = shape_of(load_config(args.model))
    p = plan(s, gpus=args.gpus, gpu_gb=args.gpu_gb, sft_tokens=args.sft_tokens, grpo_tokens=args.grpo_tokens,
             gpu_memory_utilization=args.gpu_memory_utilization, max_context=args.max_context,
             sft_checkpointing=d["sft_checkpointing"], grpo_checkpointing=d["grpo_checkpointing"],
             concurrency=args.concurrency, kl_beta=args.kl_beta)
    print(report(s, p, args))
    out = {f"{k}_peak_gb": round(p[k]["peak"] / GB, 1) for k in ("sft", "grpo_train", "grpo_rollout", "push")}
    out |= {"kv_contexts_per_rank": p["kv_contexts_per_rank"], "slots_per_rank": p["slots_per_rank"],
            "gpu_gb": round(args.gpu_gb, 1), "fits": p["fits"]}
    if args.json:
        print(json.dumps(out))
    return out


if __name__ == "__main__":
    C.run_main(main)
