# the pre-registered block command (bench/prereg_paired.json, seed 0), run in a clean worktree of d93277b
python bench/experiment_learning.py --out runs/heldout_entry --seeds 1 --first-seed 0 --task-seed 20261207 --stale-vary --stale-compose --entry-split --plain-frac 1 --inspect find --warmup-plain --n-heldout 48 --n-dev 48 --eval-on heldout --recovery-samples 8 --sft-only --require-commit d93277b
python bench/experiment_paired.py --block runs/heldout_entry --block-seed 0 --keep-block bench/results/heldout_entry_s0
