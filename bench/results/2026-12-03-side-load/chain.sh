#!/bin/sh
# The served-path bench three times back to back at 01b80ce (the side load now wakes as the
# served run's client and controller do), nothing else running.
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/2026-12-03-side-load
for i in 1 2 3; do
  echo "served_path run $i start $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/chain.log
  .venv/bin/python bench/served_path.py --out $D/served_path_run$i.json > $D/served_path_run$i.log 2>&1
  echo "served_path run $i end $(date +%H:%M:%S) rc $?" >> $D/chain.log
done
