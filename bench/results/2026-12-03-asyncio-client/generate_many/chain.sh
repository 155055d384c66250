#!/bin/bash
# At 2da1ab6: the default client (a thread and a call per stream) and the asyncio client (one
# GenerateMany call) alternated, three runs each at the default stream interval; then the asyncio
# client at streamInterval 4, three runs.
cd /work/main
R=bench/results/2026-12-03-asyncio-client/generate_many
for i in 1 2 3; do
  for client in threads asyncio; do
    echo "start $client run$i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/chain.log
    .venv/bin/python bench/served_path.py --client $client --out $R/served_path_${client}_run$i.json > $R/served_path_${client}_run$i.log 2>&1
    echo "end rc $? $(date -u +%H:%M:%S)" >> $R/chain.log
  done
done
for i in 1 2 3; do
  echo "start asyncio si4 run$i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/chain.log
  .venv/bin/python bench/served_path.py --client asyncio --stream-interval 4 --out $R/served_path_asyncio_si4_run$i.json > $R/served_path_asyncio_si4_run$i.log 2>&1
  echo "end rc $? $(date -u +%H:%M:%S)" >> $R/chain.log
done
echo done >> $R/chain.log
