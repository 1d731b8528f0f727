"""One-GPU check of the training path at 9B shapes, beside the memory plan's predictions.

    python bench/gpu_check.py --out DIR                      # one GPU (an H200: a few minutes)
    python bench/gpu_check.py --device cpu --tiny --out DIR  # the same code on CPU, under a minute

Needs only torch + transformers (no vLLM, no Docker, no model download). It builds a random-init
model of Qwen3.5-9B's architecture at the largest depth whose 02 step the memory plan says fits
this one GPU (a single process: fp32 weights and AdamW state on the GPU, bf16 autocast, activation
checkpointing), then
  02: a few SFT steps (02's train_step) on 32k-token micro-batches of random tokens, packed rows
      when the varlen kernels are installed (flash-attn, flash-linear-attention, causal-conv1d),
      one padded row otherwise: tokens/s, MFU, peak memory;
  04: one GRPO training step (token_logprobs + 04's clipped_policy_loss) on recovery rows whose
      long failed-attempt prefix is context only: peak memory;
and writes DIR/gpu_check.json with each measured peak, allocated and reserved (the caching
allocator's; on CPU, which has none, the same live-tensor peak), beside the plan's figure for the
same shapes, and the layer kinds built (the automatic depth is a multiple of the full-attention
interval: both kinds run).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory_plan as MP  # noqa: E402

import common as C  # noqa: E402

sft = importlib.import_module("02_sft")
grpo = importlib.import_module("04_reterm_grpo")
TINY = {"hidden_size": 128, "intermediate_size": 384, "vocab_size": 2048, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 64, "linear_value_head_dim": 64}


def model_config(layers: int, tiny: bool):
    """Qwen3.5-9B's text config (or a tiny one of the same layout) cut to its first `layers` layers
    (three linear-attention layers, then a full-attention one, repeated)."""
    base = MP.load_config("qwen3.5-9b").to_dict() | (TINY if tiny else {})
    base |= {"num_hidden_layers": layers, "layer_types": base["layer_types"][:layers]}
    return type(MP.load_config("qwen3.5-9b"))(**{k: v for k, v in base.items() if k != "model_type"})


HEADROOM = 0.85  # the check aims at 85% of the GPU: a plan 15% low still runs (and is measured)


def deepest_fitting(gpu_bytes: float, tokens: int, fla: bool) -> int:
    """The most layers (<= 32), a multiple of the full-attention interval so that both kinds of
    layer run, whose single-GPU 02 step the plan fits in HEADROOM of this GPU; else one interval's
    worth if the plan fits it in the whole GPU (an out-of-memory is then a finding, recorded)."""
    every = MP.load_config("qwen3.5-9b").full_attention_interval

    def need(layers: int) -> float:
        shape = MP.shape_of(model_config(layers, False))
        peak = MP.train_peak(shape, world=1, tokens=tokens, gpu=True, fla=fla)["peak"]
        return peak + MP.OVERHEAD_GB * MP.GB

    for layers in range(32 // every * every, 0, -every):
        if need(layers) <= HEADROOM * gpu_bytes:
            return layers
    if need(every) <= gpu_bytes:
        return every
    raise SystemExit(f"gpu_check: not even {every} Qwen3.5-9B layers (one of each kind) fit this GPU "
                     "under 02's settings: pass --layers")


def sft_batch(tokens: int, vocab: int, packed: bool, gen: torch.Generator) -> dict:
    """One 02 micro-batch of `tokens`: rows of 2-8k random tokens packed best-fit, or one row."""
    lengths = [tokens]
    if packed:
        lengths = []
        while sum(lengths) < tokens:
            lengths.append(min(int(torch.randint(2048, 8192, (1,), generator=gen)), tokens - sum(lengths)))
    ids = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    traces = [C.TokenTrace(r, [0.0] * len(r), [0] + [1] * (len(r) - 1)) for r in ids]
    return C.collate(traces, 0, packed=packed, width=tokens if packed else None)


def recovery_rows(tokens: int, vocab: int, gen: torch.Generator) -> list[C.TokenTrace]:
    """04's rows: a failed attempt's long prefix (80% of the row, mask 0), then the recovery attempt."""
    out = []
    for n in (tokens, tokens // 2, tokens // 2):  # two micro-batches of `tokens` padded tokens
        prefix = int(n * 0.8)
        ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
        logp = (-torch.rand(n, generator=gen)).tolist()
        out.append(C.TokenTrace(ids, logp, [0] * prefix + [1] * (n - prefix)))
    return out


def run_sft(model, device, tokens: int, steps: int, packed: bool, vocab: int) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    cfg = sft.Config(data="-", grad_accum=1)
    gen = torch.Generator().manual_seed(0)
    batch = sft_batch(tokens, vocab, packed, gen)
    step = lambda: sft.train_step(model, opt, sched, [batch], cfg, device, 1)  # noqa: E731
    first = step()  # warm-up; Adam's moments exist from here on, as in every later step
    losses, t0 = [first["loss"]], time.perf_counter()
    peak, reserved = MP.measure_peaks(lambda: losses.append(step()["loss"]), device, model, opt)
    for _ in range(steps - 2):
        losses.append(step()["loss"])
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / (steps - 1)
    flops, peak_flops = sft.flops_per_token(model, tokens), sft.peak_flops(device)
    return {"steps": steps, "tokens_per_micro_batch": tokens, "kept": tokens - 1,
            "rows": int(batch["row"].max()) + 1, "packed": packed, "seconds_per_step": dt,
            "tokens_per_s": tokens / dt,
            "mfu": flops * tokens / dt / peak_flops if peak_flops else None, "loss": losses,
            "peak_gb": peak / MP.GB, "reserved_peak_gb": reserved / MP.GB, "optimizer": opt}


def run_grpo(model, opt, device, tokens: int, vocab: int) -> dict:
    """One 04 training step: micro-batches padded to 04's --micro-tokens, one optimizer step."""
    gen = torch.Generator().manual_seed(1)
    rows = recovery_rows(tokens, vocab, gen)
    buckets = C.length_buckets([len(t) for t in rows], tokens)
    n_tok = sum(sum(t.mask) for t in rows)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step() -> None:
        for b in buckets:
            batch = C.collate([rows[i] for i in b], 0)
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            adv = torch.tensor([1.0 if i % 2 else -1.0 for i in b], device=device)
            with autocast:
                logp = C.token_logprobs(model, batch)
            old = logp.detach()
            loss = grpo.clipped_policy_loss(logp, old, adv, batch["loss_mask"])
            (loss * batch["loss_mask"].sum() / n_tok).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    peak, reserved = MP.measure_peaks(step, device, model, opt)
    kept = max(int(C.collate([rows[i] for i in b], 0)["loss_mask"][:, 1:].any(0).sum()) for b in buckets)
    return {"rows": len(rows), "row_tokens": [len(t) for t in rows], "micro_batches": len(buckets),
            "kept": kept, "trained_tokens": n_tok, "seconds": time.perf_counter() - t0,
            "peak_gb": peak / MP.GB, "reserved_peak_gb": reserved / MP.GB}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json")
    ap.add_argument("--device", default="cuda", help="cuda | cpu")
    ap.add_argument("--tiny", action="store_true", help="a tiny model of the same layout and 512-token rows")
    ap.add_argument("--layers", type=int, default=0, help="model depth (0: the deepest the plan fits)")
    ap.add_argument("--steps", type=int, default=3, help="02 steps (the first is a warm-up)")
    args = ap.parse_args(argv)
    t_start, device = time.perf_counter(), torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise C.UserError("--device cuda: no GPU here (run with --device cpu --tiny)")
    s02, s04 = sft.Config(data="-"), grpo.Config(model="-", out="-")
    tokens02, tokens04 = (512, 512) if args.tiny else (s02.micro_batch_tokens, s04.micro_tokens)
    gpu = device.type == "cuda"
    total = torch.cuda.get_device_properties(device).total_memory if gpu else 0
    with torch.device("meta"):  # which linear-attention kernels the layers bind (02's own check)
        probe = AutoModelForCausalLM.from_config(model_config(4, True))
    fla = gpu and not sft.leaking_kernels(probe)
    layers = args.layers or (4 if args.tiny else deepest_fitting(total, tokens02, fla))
    config = model_config(layers, args.tiny)
    torch.manual_seed(0)
    with device:  # random init, straight on the device
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                 attn_implementation=C.attention_implementation(device))
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    missing = sft.missing_kernels(model)
    packed = gpu and not missing
    shape = MP.shape_of(config)
    res02, res04 = {}, {}
    try:  # an out-of-memory is a finding too (the plan was low): recorded, not a crash
        res02 = run_sft(model, device, tokens02, max(args.steps, 2), packed, config.vocab_size)
        res04 = run_grpo(model, res02.pop("optimizer"), device, tokens04, config.vocab_size)
    except torch.OutOfMemoryError as e:
        (res04 if res02 else res02)["error"] = f"out of memory: {str(e).splitlines()[0]}"
    for res, tokens in ((res02, tokens02), (res04, tokens04)):
        plan = MP.train_peak(shape, world=1, tokens=tokens, gpu=gpu, fla=fla, kept=res.get("kept"))
        res["plan_peak_gb"] = plan["peak"] / MP.GB
        res["plan_over_measured"] = res["plan_peak_gb"] / res["peak_gb"] if "peak_gb" in res else None
    out = {"device": torch.cuda.get_device_name(device) if gpu else "cpu", "gpu_gb": total / MP.GB,
           "torch": torch.__version__, "transformers": importlib.import_module("transformers").__version__,
           "attention": model.config._attn_implementation, "missing_kernels": missing,
           "model": {"layers": layers, "layer_types": list(config.layer_types), "hidden": config.hidden_size,
                     "vocab": config.vocab_size, "params": shape.params, "tiny": args.tiny},
           "sft": res02, "grpo_train": res04, "seconds": time.perf_counter() - t_start}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_check.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("device", "model", "seconds")}))
    for name, r in (("02", res02), ("04", res04)):
        speed = f", {r['tokens_per_s']:,.0f} tok/s" if "tokens_per_s" in r else ""
        print(f"{name}: peak allocated {r.get('peak_gb', float('nan')):.2f} GB, reserved "
              f"{r.get('reserved_peak_gb', float('nan')):.2f} GB, plan {r['plan_peak_gb']:.2f} GB{speed}"
              f" {r.get('error', '')}")
    return out


if __name__ == "__main__":
    C.run_main(main)
