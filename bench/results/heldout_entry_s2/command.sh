# the pre-registered block command (bench/prereg_paired.json, seed 2), run in a clean worktree of d93277b
# whose runs/heldout_entry/data is a copy of bench/results/heldout_entry_data (seed 0's 01 rows, reused)
python bench/experiment_learning.py --out runs/heldout_entry --seeds 1 --first-seed 2 --task-seed 20261207 --stale-vary --stale-compose --entry-split --plain-frac 1 --inspect find --warmup-plain --n-heldout 48 --n-dev 48 --eval-on heldout --recovery-samples 8 --sft-only --require-commit d93277b
python bench/experiment_paired.py --block runs/heldout_entry --block-seed 2 --keep-block bench/results/heldout_entry_s2
