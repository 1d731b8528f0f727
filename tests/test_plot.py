"""Watching a run: `python common.py plot RUN_DIR` draws its metrics.jsonl as curves, one panel per
numeric field, and --tensorboard DIR on 02 and 04 writes the same fields as TensorBoard scalars."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
import types

import pytest
from conftest import ROOT

import common as C


def test_plot_draws_one_panel_per_numeric_field_and_refuses_an_empty_run(tmp_path):
    rows = [{"step": s, "reward": 0.25 * s, "loss": 1.0 / s, "tokens_per_s": 100 + s, "clip_frac": 0.1,
             "done": True, "group_rewards": [{"task": "t", "rewards": [1, 0]}], "mode": "fork",
             "kl": float("nan") if s == 1 else 0.01} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # numbers only: not the step (the x axis), a bool, a list or a string; a field NaN in one row stays
    assert C.metric_fields(rows) == ["reward", "loss", "tokens_per_s", "clip_frac", "kl"]
    out = tmp_path / "curves.png"
    run = subprocess.run([sys.executable, "common.py", "plot", str(tmp_path), "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and run.stdout.strip() == str(out)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty/metrics.jsonl").write_text(json.dumps({"step": 1, "mode": "fork"}) + "\n")
    bad = subprocess.run([sys.executable, "common.py", "plot", str(tmp_path / "empty")], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.strip().startswith("error:") and "Traceback" not in bad.stderr


# ── --tensorboard on 02 and 04 (the tensorboard package is optional) ──────────


def test_tensorboard_without_its_package_is_a_one_line_error_before_the_run_starts(monkeypatch, tmp_path):
    """Each stage refuses --tensorboard before it reads data or loads a model: 02's data file and
    model, 04's model, do not exist here, and nothing is written."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard"
                        else real(name, *a))
    tb, missing = str(tmp_path / "tb"), str(tmp_path / "missing")
    argvs = {"02_sft": ["--data", missing + ".jsonl", "--model", missing],
             "04_reterm_grpo": ["--model", missing, "--mode", "standard"]}
    for stage, argv in argvs.items():
        main = importlib.import_module(stage).main
        with pytest.raises(SystemExit) as stop:
            C.run_main(lambda: main(argv + ["--out", str(tmp_path / stage), "--tensorboard", tb]))  # noqa: B023
        assert str(stop.value) == (f"error: --tensorboard {tb}: the tensorboard package is not installed "
                                   "(pip install tensorboard), or drop the flag"), stage
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.setattr(importlib.util, "find_spec", real)
    C.check_tensorboard("")  # without the flag the package is never asked for


def test_02_writes_the_scalars_of_metrics_jsonl_to_tensorboard(monkeypatch, tmp_path):
    """--tensorboard DIR on 02: every step's numeric metrics.jsonl fields reach the writer as scalars
    at that step, under the same names (a stand-in writer: the package is not needed)."""
    from test_sft import TINY, make_row, write_rows

    sft = importlib.import_module("02_sft")
    scalars, dirs = [], []
    writer = types.SimpleNamespace(add_scalar=lambda *a: scalars.append(a), flush=lambda: None)
    monkeypatch.setattr(C, "check_tensorboard", lambda logdir: None)
    monkeypatch.setattr(C, "tensorboard_writer", lambda logdir: dirs.append(logdir) or writer)
    data = write_rows(tmp_path / "rows.jsonl", [make_row(i) for i in range(2)])
    model = C.make_tiny_model(tmp_path / "tiny", arch="qwen3")
    out = tmp_path / "sft"
    sft.main(["--data", str(data), "--model", str(model), "--out", str(out), *TINY, "--max-steps", "2",
              "--tensorboard", str(tmp_path / "tb")])
    rows = C.read_jsonl(out / "metrics.jsonl")
    assert dirs == [str(tmp_path / "tb")] and [r["step"] for r in rows] == [1, 2]
    assert scalars == [(k, r[k], r["step"]) for r in rows for k in C.metric_fields([r])]
    assert {"loss", "lr", "grad_norm", "tokens_per_s"} <= {k for k, _, _ in scalars}
