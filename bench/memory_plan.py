"""Memory plan: per-GPU peak memory of 02 (SFT) and of 04's two phases (training; rollout), computed
from the real model config on the meta device (exact parameter counts, no weights read) and from
the stages' own settings (read from 02's and 04's Config defaults; flags override them).

    python bench/memory_plan.py --model qwen3.5-9b --gpus 8 --gpu-gb 80 [--json]
    python bench/memory_plan.py --model runs/sft/final --gpus 8 --gpu-gb 141

--model is a local model folder (its config.json) or the built-in `qwen3.5-9b`, the text config of
Qwen/Qwen3.5-9B as its public model card gives it (no hub at run time). With --json the last line
is {"sft_peak_gb", "grpo_train_peak_gb", "grpo_rollout_peak_gb", "gpu_gb", "fits"} (GB = 1e9 bytes).

What the plan models (the code as it runs under torchrun on GPUs):
  state      fp32 master parameters, fp32 gradients and AdamW's two fp32 moments, all sharded by
             FSDP2 over the ranks (02 and 04 reduce-scatter every micro-batch, so no unsharded
             fp32 gradient outlives one); a single process holds them whole.
  gathered   bf16 copies FSDP all-gathers: the root (embeddings, final norm, lm_head) for the whole
             step, two decoder blocks at a time (the current one and the prefetched next), the
             block's unsharded bf16 gradient and its fp32 copy for the reduce-scatter; at the end
             of backward the root's gradient and its fp32 copy.
  activations  with activation checkpointing each block's input (tokens x hidden) plus, during
             one block's backward, that block's recomputed activations and their gradients
             (ACTIVATION_ELEMENTS, per token, measured on CPU from the same transformers code);
             without it every block's. The chunked lm_head (common.token_logprobs) holds
             chunk x vocab logits in a few fp32 copies (HEAD_COPIES, measured).
  04 rollout vLLM's pool (gpu_memory_utilization x the GPU: bf16 weights, its activations, KV
             cache) beside what FSDP keeps while the engine runs (parameters + Adam, sharded).
  04 train   as 02 at 04's micro_tokens, vLLM asleep at level 2 (weights discarded, KV freed).
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
HEAD_COPIES = 4.25  # fp32 copies of one chunk's logits live at once (measured on CPU: 4.25)
HEAD_CHUNK = 1024  # common.token_logprobs' default chunk
OVERHEAD_GB = 3.0  # CUDA context (~0.5-1), NCCL buffers, allocator fragmentation: a guess
VLLM_ASLEEP_GB = 1.0  # what a level-2-asleep vLLM keeps (CUDA graphs, its allocator's pools): a guess
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
    lin: dict  # Gated DeltaNet widths: key (nk*dk), expanded (nv*dk + nv*dv), heads (nv), state
    kv_bytes_per_token: int  # vLLM's KV cache per token (full-attention layers, bf16)
    seq_state_bytes: int  # linear-attention state per sequence (recurrent fp32 + conv bf16)


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
                 lin={"key": nk * dk, "expanded": nv * (dk + dv), "heads": nv, "state": nv * dk * dv},
                 kv_bytes_per_token=n_full * 2 * config.num_key_value_heads * hd * 2,
                 seq_state_bytes=n_lin * (nv * dk * dv * 4 + conv * (k - 1) * 2))


def block_bytes(s: Shape, kind: str, gpu: bool, fla: bool = True) -> float:
    """Live activation bytes per token during one block's backward (ACTIVATION_ELEMENTS): bf16 on
    GPU, fp32 on CPU; Gated DeltaNet's own part in fp32 on GPU too when flash-linear-attention is
    missing (transformers' torch fallback computes in fp32), else bf16 plus fla's chunk states."""
    e, a = ACTIVATION_ELEMENTS, (2 if gpu else 4)
    mlp = (e["hidden"] * s.hidden + e["intermediate"] * s.intermediate) * a
    if kind == "full_attention":
        return mlp + (e["q"] * s.q + e["kv"] * s.kv) * a
    own = e["lin_key"] * s.lin["key"] + e["lin_expanded"] * s.lin["expanded"] + e["lin_head"] * s.lin["heads"]
    if gpu and fla:
        return mlp + own * 2 + s.lin["state"] / 64 * 4
    return mlp + own * 4


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
    # on GPU also the bf16 logits and their fp32 upcast (a no-op for CPU's fp32 logits)
    logits = (HEAD_COPIES * 4 + (2 + 4 if gpu else 0)) * chunk * s.vocab
    head = logits + 3 * tokens * s.hidden * a
    fsdp_block = (3 * c + up) * s.block_max if world > 1 else 0  # 2 gathered, its gradient (+ fp32 copy)
    phases = {
        "lm_head chunks": 2 * root + cast_cache + saved + head,
        "block backward": 2 * root + acts + fsdp_block,
        "root reduce-scatter": 2 * root + up * s.root if world > 1 else 0,
        "optimizer step": 4 * shard if gpu else 0,  # foreach AdamW's full-size intermediate
    }
    phase = max(phases, key=phases.get)
    terms = state | {"phase: " + phase: phases[phase]}
    return {"peak": sum(terms.values()), "terms": terms, "phase": phase}


def rollout_peak(s: Shape, *, world: int, gpu_bytes: float, utilization: float, max_context: int) -> dict:
    """Per-rank bytes while the engine rolls out: vLLM's pool (utilization x the GPU) beside FSDP's
    sharded parameters and Adam moments (gradients are freed by zero_grad), and how many
    max-context sequences the pool's KV cache holds after the bf16 weights and its reserve."""
    pool = utilization * gpu_bytes
    kv = pool - 2 * s.params - VLLM_RESERVE_GB * GB
    per_seq = s.kv_bytes_per_token * max_context + s.seq_state_bytes
    resident = 12 * s.params / world
    return {"peak": pool + resident, "terms": {"vllm pool": pool, "fsdp params + adam": resident},
            "kv_cache": kv, "max_context_seqs": int(max(kv, 0) // per_seq)}


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
            "max_context": field(grpo, "max_context", None) or C.Scaffold().max_context}


def plan(s: Shape, *, gpus: int, gpu_gb: float, sft_tokens: int, grpo_tokens: int,
         gpu_memory_utilization: float, max_context: int, sft_checkpointing: bool = True,
         grpo_checkpointing: bool = True, gpu: bool = True) -> dict:
    sft = train_peak(s, world=gpus, tokens=sft_tokens, gpu=gpu, checkpointing=sft_checkpointing)
    train = train_peak(s, world=gpus, tokens=grpo_tokens, gpu=gpu, checkpointing=grpo_checkpointing)
    train["peak"] += VLLM_ASLEEP_GB * GB
    train["terms"]["vllm asleep (level 2)"] = VLLM_ASLEEP_GB * GB
    roll = rollout_peak(s, world=gpus, gpu_bytes=gpu_gb * GB, utilization=gpu_memory_utilization,
                        max_context=max_context)
    limit = (gpu_gb - OVERHEAD_GB) * GB
    fits = max(sft["peak"], train["peak"], roll["peak"]) <= limit and roll["max_context_seqs"] >= 1
    return {"sft": sft, "grpo_train": train, "grpo_rollout": roll, "fits": fits}


def report(s: Shape, p: dict, args) -> str:
    lines = [f"{args.model}: {s.params / 1e9:.3f}B parameters ({s.root / 1e9:.3f}B in embeddings + lm_head), "
             f"{len(s.layers)} layers; {args.gpus} x {args.gpu_gb:g} GB",
             f"  02: {args.sft_tokens} tokens/micro-batch; 04: {args.grpo_tokens} tokens/micro-batch, vLLM "
             f"{args.gpu_memory_utilization:g} of the GPU, context {args.max_context}"]
    for name in ("sft", "grpo_train", "grpo_rollout"):
        r = p[name]
        terms = ", ".join(f"{k} {v / GB:.1f}" for k, v in r["terms"].items())
        lines.append(f"  {name:13s} {r['peak'] / GB:6.1f} GB  ({terms})")
    r = p["grpo_rollout"]
    lines.append(f"  vLLM KV cache {r['kv_cache'] / GB:.1f} GB: {r['max_context_seqs']} sequences of "
                 f"{args.max_context} tokens at once; fits (with {OVERHEAD_GB:g} GB overhead): {p['fits']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    d = stage_defaults()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3.5-9b", help="local model folder or built-in name")
    ap.add_argument("--gpus", type=int, default=8, help="ranks (one GPU each)")
    ap.add_argument("--gpu-gb", type=float, default=80.0, help="memory per GPU, GB")
    ap.add_argument("--sft-tokens", type=int, default=d["sft_tokens"], help="02's --micro-batch-tokens")
    ap.add_argument("--grpo-tokens", type=int, default=d["grpo_tokens"], help="04's --micro-tokens")
    ap.add_argument("--gpu-memory-utilization", type=float, default=d["gpu_memory_utilization"], help="04's")
    ap.add_argument("--max-context", type=int, default=d["max_context"], help="04's engine max_model_len")
    ap.add_argument("--json", action="store_true", help="last line: the summary as JSON")
    args = ap.parse_args(argv)
    s = shape_of(load_config(args.model))
    p = plan(s, gpus=args.gpus, gpu_gb=args.gpu_gb, sft_tokens=args.sft_tokens, grpo_tokens=args.grpo_tokens,
             gpu_memory_utilization=args.gpu_memory_utilization, max_context=args.max_context,
             sft_checkpointing=d["sft_checkpointing"], grpo_checkpointing=d["grpo_checkpointing"])
    print(report(s, p, args))
    out = {f"{k}_peak_gb": round(p[k]["peak"] / GB, 1) for k in ("sft", "grpo_train", "grpo_rollout")}
    out |= {"gpu_gb": args.gpu_gb, "fits": p["fits"]}
    if args.json:
        print(json.dumps(out))
    return out


if __name__ == "__main__":
    C.run_main(main)
