"""Engine benchmark: the paged engine, the default (contiguous) engine and transformers'
`generate`, side by side in one run on this machine, plus the machine's own matmul ceiling.

    python bench/engine.py                      # full run
    python bench/engine.py --quick              # a smaller run to check the script

Results go to `--out`, by default ~/.cache/intentserve/bench/engine.json
(under `$XDG_CACHE_HOME` when set; bench/out.py): outside the source tree.

Every figure that a target is judged by is a ratio between numbers measured in this same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import machine_info  # noqa: E402
from bench.out import default_out  # noqa: E402
from bench.workloads import (  # noqa: E402
    FLOP_PER_TOKEN,
    ROOFLINE_TARGETS,
    admission,
    decode_read_bytes,
    engine_throughput,
    hf_throughput,
    kv_waste,
    load_models,
    matmul_flops,
    projection_floor,
    single_stream,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# The sizes of a run, and `--quick`'s: the smallest run that still measures every part once, in
# one round (the script's test runs it).
FULL = {"rounds": 5, "matmul_s": 3.0, "waste": (32, 256), "admitted": 256}
QUICK = {"rounds": 1, "matmul_s": 0.5, "waste": (4, 32), "admitted": 16}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 and 4 streams of 8 tokens, one round; KV waste over 4 requests, admission of 16",
    )
    parser.add_argument("--skip-hf", action="store_true", help="leave transformers out")
    parser.add_argument("--out", type=Path, default=default_out("engine.json"))
    args = parser.parse_args(argv)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    max_tokens = args.max_tokens
    sizes = QUICK if args.quick else FULL
    if args.quick:
        concurrency, max_tokens = [1, 4], 8

    results: dict = {
        "machine": {
            **machine_info(),
            "num_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "workload": {"max_tokens": max_tokens, "greedy": True, "ignore_eos": True},
        "roofline": {},
        "throughput": [],
        "single_stream": {},
    }
    for name in args.dtypes.split(","):
        dtype = DTYPES[name]
        flops = matmul_flops(dtype, seconds=sizes["matmul_s"])
        results["roofline"][name] = {"matmul_flops": flops, "tokens_per_s": flops / FLOP_PER_TOKEN}
        print(
            f"[{name}] matmul ceiling {flops / 1e9:.1f} GFLOP/s "
            f"= {flops / FLOP_PER_TOKEN:.0f} tok/s roofline",
            flush=True,
        )
        models = load_models(dtype, with_hf=not args.skip_hf)
        single = single_stream(models, rounds=sizes["rounds"])
        results["single_stream"][name] = single
        print(
            f"[{name}] one stream {single['ms_per_token']:.2f} ms/token; weight-streaming limit "
            f"{single['limit_ms']:.2f} ms ({single['weight_bytes_per_step'] / 1e6:.0f} MB at "
            f"{single['read_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s read) = "
            f"{single['ratio_to_limit']:.2f}x the limit "
            f"({'met' if single['met'] else 'not met'}: <= {single['target_ratio']}x)",
            flush=True,
        )
        for n in concurrency:
            row = {"dtype": name, "concurrency": n}
            for kind in ("paged", "default"):
                row[kind] = engine_throughput(models, kind, n, max_tokens)
            if not args.skip_hf:
                row["transformers"] = hf_throughput(models, n, max_tokens)
            roof = results["roofline"][name]["tokens_per_s"]
            row["paged_roofline_fraction"] = row["paged"] / roof
            if name == "bfloat16" and n in ROOFLINE_TARGETS:
                row["roofline_target"] = ROOFLINE_TARGETS[n]
                row["roofline_target_met"] = row["paged_roofline_fraction"] >= ROOFLINE_TARGETS[n]
            # The most any engine on these weights could give: projections + LM head alone.
            floor_s = projection_floor(models, n)
            row["projection_floor_ms"] = floor_s * 1e3
            row["projection_ceiling_tokens_per_s"] = n / floor_s
            if "transformers" in row:
                row["paged_vs_transformers"] = row["paged"] / row["transformers"]
                row["ceiling_vs_transformers"] = (
                    row["projection_ceiling_tokens_per_s"] / row["transformers"]
                )
            # The memory's bound: the bytes a step reads at the bandwidth measured above.
            read_s = decode_read_bytes(models, n, max_tokens) / single["read_bandwidth_bytes_per_s"]
            row["memory_floor_ms"] = read_s * 1e3
            row["memory_ceiling_tokens_per_s"] = n / read_s
            row["memory_ceiling_roofline_fraction"] = n / read_s / roof
            results["throughput"].append(row)
            line = f"[{name}] n={n:<3} paged {row['paged']:7.1f} tok/s"
            line += f"  default {row['default']:7.1f}"
            if "transformers" in row:
                line += f"  transformers {row['transformers']:7.1f}"
                line += f"  x{row['paged_vs_transformers']:.2f}"
            line += f"  roofline {row['paged_roofline_fraction']:.1%}"
            if "roofline_target" in row:
                verdict = "met" if row["roofline_target_met"] else "not met"
                line += f" ({verdict}: >= {row['roofline_target']:.0%})"
            line += f" (memory-bound {row['memory_ceiling_roofline_fraction']:.0%})"
            line += f"  | projections alone {row['projection_floor_ms']:.1f} ms/step"
            line += f" -> ceiling {row['projection_ceiling_tokens_per_s']:.0f} tok/s"
            if "transformers" in row:
                line += f" = x{row['ceiling_vs_transformers']:.2f} transformers"
            print(line, flush=True)
        if name == "bfloat16" or len(args.dtypes.split(",")) == 1:
            results["kv_waste"] = kv_waste(models, *sizes["waste"])
            results["admission"] = admission(models, num_requests=sizes["admitted"])
            print(json.dumps({k: results[k] for k in ("kv_waste", "admission")}, indent=2))
        del models
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    t0 = time.time()
    code = main()
    print(f"total {time.time() - t0:.0f} s")
    sys.exit(code)
