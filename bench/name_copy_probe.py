"""Does a policy copy a planted entry's name from what it sees, or recall trained names?

    python bench/name_copy_probe.py --run DIR [--seed 0] [--policy MODEL_DIR]

DIR is a bench/experiment_learning.py output folder of a --stale-vary --stale-compose run. Teacher
forcing on plain-procedure recovery rows (the first attempt leaves the planted file or folder, the
recovery lists /app/out and removes it): at every token of the entry's STEM.EXT name that the
recovery writes (its own tokens, after the listing showed it), the policy's probability of the right
piece and whether it is the argmax, and whether the argmax is another trained stem or extension
(recall); the same for the stems it writes in a path (its commands). On train rows (DIR/data/plain.jsonl,
names SFT saw) and on rows built the same way on the dev tasks (never trained on; written once to
DIR/dev_plain.jsonl). Prints a table; writes DIR/seed<s>/name_copy_probe.json.
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


def name_positions(ids: list[int], mask: list[int], piece_ids: list[int]) -> list[int]:
    """Positions of the name's pieces (stem, '.', ext as ids) that the recovery writes: occurrences
    on its own tokens (mask 1), never in a tool's output (a `find` of a planted folder lists the
    name twice, an `ls` once)."""
    n = len(piece_ids)
    starts = [i for i in range(len(ids) - n + 1) if ids[i:i + n] == piece_ids and mask[i]]
    return [s + k for s in starts for k in (0, 2)]  # the stem and the extension, not the dot


def probe(model, tok, rows: list[dict], causes: dict) -> dict:
    """Teacher-forced scores of the name's pieces the recovery writes: over all of them, and over
    the stems it writes as a path (right after "/out/": in its commands), where a head that copies
    what followed "/app/out/" before (as the instruction's output path is copied) can find them in a
    listing of full paths (`find`), never in an `ls -la` line."""
    import torch

    piece = {w: tok.convert_tokens_to_ids(w) for w in microtasks.STALE_PIECES}
    cue = [tok.convert_tokens_to_ids("/out"), tok.convert_tokens_to_ids("/")]
    keys = ("tokens", "p_right", "argmax_right", "argmax_other_piece")
    stats = {"rows": 0, "all": dict.fromkeys(keys, 0.0), "path_stem": dict.fromkeys(keys, 0.0)}
    for row in rows:
        cause = causes.get(row["task_id"])
        if not cause or cause["kind"] == "clash":  # a clash is the task's own output name
            continue
        stem, ext = Path(cause["path"]).name.split(".")
        trace = C.tokenize_messages(tok, row["messages"], row["train_from_message_index"])
        ids = trace.ids
        pos = name_positions(ids, trace.mask, [piece[stem], tok.convert_tokens_to_ids("."), piece[ext]])
        if not pos:
            continue
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        probs = logits.softmax(-1)
        stats["rows"] += 1
        for p in pos:
            right, top = ids[p], int(logits[p - 1].argmax())
            for group in ("all", "path_stem") if ids[p - 2:p] == cue else ("all",):
                g = stats[group]
                g["tokens"] += 1
                g["p_right"] += float(probs[p - 1, right])
                g["argmax_right"] += top == right
                g["argmax_other_piece"] += top != right and top in piece.values()
    out = {"rows": stats["rows"]}
    for group, prefix in (("all", ""), ("path_stem", "path_stem_")):
        g, n = stats[group], max(1, stats[group]["tokens"])
        out |= {f"{prefix}name_tokens": int(g["tokens"]), f"{prefix}mean_p_right": g["p_right"] / n,
                f"{prefix}argmax_right": g["argmax_right"] / n,
                f"{prefix}argmax_other_piece": g["argmax_other_piece"] / n}
    return out


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
    print(f"{'part':<24}{'rows':>6}{'pieces':>8}{'p(right)':>10}{'argmax right':>14}"
          f"{'argmax other piece':>20}")
    for part in ("train", "dev"):
        for prefix, what in (("", ""), ("path_stem_", ", stems in a path")):
            r = out[part]
            print(f"{part + what:<24}{r['rows'] if not prefix else '':>6}{r[prefix + 'name_tokens']:>8}"
                  f"{r[prefix + 'mean_p_right']:>10.3f}{r[prefix + 'argmax_right']:>14.3f}"
                  f"{r[prefix + 'argmax_other_piece']:>20.3f}")
    print(f"(a uniform guess among the trained pieces: p(right) {chance:.3f})")
    (run / f"seed{a.seed}/name_copy_probe.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
