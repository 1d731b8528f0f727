#!/usr/bin/env bash
# paired dev replicate 2 on the dev block dev_entry_s2 (seed 2): fork vs standard+retry GRPO, 32 steps,
# a curve point at 16 (2 forks per state) and the endpoint at 32 (8 forks per state); no secondary endpoints
cd /work/exp2
date +%s > runs/paired_dev_r2.start
echo "started $(date) at $(git rev-parse HEAD)" >> runs/paired_dev_r2.log
OMP_NUM_THREADS=1 nice -n -10 python bench/experiment_paired.py --block bench/results/dev_entry_s2 --block-seed 2 \
  --out runs/paired_dev_r2 --replicates 2 --grpo-steps 32 --no-secondary >> runs/paired_dev_r2.log 2>&1
echo "exit $? at $(date)" >> runs/paired_dev_r2.log
date +%s > runs/paired_dev_r2.end
