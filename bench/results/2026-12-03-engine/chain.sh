#!/bin/bash
# The engine bench (issue 13 parts 2 and 4) at the head of 2026-12-03, engine code unchanged
# since bench/results/2026-12-02-stream-interval: three runs back to back.
cd /work/main
R=bench/results/2026-12-03-engine
for i in 1 2 3; do
  echo "start run$i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/chain.log
  .venv/bin/python bench/engine.py --skip-hf --out $R/engine_run$i.json > $R/engine_run$i.log 2>&1
  echo "end rc $? $(date -u +%H:%M:%S)" >> $R/chain.log
done
echo done >> $R/chain.log
