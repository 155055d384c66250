#!/bin/bash
# The served-path bench at its defaults, three runs back to back, now with the engine beside the
# bare two-hop gRPC chain at 1, 32 and 64 streams (a call and a client thread per stream).
cd /work/main
R=bench/results/2026-12-03-grpc-floor-batches
for i in 1 2 3; do
  echo "start run$i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/chain.log
  .venv/bin/python bench/served_path.py --out $R/served_path_run$i.json > $R/served_path_run$i.log 2>&1
  echo "end rc $? $(date -u +%H:%M:%S)" >> $R/chain.log
done
for s in 1 32 64; do
  echo "start floor streams $s $(date -u +%H:%M:%S)" >> $R/chain.log
  p=$(python3 -c "print({1: 8, 32: 25, 64: 45}[$s])")
  .venv/bin/python bench/grpc_floor.py --streams $s --period-ms $p --messages 200 > $R/grpc_floor_streams$s.log 2>&1
  echo "end rc $? $(date -u +%H:%M:%S)" >> $R/chain.log
done
echo done >> $R/chain.log
