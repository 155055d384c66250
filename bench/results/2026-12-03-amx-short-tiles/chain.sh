#!/bin/sh
# At 614b4f3 on the AMX VM (tiles as short as the rows): the engine bench three times, the
# weight formats once (--quick), then the served path three times; back to back, nothing else
# running.
cd "$(dirname "$0")/../../.." || exit 1
D=bench/results/2026-12-03-amx-short-tiles
for i in 1 2 3; do
  echo "engine run $i start $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/chain.log
  .venv/bin/python bench/engine.py --skip-hf --out $D/engine_run$i.json > $D/engine_run$i.log 2>&1
  echo "engine run $i end $(date +%H:%M:%S) rc $?" >> $D/chain.log
done
echo "weights start $(date +%H:%M:%S)" >> $D/chain.log
.venv/bin/python bench/weights.py --quick --out $D/weights_quick.json > $D/weights_quick.log 2>&1
echo "weights end $(date +%H:%M:%S) rc $?" >> $D/chain.log
for i in 1 2 3; do
  echo "served_path run $i start $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/chain.log
  .venv/bin/python bench/served_path.py --out $D/served_path_run$i.json > $D/served_path_run$i.log 2>&1
  echo "served_path run $i end $(date +%H:%M:%S) rc $?" >> $D/chain.log
done
echo done >> $D/chain.log
