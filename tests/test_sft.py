"""Stage 02 (SFT): exact loss masks, learning, sharded == single process, exact resume, a final
folder that transformers loads, clear errors on bad input. Tiny models, CPU, ~2 min. (vLLM serving
02's final/ with the trained weights: test_learning's SFT-then-fork test.)"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import common as C

ROOT = Path(__file__).resolve().parents[1]
sft = importlib.import_module("02_sft")
INSTRUCTION = "Write ok to /app/out.txt."


def call(cmd: str) -> list[dict]:
    return [{"type": "function", "function": {"name": "bash", "arguments": {"command": cmd}}}]


def make_row(i: int, fail=("ls", "cat out.txt"), fix=("echo ok > /app/out.txt",)) -> dict:
    """The shape stage 01 writes: failed attempt, recovery message, recovery attempt."""
    msgs = C.initial_messages(INSTRUCTION)
    for k, cmd in enumerate(fail):
        msgs += [{"role": "assistant", "content": f"Step {k}: run {cmd}.", "tool_calls": call(cmd)},
                 {"role": "tool", "content": f"[exit code {k % 2}]\nno such file {i}"}]
    msgs.append({"role": "assistant", "content": "I could not finish."})
    idx = len(msgs)
    msgs.append(C.recovery_message(INSTRUCTION))
    for cmd in fix:
        msgs += [{"role": "assistant", "content": f"Repair {i}: {cmd}", "tool_calls": call(cmd)},
                 {"role": "tool", "content": "[exit code 0]"}]
    msgs.append({"role": "assistant", "content": f"Fixed it (row {i})."})
    return {"id": f"row-{i}", "task_id": "write-ok", "messages": msgs, "train_from_message_index": idx,
            "target_attempt_index": 2, "trajectory_sha256": f"{i:064x}"}


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    return {a: C.make_tiny_model(d / a, arch=a) for a in ("qwen3_5", "qwen3")}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    rows = [make_row(i, fix=["echo ok > /app/out.txt", "cat /app/out.txt"][: 1 + i % 2]) for i in range(4)]
    return write_rows(tmp_path_factory.mktemp("data") / "rows.jsonl", rows)


# ~600-token rows, one per micro-batch: a step costs a fraction of a second on 2 cores.
TINY = ["--max-len", "768", "--micro-batch-tokens", "768", "--lr", "3e-3", "--warmup-steps", "2",
        "--grad-accum", "1", "--no-activation-checkpointing", "--save-every", "0"]


def run(data: Path, model: Path, out: Path, *flags: str) -> Path:
    return sft.main(["--data", str(data), "--model", str(model), "--out", str(out), *TINY, *flags])


def losses(out: Path) -> list[float]:
    return [r["loss"] for r in C.read_jsonl(out / "metrics.jsonl")]


# ── masks ───────────────────────────────────────────────────────────────────


def test_loss_mask_is_exactly_the_recovery_attempts_assistant_tokens(models):
    tok = C.load_tokenizer(models["qwen3_5"])
    row = make_row(0, fix=["echo ok > /app/out.txt", "cat /app/out.txt"])
    msgs, idx = row["messages"], row["train_from_message_index"]
    trace = C.tokenize_messages(tok, msgs, idx)
    assert trace.ids == C.render_ids(tok, msgs, add_generation_prompt=False)[: len(trace)]

    def segments(mask):  # contiguous runs of 1s, as (start, end)
        runs, start = [], None
        for p, m in enumerate([*mask, 0]):
            if m and start is None:
                start = p
            if not m and start is not None:
                runs.append((start, p))
                start = None
        return runs

    def turn_text(m):  # what the model samples for assistant message m, by hand
        body = "".join("\n\n<tool_call>\n<function=bash>\n<parameter=command>\n"
                       f"{c['function']['arguments']['command']}\n</parameter>\n</function>\n</tool_call>"
                       for c in m.get("tool_calls", []))
        return m["content"] + body + "<|im_end|>"

    recovery = [m for m in msgs[idx:] if m["role"] == "assistant"]
    runs = segments(trace.mask)
    assert [tok.decode(trace.ids[a:b]) for a, b in runs] == [turn_text(m) for m in recovery]
    # token by token: the trained ids are exactly the canonical assistant tokens, in order
    want = [t for i, m in enumerate(msgs) if i >= idx and m["role"] == "assistant"
            for t in C.assistant_turn_ids(tok, msgs[:i], m)]
    assert [trace.ids[p] for p in range(len(trace)) if trace.mask[p]] == want
    # the failed attempt's assistant turns, the recovery message and tool outputs carry no loss
    before = tok.decode([t for t, m in zip(trace.ids, trace.mask, strict=True) if not m])
    assert "Step 0: run ls." in before and "Your previous attempt" in before and "[exit code 0]" in before
    every = segments(C.tokenize_messages(tok, msgs, idx, all_assistant=True).mask)
    assert len(every) == sum(m["role"] == "assistant" for m in msgs) > len(runs)
    # and the loss only sees those positions
    batch = C.collate([trace], tok.pad_token_id)
    lp = C.token_logprobs(C.load_model(models["qwen3_5"]), batch)
    assert torch.equal(lp != 0, batch["loss_mask"].bool())


def test_truncation_and_drop():
    t = C.TokenTrace([1] * 6 + [2] * 4, [0.0] * 10, [0] * 6 + [1] * 4)
    assert sft.fit(t, 10) is t
    short = sft.fit(t, 5)
    assert short.ids == [1, 2, 2, 2, 2] and short.mask == [0, 1, 1, 1, 1]
    assert sft.fit(t, 3) is None


def test_tokenising_with_workers_matches_serial(models, tmp_path):
    rows = [make_row(i, fail=["ls"] * (1 + i % 3)) for i in range(32)]
    path = write_rows(tmp_path / "rows.jsonl", rows)
    tok = C.load_tokenizer(models["qwen3"])
    cfg = sft.Config(data=str(path), max_len=600)  # a few rows lose context from the left
    rows = sft.load_rows(cfg.data, cfg.all_assistant)
    one = dataclasses.replace(cfg, tokenize_workers=1)
    serial, stats = sft.tokenize_rows(one, rows, tok, tmp_path / "s", 0, 1)
    pooled, stats2 = sft.tokenize_rows(cfg, rows, tok, tmp_path / "p", 0, 1)  # 2 forked workers
    assert stats == stats2 and stats["truncated"] > 0 and stats["rows"] == 32
    pairs = list(zip(serial, pooled, strict=True))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in pairs)
    i = min(range(len(rows)), key=lambda i: len(rows[i]["messages"]))  # a row that fits whole
    full = C.tokenize_messages(tok, rows[i]["messages"], rows[i]["train_from_message_index"])
    assert serial[i][0].tolist() == full.ids and serial[i][1].tolist() == full.mask


FD_SCRIPT = """
import importlib, os, sys
sys.path.insert(0, os.getcwd())
import common as C
sft = importlib.import_module("02_sft")
data, model, out = sys.argv[1:]
cfg = sft.Config(data=data, max_len=4096, tokenize_workers=2)
rows = sft.load_rows(cfg.data, cfg.all_assistant)
traces, stats = sft.tokenize_rows(cfg, rows, C.load_tokenizer(model), sys.modules["pathlib"].Path(out), 0, 1)
print(len(traces), len(os.listdir("/proc/self/fd")))
"""


@pytest.mark.slow
def test_two_thousand_rows_tokenise_with_workers_under_256_descriptors(models, tmp_path):
    """Workers hand rows back as numpy arrays: torch tensors would come back as shared memory, one
    open descriptor per row in the parent (a pool of 2,000 rows died under ulimit -n 256)."""
    import resource

    rows = [make_row(i, fail=["ls"], fix=["echo ok"]) for i in range(2000)]
    path = write_rows(tmp_path / "rows.jsonl", rows)
    cap = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))  # noqa: E731  (ulimit -n 256)
    args = [str(path), str(models["qwen3"]), str(tmp_path / "out")]
    res = subprocess.run([sys.executable, "-c", FD_SCRIPT, *args], cwd=ROOT, preexec_fn=cap,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows, fds = map(int, res.stdout.split()[-2:])
    assert rows == 2000 and fds < 64, res.stdout


def test_best_fit_packing_and_buckets():
    lengths = [9, 7, 5, 4, 3, 2, 2]
    bins = sft.best_fit(lengths, 10, list(range(7)))
    assert sorted(i for b in bins for i in b) == list(range(7))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins) and len(bins) == 4  # 32 tokens
    groups = C.length_buckets(lengths, 10, list(range(7)))
    assert all(len(g) * max(lengths[i] for i in g) <= 10 for g in groups)


# ── training ────────────────────────────────────────────────────────────────


def test_packed_rows_see_only_themselves(models):
    """Packed == one row at a time for full attention; Qwen3.5's torch linear attention leaks across
    packed rows, which is why it is padded on CPU."""
    traces = [C.TokenTrace(list(range(10 + n, 10 + 2 * n)), [0.0] * n, [0, 0] + [1] * (n - 2))
              for n in (7, 12, 5)]
    for arch, exact in (("qwen3", True), ("qwen3_5", False)):
        model = C.load_model(models[arch])
        assert sft.packing_supported(model) is exact
        packed = C.token_logprobs(model, C.collate(traces, 0, packed=True, width=30))[0]
        alone = torch.cat([C.token_logprobs(model, C.collate([t], 0))[0] for t in traces])
        assert torch.allclose(packed[:24], alone, atol=1e-5) is exact
        padded = C.token_logprobs(model, C.collate(traces, 0))
        assert torch.allclose(padded[1, :12], alone[7:19], atol=1e-5)


def fake_metadata_gpu(monkeypatch) -> None:
    """A GPU node where pip installed causal-conv1d, flash-linear-attention and flash-attn: their
    package metadata says so (what transformers' is_*_available() read)."""
    from transformers.utils import import_utils as iu

    for kernel in ("causal_conv1d", "flash_linear_attention", "flash_attn_2"):
        monkeypatch.setattr(iu, f"is_{kernel}_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def as_if_sharded(model) -> None:
    """Each linear-attention layer's class replaced by a subclass made elsewhere, as FSDP2's
    fully_shard does to the modules it wraps."""
    for m in model.modules():
        if getattr(m, "layer_type", None) == "linear_attention":
            m.__class__ = type(f"FSDP{type(m).__name__}", (type(m),), {})


def test_packing_refused_when_the_layers_call_torch_fallbacks_despite_package_metadata(models, monkeypatch):
    """The kernels failed to import (an ABI mismatch is enough): Qwen3.5's linear-attention layers
    call transformers' torch references, which ignore cu_seqlens / seq_idx. 02 must not pack, and
    says which kernel is missing and the two ways out, in one line."""
    fake_metadata_gpu(monkeypatch)
    model = C.load_model(models["qwen3_5"])
    assert sft.packing_supported(model) is False
    as_if_sharded(model)
    assert sft.packing_supported(model) is False
    assert {"causal-conv1d", "flash-linear-attention"} <= set(sft.missing_kernels(model))
    for batching in ("pack", "auto"):
        with pytest.raises(C.UserError) as err:
            sft.choose_packing(batching, model, gpu=True)
        msg = str(err.value)
        assert "\n" not in msg and "causal-conv1d" in msg and "flash-linear-attention" in msg, msg
        assert "pip install" in msg and "--batching pad" in msg, msg
    assert sft.choose_packing("pad", model, gpu=True) is False
    assert sft.choose_packing("auto", model, gpu=False) is False  # CPU pads


def test_packing_accepted_when_the_layers_call_the_kernels(models, monkeypatch):
    """The same check sees kernels that did load: transformers' own fallback decorator bound to
    stand-in packages that import, as causal-conv1d and fla do on a GPU node."""
    import types

    from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback

    fake_metadata_gpu(monkeypatch)
    model = C.load_model(models["qwen3_5"])
    modeling = sys.modules[type(sft.linear_attention_layer(model)).__module__]
    for pkg, func, global_name in (("fake_causal_conv1d", "causal_conv1d_fn", "causal_conv1d_fn"),
                                   ("fake_fla", "chunk_gated_delta_rule", "torch_chunk_gated_delta_rule")):
        kernel_module = types.ModuleType(pkg)
        kernel = lambda *a, **k: None  # noqa: E731
        kernel.__module__ = pkg
        setattr(kernel_module, func, kernel)
        monkeypatch.setitem(sys.modules, pkg, kernel_module)
        torch_reference = getattr(modeling, global_name).__wrapped__
        loaded = use_kernel_func_from_hub_with_fallback(func, pkg)(torch_reference)
        monkeypatch.setattr(modeling, global_name, loaded)
    assert sft.leaking_kernels(model) == [] and sft.packing_supported(model) is True
    as_if_sharded(model)
    assert sft.leaking_kernels(model) == [] and sft.choose_packing("pack", model, gpu=True) is True
    with pytest.raises(C.UserError, match="did not load flash-attn .*--batching pad"):  # sdpa was built
        sft.choose_packing("auto", model, gpu=True)


@pytest.mark.slow
def test_loss_falls(models, data, tmp_path):
    out = tmp_path / "run"
    run(data, models["qwen3_5"], out, "--max-steps", "20", "--lr", "1e-2", "--activation-checkpointing")
    ls = losses(out)
    assert len(ls) == 20 and sum(ls[-3:]) / 3 < 0.5 * sum(ls[:3]) / 3, ls


def test_exported_config_says_the_dtype_its_tensors_have(models, tmp_path):
    """A model trained in fp32 (FSDP's master weights), exported in bf16: config.json must say
    bfloat16, as the safetensors hold, and the folder loads back in bf16."""
    from safetensors import safe_open

    model, tok = C.load_model(models["qwen3_5"]), C.load_tokenizer(models["qwen3_5"])
    out = C.export_hf(model, tok, tmp_path / "final", dtype=torch.bfloat16)
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config.get("torch_dtype", "bfloat16") == "bfloat16", config
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    assert next(C.load_model(out, dtype="auto").parameters()).dtype == torch.bfloat16
    as_trained = json.loads((C.export_hf(model, tok, tmp_path / "fp32") / "config.json").read_text())
    assert as_trained["dtype"] == "float32"


EXPORT_SCRIPT = """
import os, sys
import torch
sys.path.insert(0, os.getcwd())
import common as C
rank, world, device = C.init_distributed()
model = C.load_model_sharded(sys.argv[1], device, world)  # fp32 shards, as trained
C.export_hf(model, C.load_tokenizer(sys.argv[1]), sys.argv[2], dtype=torch.bfloat16)
C.teardown_distributed()
"""


@pytest.mark.slow
def test_sharded_bf16_export_says_bfloat16(models, tmp_path):
    """The GPU path: FSDP2's fp32 parameters exported in bf16 from 2 ranks; save_pretrained would
    write the parameters' float32 into config.json."""
    script = tmp_path / "export.py"
    script.write_text(EXPORT_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script),
           str(models["qwen3_5"]), str(tmp_path / "final")]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=300)
    config = json.loads((tmp_path / "final" / "config.json").read_text())
    assert config["dtype"] == "bfloat16", config
    assert {t.dtype for t in load_file(tmp_path / "final" / "model.safetensors").values()} == {torch.bfloat16}


@pytest.mark.slow
def test_cli_final_folder_loads_in_transformers_and_generates(models, data, tmp_path):
    out = tmp_path / "cli"
    subprocess.run([sys.executable, "02_sft.py", "--data", str(data), "--model", str(models["qwen3_5"]),
                    "--out", str(out), "--max-steps", "2", *TINY], cwd=ROOT, check=True, timeout=300)
    final = out / "final"
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in final.iterdir()}
    tok = C.load_tokenizer(final)
    prompt = C.render_ids(tok, C.initial_messages(INSTRUCTION), add_generation_prompt=True)
    (gen,) = C.HFEngine(final).generate([prompt], C.SamplingConfig(temperature=0, max_tokens=8))
    assert len(gen.ids) >= 1
    assert torch.equal(C.load_model(final).model.embed_tokens.weight,
                       load_file(final / "model.safetensors")["model.embed_tokens.weight"])


@pytest.mark.slow
def test_multimodal_qwen3_5_layout_trains_as_text_lm(data, tmp_path):
    """The released Qwen3.5 checkpoints are Qwen3_5ForConditionalGeneration (vision tower, weights
    under model.language_model.*): SFT loads the text LM from them and saves a text-only folder."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    tok = C.make_tiny_tokenizer()
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32, num_hidden_layers=2, tie_word_embeddings=False,
                layer_types=["linear_attention", "full_attention"], linear_key_head_dim=128,
                linear_value_head_dim=128, linear_num_key_heads=1, linear_num_value_heads=1)
    vision = dict(depth=1, hidden_size=32, num_heads=1, intermediate_size=64, out_hidden_size=64)
    mm = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision,
                                                       tie_word_embeddings=False))
    mm.save_pretrained(tmp_path / "mm")
    tok.save_pretrained(tmp_path / "mm")
    final = run(data, tmp_path / "mm", tmp_path / "run", "--max-steps", "1", "--lr", "0")
    assert json.loads((final / "config.json").read_text())["architectures"] == ["Qwen3_5ForCausalLM"]
    want = mm.model.language_model.embed_tokens.weight  # --lr 0: the weights come back unchanged
    assert torch.equal(C.load_model(final).model.embed_tokens.weight, want)


@pytest.mark.slow
def test_resume_is_exact(models, data, tmp_path):
    # Qwen3 packs (auto): two rows per 1536-token micro-batch.
    flags = ["--max-steps", "5", "--micro-batch-tokens", "1536", "--save-every", "2"]
    run(data, models["qwen3"], tmp_path / "a", *flags)
    run(data, models["qwen3"], tmp_path / "b", *flags, "--stop-after", "3")
    assert not (tmp_path / "b" / "final").exists() and len(losses(tmp_path / "b")) == 3
    run(data, models["qwen3"], tmp_path / "b", *flags)
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    wa, wb = (load_file(tmp_path / r / "final" / "model.safetensors") for r in "ab")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_the_same_rows_in_another_file_order_give_the_same_run(models, tmp_path):
    """Stage 01 writes rows as its threads finish: a rebuild lists the same rows in another order,
    and the run must not depend on it (the epoch order is drawn over the rows' content order)."""
    rows = [make_row(i, fail=["ls"] * (1 + i % 3)) for i in range(6)]
    one, two = write_rows(tmp_path / "one.jsonl", rows), write_rows(tmp_path / "two.jsonl", rows[::-1])
    ids = [[r["id"] for r in sft.load_rows(str(p), False)] for p in (one, two)]
    assert ids[0] == ids[1] and sorted(ids[0]) == sorted(r["id"] for r in rows)
    flags = ["--max-steps", "4", "--micro-batch-tokens", "1536"]
    run(one, models["qwen3"], tmp_path / "a", *flags)
    run(two, models["qwen3"], tmp_path / "b", *flags)
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    wa, wb = (load_file(tmp_path / r / "final" / "model.safetensors") for r in "ab")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_torchrun_two_processes_with_accumulation_and_resume_equal_one(models, data, tmp_path):
    """2 gloo ranks x --grad-accum 2 with activation checkpointing (model built on the meta device,
    filled from rank 0's read), stopped after a step and resumed, == 1 process x --grad-accum 4."""
    flags = ["--max-steps", "3", "--lr", "1e-3", "--activation-checkpointing"]
    run(data, models["qwen3_5"], tmp_path / "one", *flags, "--grad-accum", "4")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "02_sft.py",
           "--data", str(data), "--model", str(models["qwen3_5"]), "--out", str(tmp_path / "two"),
           *TINY, *flags, "--grad-accum", "2"]
    subprocess.run([*cmd, "--stop-after", "1"], cwd=ROOT, env=env, check=True, timeout=300)
    assert len(losses(tmp_path / "two")) == 1 and not (tmp_path / "two" / "final").exists()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=300)
    assert losses(tmp_path / "one") == pytest.approx(losses(tmp_path / "two"), abs=1e-5, rel=0)
    w1, w2 = (load_file(tmp_path / r / "final" / "model.safetensors") for r in ("one", "two"))
    assert w1.keys() == w2.keys() and all(torch.allclose(w1[k], w2[k], rtol=0, atol=1e-5) for k in w1)


SYNC_SCRIPT = """
import importlib, json, os, sys
sys.path.insert(0, os.getcwd())
sft = importlib.import_module("02_sft")
loss, found = sft.sft_loss, []

def spy(model, batch, n_tokens, world):  # before micro-batch k: what micro-batch k - 1 left behind
    found.append([p.grad is not None and p.grad.to_local().numel() < p.numel() for p in model.parameters()])
    return loss(model, batch, n_tokens, world)

sft.sft_loss = spy
sft.main(sys.argv[2:])
open(f"{sys.argv[1]}.{os.environ['RANK']}", "w").write(json.dumps(found))
"""


@pytest.mark.slow
def test_sharded_gradients_are_reduced_after_every_micro_batch(models, data, tmp_path):
    """Under FSDP each micro-batch's gradient is reduce-scattered into the sharded fp32 gradient at
    once: deferring the sync to the step's last micro-batch would keep an unsharded fp32 gradient
    of the whole model alive between micro-batches (~36 GB per GPU at 9B)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = tmp_path / "spy.py"
    script.write_text(SYNC_SCRIPT)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script),
                    str(tmp_path / "found"), "--data", str(data), "--model", str(models["qwen3"]),
                    "--out", str(tmp_path / "run"), *TINY, "--max-steps", "1", "--grad-accum", "2"],
                   cwd=ROOT, env=env, check=True, timeout=300)
    for rank in (0, 1):
        first, second = json.loads((tmp_path / f"found.{rank}").read_text())
        assert not any(first) and all(second), second  # nothing before; every gradient sharded after one


# ── bad input ───────────────────────────────────────────────────────────────


@pytest.mark.parametrize("mutate,message", [
    (lambda r: r.pop("messages"), "bad.jsonl:2 (id='row-1'): 'messages' must be a non-empty"),
    (lambda r: r["messages"][3].update(role="robot"), "bad.jsonl:2 (id='row-1'): messages[3] needs a"),
    (lambda r: r.update(train_from_message_index="7"),
     "bad.jsonl:2 (id='row-1'): 'train_from_message_index' must"),
    (lambda r: r.update(train_from_message_index=99),
     "bad.jsonl:2 (id='row-1'): train_from_message_index 99 is past the end"),
    (lambda r: r.update(messages=r["messages"][:-1] + [{"role": "user", "content": "hi"}],
                        train_from_message_index=len(r["messages"]) - 1),
     "bad.jsonl:2 (id='row-1'): no assistant"),
    (lambda r: r["messages"][2]["tool_calls"][0]["function"]["arguments"].pop("command"),
     "bad.jsonl:2 (id='row-1'): messages[2]: the bash tool needs a non-empty string 'command'"),
])
def test_bad_rows_are_named(models, tmp_path, mutate, message):
    rows = [make_row(0), make_row(1)]
    mutate(rows[1])
    path = write_rows(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        run(path, models["qwen3"], tmp_path / "out", "--max-steps", "1")
    assert not (tmp_path / "out").exists()  # nothing left behind by a refused input


def test_empty_dataset_and_missing_paths(models, tmp_path):
    empty = write_rows(tmp_path / "empty.jsonl", [])
    with pytest.raises(ValueError, match=f"{empty}: empty dataset"):
        run(empty, models["qwen3"], tmp_path / "out")
    torn = tmp_path / "torn.jsonl"
    torn.write_text(json.dumps(make_row(0)) + "\n" + json.dumps(make_row(1))[:-9])
    with pytest.raises(C.DataError, match=f"^{torn}:2: not valid JSON \\(a cut-off last line\\?\\)"):
        run(torn, models["qwen3"], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/nope.jsonl: data file does not exist"):
        run(tmp_path / "nope.jsonl", models["qwen3"], tmp_path / "out")
    data = write_rows(tmp_path / "ok.jsonl", [make_row(0)])
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/no-model: model folder does not exist"):
        run(data, tmp_path / "no-model", tmp_path / "out")
