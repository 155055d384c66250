#!/bin/bash
# The served-path bench at its defaults (a thread per stream, every token a message), three runs
# back to back, with the engine beside the bare two-hop gRPC chain at one stream; then the floor
# alone, three times.
cd /work/main
R=bench/results/2026-12-03-grpc-floor
for i in 1 2 3; do
  echo "start run$i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/chain.log
  .venv/bin/python bench/served_path.py --out $R/served_path_run$i.json > $R/served_path_run$i.log 2>&1
  echo "end rc $? $(date -u +%H:%M:%S)" >> $R/chain.log
done
for i in 1 2 3; do
  echo "start floor$i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/chain.log
  .venv/bin/python bench/grpc_floor.py > $R/grpc_floor_run$i.log 2>&1
  echo "end rc $? $(date -u +%H:%M:%S)" >> $R/chain.log
done
echo done >> $R/chain.log
