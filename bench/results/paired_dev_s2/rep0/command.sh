#!/usr/bin/env bash
# paired dev replicate 0 on the dev block dev_entry_s2 (seed 2): fork vs standard+retry GRPO
cd /work/exp
date +%s > runs/paired_dev_r0.start
OMP_NUM_THREADS=1 nice -n -10 python bench/experiment_paired.py --block bench/results/dev_entry_s2 --block-seed 2 \
  --out runs/paired_dev_r0 --replicates 0 --grpo-steps 16 >> runs/paired_dev_r0.log 2>&1
echo "exit $? at $(date)" >> runs/paired_dev_r0.log
