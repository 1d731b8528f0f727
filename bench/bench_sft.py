"""SFT figures, side by side in one run (not a test).

CPU (default): one epoch of the same rows on a tiny model, packed best-fit vs length-bucketed
padding: trained-on tokens/s and the share of each micro-batch wasted on padding. Qwen3.5's
linear-attention layers can't keep packed rows apart on CPU (02_sft.packing_supported), so both
runs use the tiny Qwen3 (full attention), which can.

GPU: one SFT step (after a warm-up step) of a random Qwen3.5-shaped model of about 1.5B parameters
through 02_sft.main: tokens/s, MFU and peak memory. Packing is used if its linear-attention layers
call flash-linear-attention's and causal-conv1d's kernels, padding otherwise (the output says which).

    python bench/bench_sft.py [--rows 64] [--budget 4096]
    python bench/bench_sft.py --model-size 1.5b --device cuda [--budget 16384]
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common as C  # noqa: E402

sft = importlib.import_module("02_sft")
CMDS = ["ls -la /app", "cat README.md", "python3 -m pytest -q tests/", "grep -rn TODO src/", "make build"]


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    """Recovery rows (failed attempt, recovery message, recovery attempt) of 2-12 tool calls,
    with tool outputs of varying size: lengths spread over ~600-2500 tokens."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        task = f"Fix the build in /app (variant {i})."
        msgs = C.initial_messages(task)
        for part in ("fail", "fix"):
            for _ in range(rng.randint(1, 6)):
                cmd = rng.choice(CMDS)
                call = {"type": "function", "function": {"name": "bash", "arguments": {"command": cmd}}}
                out = "\n".join(f"line {k}: ok" for k in range(rng.randint(1, 30)))
                msgs += [{"role": "assistant", "content": f"Next I run {cmd}.", "tool_calls": [call]},
                         {"role": "tool", "content": out}]
            msgs.append({"role": "assistant", "content": "Done." if part == "fix" else "I give up."})
            if part == "fail":
                idx = len(msgs)
                msgs.append(C.recovery_message(task))
        rows.append({"id": f"r{i}", "task_id": "bench", "messages": msgs, "target_attempt_index": 2,
                     "train_from_message_index": idx, "trajectory_sha256": f"{i:064x}"})
    return rows


def run(data: Path, model: Path, out: Path, *flags: str) -> list[dict]:
    sft.main(["--data", str(data), "--model", str(model), "--out", str(out), "--save-every", "0",
              "--warmup-steps", "1", "--lr", "1e-4", *flags])
    return C.read_jsonl(out / "metrics.jsonl")


def cpu(args: argparse.Namespace, tmp: Path) -> None:
    data = tmp / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(args.rows)))
    model = C.make_tiny_model(tmp / "qwen3", arch="qwen3")
    flags = ["--max-len", str(args.budget), "--micro-batch-tokens", str(args.budget), "--epochs", "1",
             "--grad-accum", "1", "--no-activation-checkpointing"]
    results = {}
    cfg = sft.Config(data=str(data), max_len=args.budget)
    rows_in, tok = sft.load_rows(cfg.data, cfg.all_assistant), C.load_tokenizer(model)
    for mode in ("pack", "pad"):
        rows = run(data, model, tmp / mode, *flags, "--batching", mode)[1:]  # the first step warms up
        traces, _ = sft.tokenize_rows(cfg, rows_in, tok, tmp / mode, 0, 1)  # cached by the run
        lengths = [len(ids) for ids, _ in traces]
        plan = sft.epoch_plan(lengths, args.budget, mode == "pack", 0, 0)
        results[mode] = (sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows),
                         sft.padding_share(plan, lengths, args.budget, mode == "pack"), len(plan))
    print(f"\n== SFT batching, tiny Qwen3 on CPU ({args.rows} rows, {args.budget}-token micro-batches) ==")
    print("(Qwen3.5's linear attention can't keep packed rows apart on CPU; it is padded there)")
    print(f"{'':8}{'tokens/s':>10}{'padding':>10}{'micro-batches':>15}")
    for mode, (tps, pad, n) in results.items():
        print(f"{mode:8}{tps:10,.0f}{pad:10.1%}{n:15}")
    print(f"packing / padding throughput: {results['pack'][0] / results['pad'][0]:.2f}x")
    print("(on CPU a packed row is one sdpa call over the whole budget with a block-diagonal mask, so\n"
          " its attention is quadratic in the budget; flash-attention's varlen path on GPU skips\n"
          " the cross-row blocks)")


def gpu(args: argparse.Namespace, tmp: Path) -> None:
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    assert args.model_size == "1.5b", "only --model-size 1.5b is defined"
    # Qwen3.5-shaped: 3 linear-attention blocks per full-attention block, real vocabulary, tied
    # embeddings as in the small Qwen3.5 models; ~1.8B parameters.
    cfg = Qwen3_5TextConfig(vocab_size=248320, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                            layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 6,
                            num_attention_heads=16, num_key_value_heads=4, head_dim=128,
                            linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
                            linear_value_head_dim=128, tie_word_embeddings=True,
                            max_position_embeddings=65536)
    model = Qwen3_5ForCausalLM(cfg).to(torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    packed = sft.packing_supported(model)  # the linear-attention kernels its layers call
    model.save_pretrained(tmp / "model")
    C.make_tiny_tokenizer().save_pretrained(tmp / "model")  # ids < vocab: any tokenizer will do
    del model
    data = tmp / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(args.rows)))
    torch.cuda.reset_peak_memory_stats()
    rows = run(data, tmp / "model", tmp / "run", "--max-len", str(args.budget), "--micro-batch-tokens",
               str(args.budget), "--max-steps", "2", "--grad-accum", "1", "--activation-checkpointing",
               "--batching", "pack" if packed else "pad")
    r = rows[-1]
    name = torch.cuda.get_device_name()
    print(f"\n== one SFT step, random Qwen3.5-shaped {n_params / 1e9:.2f}B, {name} ==")
    print(f"batching {'packed' if packed else 'padded'}, {args.budget}-token micro-batch, bf16, activation "
          "checkpointing, fp32 master weights + AdamW")
    print(f"tokens/s {r['tokens_per_s']:,.0f} | MFU {r['mfu'] or 0:.1%} | step {r['seconds']:.2f} s | "
          f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--budget", type=int, default=4096, help="tokens per micro-batch (and max row length)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model-size", default=None, help="GPU only: 1.5b")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (gpu if args.device == "cuda" else cpu)(args, Path(tmp))


if __name__ == "__main__":
    main()
