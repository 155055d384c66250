#!/bin/bash
cd /work/main
R=bench/results/2026-12-03-asyncio-client
for i in 1 2 3; do
  echo "start asyncio run$i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/chain.log
  .venv/bin/python bench/served_path.py --client asyncio --out $R/served_path_asyncio_run$i.json > $R/served_path_asyncio_run$i.log 2>&1
  echo "end rc $? $(date -u +%H:%M:%S)" >> $R/chain.log
done
for i in 1 2 3; do
  echo "start asyncio si4 run$i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/chain.log
  .venv/bin/python bench/served_path.py --client asyncio --stream-interval 4 --out $R/served_path_asyncio_si4_run$i.json > $R/served_path_asyncio_si4_run$i.log 2>&1
  echo "end rc $? $(date -u +%H:%M:%S)" >> $R/chain.log
done
echo done >> $R/chain.log
