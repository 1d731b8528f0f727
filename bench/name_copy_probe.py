"""Does a policy copy a planted entry's name from what it sees, or recall trained names?

    python bench/name_copy_probe.py --run DIR [--seed 0] [--policy MODEL_DIR]

DIR is a bench/experiment_learning.py output folder of a --stale-vary --stale-compose run. Teacher
forcing on plain-procedure recovery rows (the first attempt leaves the planted file or folder, the
recovery lists /app/out and removes it): at every token of the entry's STEM.EXT name that the
recovery writes after `ls` showed it, the policy's probability of the right piece and whether it is
the argmax, and whether the argmax is another trained stem or extension (recall). On train rows
(DIR/data/plain.jsonl, names SFT saw) and on rows built the same way on the dev tasks (never trained
on; written once to DIR/dev_plain.jsonl). Prints a table; writes DIR/seed<s>/name_copy_probe.json.
No sampling, no environment step of the policy: this isolates reading from acting.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import experiment_learning as E  # noqa: E402
import microtasks  # noqa: E402

import common as C  # noqa: E402


def name_positions(ids: list[int], piece_ids: list[int]) -> list[int]:
    """Positions of the name's pieces (stem, '.', ext as ids) after their first occurrence (the `ls`
    output): the ones the recovery writes."""
    n = len(piece_ids)
    starts = [i for i in range(len(ids) - n + 1) if ids[i:i + n] == piece_ids]
    return [s + k for s in starts[1:] for k in (0, 2)]  # the stem and the extension, not the dot


def probe(model, tok, rows: list[dict], causes: dict) -> dict:
    import torch

    piece = {w: tok.convert_tokens_to_ids(w) for w in microtasks.STALE_PIECES}
    stats = {"tokens": 0, "p_right": 0.0, "argmax_right": 0, "argmax_other_piece": 0, "rows": 0}
    for row in rows:
        cause = causes.get(row["task_id"])
        if not cause or cause["kind"] == "clash":  # a clash is the task's own output name
            continue
        stem, ext = Path(cause["path"]).name.split(".")
        ids = C.render_ids(tok, row["messages"], add_generation_prompt=False)
        pos = name_positions(ids, [piece[stem], tok.convert_tokens_to_ids("."), piece[ext]])
        if not pos:
            continue
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        probs = logits.softmax(-1)
        stats["rows"] += 1
        for p in pos:
            right, top = ids[p], int(logits[p - 1].argmax())
            stats["tokens"] += 1
            stats["p_right"] += float(probs[p - 1, right])
            stats["argmax_right"] += top == right
            stats["argmax_other_piece"] += top != right and top in piece.values()
    n = max(1, stats["tokens"])
    return {"rows": stats["rows"], "name_tokens": stats["tokens"], "mean_p_right": stats["p_right"] / n,
            "argmax_right": stats["argmax_right"] / n, "argmax_other_piece": stats["argmax_other_piece"] / n}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="an experiment_learning output folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", help="model folder (default: the seed's SFT policy)")
    p.add_argument("--concurrency", type=int, default=8)
    a = p.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = Path(a.run)
    split = json.loads((run / "tasks/split.json").read_text())
    causes = split["causes"]
    dev_rows = run / "dev_plain.jsonl"
    dev_stale = {t for t in split["dev"] if t in causes}
    inspect = json.loads((run / "config.json").read_text()).get("inspect", E.LEGACY["inspect"])
    E.plain_rows(run / "tasks/dev", dev_stale, dev_rows, a.concurrency, skip=set(), inspect=inspect)
    policy = Path(a.policy or run / f"seed{a.seed}/sft/final")
    tok = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy).eval()
    # a policy that knows a stem (an extension) goes there but not which: 1/8 (1/6) at each piece
    chance = (1 / len(microtasks.STALE_STEMS) + 1 / len(microtasks.STALE_EXTS)) / 2
    out = {"policy": str(policy), "p_right_by_chance": chance,
           "train": probe(model, tok, C.read_jsonl(run / "data/plain.jsonl"), causes),
           "dev": probe(model, tok, C.read_jsonl(dev_rows), causes)}
    print(f"{'part':<6}{'rows':>6}{'name tokens':>13}{'p(right)':>10}{'argmax right':>14}"
          f"{'argmax other piece':>20}")
    for part in ("train", "dev"):
        r = out[part]
        print(f"{part:<6}{r['rows']:>6}{r['name_tokens']:>13}{r['mean_p_right']:>10.3f}"
              f"{r['argmax_right']:>14.3f}{r['argmax_other_piece']:>20.3f}")
    print(f"(a uniform guess among the trained pieces: p(right) {chance:.3f})")
    (run / f"seed{a.seed}/name_copy_probe.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
