"""`python common.py plot RUN_DIR`: a run's metrics.jsonl as curves, one panel per numeric field."""

from __future__ import annotations

import json
import subprocess
import sys

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
