#!/usr/bin/env bash
# The whole ReTerm pipeline, 01 -> 05, on CPU: a tiny random Qwen3 model, the bundled tasks and
# real Docker. Same five scripts as the paper-scale run, with small flags. About 5 min on 2 cores
# once set up (the first run also installs packages and builds the task images).
#   bash run_tiny.sh [OUT]      (OUT defaults to runs/tiny-<time>; an existing OUT resumes)
set -euo pipefail
cd "$(dirname "$0")"
OUT=${1:-runs/tiny-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run_tiny.log") 2>&1
bash setup.sh
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING}
# The tiny model is Qwen3-shaped: vLLM's CPU build can't import its Qwen3.5 module (it needs
# torchvision, which has no CPU build beside torch+cpu here). GPU users use Qwen3.5-9B.
ROLL=(--engine vllm --max-turns 4 --max-tokens 96 --command-timeout 30)
python3 -c 'import vllm' 2>/dev/null || ROLL=(--engine hf --max-turns 4 --max-tokens 96 --command-timeout 30)
[ -f "$OUT/base/config.json" ] || python3 common.py tiny-model "$OUT/base" --arch qwen3

echo "== 01 build recovery data (oracle teacher, verified in Docker)"
python3 01_build_data.py --tasks tasks --teacher oracle --out "$OUT/data/reterm.jsonl" \
  --faults-per-task 1 --concurrency 4
echo "== 02 SFT cold start"
python3 02_sft.py --data "$OUT/data/reterm.jsonl" --model "$OUT/base" --out "$OUT/sft" \
  --max-steps 40 --lr 3e-3 --warmup-steps 4 --max-len 8192 --micro-batch-tokens 8192 --grad-accum 1 \
  --save-every 20
echo "== 03 collect failure states"
python3 03_collect_failures.py --tasks tasks --model "$OUT/sft/final" --out "$OUT/failures" \
  --attempts 1 --concurrency 8 --max-context 8192 "${ROLL[@]}"
echo "== 04 ReTerm-GRPO (fork mode)"
python3 04_reterm_grpo.py --failures "$OUT/failures/failures.jsonl" --tasks tasks \
  --model "$OUT/sft/final" --out "$OUT/grpo" --steps 2 --groups-per-step 2 --group-size 4 \
  --lr 1e-4 --dtype float32 --max-context 8192 --concurrency 8 "${ROLL[@]}"
python3 common.py plot "$OUT/grpo" --out "$OUT/grpo/metrics.png"   # 04's curves, one panel per metric
# 04 is done with stage 03's failure states: their snapshot images go (a real run keeps them for
# later 04 runs until `python3 common.py reap --kept`)
python3 common.py reap --failures "$OUT/failures/failures.jsonl"
echo "== 05 evaluate (Pass@1 and Recovery@1)"
python3 05_eval_tb2.py --tasks tasks --agent policy --model "$OUT/grpo/final" --out "$OUT/eval" \
  --dtype float32 --max-context 8192 --concurrency 8 --recovery "${ROLL[@]}"

python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rd = lambda p: [json.loads(x) for x in (out / p).read_text().splitlines() if x.strip()]
stats = json.loads((out / "data/reterm.jsonl.stats.json").read_text())
sft, grpo = rd("sft/metrics.jsonl"), rd("grpo/metrics.jsonl")
summary = json.loads((out / "eval/summary.json").read_text())
print("\n== tiny pipeline: headline figures ==")
print(f"01 rows (verified recoveries)   : {stats.get('rows')} over {stats.get('tasks_covered')} tasks")
print(f"02 SFT loss first -> last       : {sft[0]['loss']:.3f} -> {sft[-1]['loss']:.3f}")
fail = json.loads((out / "failures/summary.json").read_text())
print(f"03 failure states               : {fail['n_failures']} (pass rate {fail['pass_rate']:.3f})"
      f" by category {fail['by_category']}")
print(f"04 GRPO recovery reward by step : {[round(m['reward'], 3) for m in grpo]}"
      f" ({sum(m['groups_dropped'] for m in grpo)}/{sum(m['groups'] for m in grpo)} groups uniform)")
print(f"05 Pass@1                       : {summary['pass_at_1']:.3f} over {summary['n_tasks']} tasks")
print(f"05 Recovery@1                   : {summary.get('recovery_at_1', float('nan')):.3f}")
PY
