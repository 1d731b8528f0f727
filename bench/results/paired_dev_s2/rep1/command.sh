#!/usr/bin/env bash
# paired dev replicate 1 on the dev block dev_entry_s2 (seed 2): fork vs standard+retry GRPO, 16 steps
cd /work/exp
date +%s > runs/paired_dev_r1.start
echo "started $(date) at $(git rev-parse HEAD)" >> runs/paired_dev_r1.log
OMP_NUM_THREADS=1 nice -n -10 python bench/experiment_paired.py --block bench/results/dev_entry_s2 --block-seed 2 \
  --out runs/paired_dev_r1 --replicates 1 --grpo-steps 16 >> runs/paired_dev_r1.log 2>&1
echo "exit $? at $(date)" >> runs/paired_dev_r1.log
