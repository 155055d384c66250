#!/bin/bash
# The engine bench (issue 13 parts 2 and 4) after the grouped bf16 and float32 packing (374fd2e, and the float32 one after it): three runs
# back to back, nothing else running.
cd /work/main
R=bench/results/2026-12-03-grouped
for i in 1 2 3; do
  echo "start run$i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/chain.log
  .venv/bin/python bench/engine.py --skip-hf --out $R/engine_run$i.json > $R/engine_run$i.log 2>&1
  echo "end rc $? $(date -u +%H:%M:%S)" >> $R/chain.log
done
echo done >> $R/chain.log
