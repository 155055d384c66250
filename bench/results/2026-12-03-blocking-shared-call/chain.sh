#!/bin/bash
# The served-path bench at its defaults (ControllerClient, a thread per stream, every token a
# message, security on), three runs back to back, after the blocking client's streams moved onto
# one GenerateMany call (bdf11d9).
cd /work/main
R=bench/results/2026-12-03-blocking-shared-call
for i in 1 2 3; do
  echo "start run$i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/chain.log
  .venv/bin/python bench/served_path.py --out $R/served_path_run$i.json > $R/served_path_run$i.log 2>&1
  echo "end rc $? $(date -u +%H:%M:%S)" >> $R/chain.log
done
echo done >> $R/chain.log
