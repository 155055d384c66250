#!/bin/bash
# The served-path bench at its defaults (ControllerClient, a thread per stream, every token a
# message, security on), three runs back to back, after the grouped bf16 and float32 packing
# (aee6f2e): the engine got faster at one stream, so served / engine is measured again.
cd /work/main
R=bench/results/2026-12-03-grouped
for i in 1 2 3; do
  echo "start run$i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/served_chain.log
  .venv/bin/python bench/served_path.py --out $R/served_path_run$i.json > $R/served_path_run$i.log 2>&1
  echo "end rc $? $(date -u +%H:%M:%S)" >> $R/served_chain.log
done
echo done >> $R/served_chain.log
