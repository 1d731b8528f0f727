#!/usr/bin/env bash
# held-out replicate 1 on the held-out block heldout_entry_s2 (seed 2), the pre-registered replicate
# command (bench/prereg_paired.json), run in a clean worktree of d93277b into which
# bench/results/heldout_entry_s2 was copied (the frozen commit predates it)
cd /work/ho
date -u +%FT%TZ > runs/rep1_start.txt
OMP_NUM_THREADS=1 nice -n -10 python bench/experiment_paired.py --block bench/results/heldout_entry_s2 --block-seed 2 \
  --out runs/paired_heldout --replicates 1 --grpo-steps 32 --require-commit d93277b > runs/rep1.log 2>&1
echo $? > runs/rep1_rc.txt
date -u +%FT%TZ > runs/rep1_end.txt
