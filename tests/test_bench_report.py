"""bench/report.py judges the issue's targets on every run given, from the results JSON."""

import json

import pytest

from bench.report import (
    decode_targets_table,
    main,
    security_table,
    served_path_targets_table,
    targets_table,
    throughput_table,
)


def _run(ratio32: float, fraction64: float, single: float = 1.2) -> dict:
    rows = []
    for dtype in ("float32", "bfloat16"):
        for n in (1, 8, 32, 64):
            ratio = ratio32 if n == 32 else (single if n == 1 else 1.5)
            rows.append(
                {
                    "dtype": dtype,
                    "concurrency": n,
                    "paged": 100.0 * ratio,
                    "default": 100.0,
                    "transformers": 100.0,
                    "paged_vs_transformers": ratio,
                    "paged_roofline_fraction": fraction64 if n == 64 else 0.1,
                    "projection_floor_ms": 30.0,
                    "ceiling_vs_transformers": 2.5,
                }
            )
    waste = {
        "paged": {"waste_of_reserved": 0.0405},
        "paged_block_8": {"waste_of_reserved": 0.0194},
    }
    return {"throughput": rows, "kv_waste": waste, "admission": {"ratio": 32.0}}


def test_a_target_met_in_some_runs_says_how_many():
    table = targets_table([_run(1.5, 0.43), _run(1.6, 0.35), _run(3.1, 0.41)])
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()}
    assert lines["paged >= 40% of the bf16 roofline at 64 requests"].endswith(
        "| 43% / 35% / 41% | in 2 of 3 runs |"
    )
    three_x = lines["paged >= 3x transformers at 32 requests, bfloat16"]
    assert "1.50x / 1.60x / 3.10x" in three_x and "in 1 of 3 runs" in three_x
    assert "projections alone allow 2.50x / 2.50x / 2.50x" in three_x
    assert lines["paged KV waste under 4% (blocks of 16, the default)"].endswith(
        "| 4.05% of reserved (deterministic) | no; 1.94% with blocks of 8 |"
    )
    assert lines["paged admits >= 3x the contiguous cache's sequences"].endswith("| yes |")


def test_single_request_target_fails_below_parity():
    table = targets_table([_run(1.5, 0.5, single=0.9)])
    assert "| single-request decode no slower than transformers, float32 | 0.90x | no |" in table


def test_throughput_table_has_a_row_per_dtype_and_concurrency():
    table = throughput_table(_run(1.5, 0.43))
    assert len(table.splitlines()) == 2 + 8
    assert "| bfloat16 | 64 | 150 | 100 | 100 | 1.50x | 43% | 30.0 | 2.50x |" in table


def _decode_run(ratios: dict[str, float], fraction32: float, fraction64: float) -> dict:
    run = _run(1.5, fraction64)
    for row in run["throughput"]:
        if row["dtype"] == "bfloat16" and row["concurrency"] == 32:
            row["paged_roofline_fraction"] = fraction32
    run["single_stream"] = {
        dtype: {"ms_per_token": 10.0 * ratio, "limit_ms": 10.0, "ratio_to_limit": ratio}
        for dtype, ratio in ratios.items()
    }
    return run


def test_a_run_without_transformers_drops_its_columns_and_issue_3s_targets(tmp_path, capsys):
    from bench.report import main

    run = _run(1.5, 0.43)
    for row in run["throughput"]:
        for key in ("transformers", "paged_vs_transformers", "ceiling_vs_transformers"):
            del row[key]
    roof = {"matmul_flops": 4e11, "tokens_per_s": 1500.0}
    run["roofline"] = {"float32": roof, "bfloat16": roof}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    table = throughput_table(run).splitlines()
    assert table[0] == (
        "| dtype | concurrent | paged tok/s | default tok/s | paged / roofline "
        "| projections alone, ms/step |"
    )
    assert "| bfloat16 | 64 | 150 | 100 | 43% | 30.0 |" in table
    assert "transformers" not in out and "issue 3" not in out


def test_decode_targets_judge_single_stream_and_batch_roofline_on_every_run():
    runs = [
        _decode_run({"float32": 1.2, "bfloat16": 1.3}, 0.56, 0.66),
        _decode_run({"float32": 1.25, "bfloat16": 1.1}, 0.54, 0.70),
    ]
    table = decode_targets_table(runs)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()}
    assert lines["one stream within 1.25x of the weight-streaming limit, float32"].endswith(
        "| 1.20x / 1.25x | yes |"
    )
    assert lines["one stream within 1.25x of the weight-streaming limit, bfloat16"].endswith(
        "| 1.30x / 1.10x | in 1 of 2 runs |"
    )
    assert lines["paged >= 55% of the bf16 roofline at 32 requests"].endswith(
        "| 56% / 54% | in 1 of 2 runs |"
    )
    assert lines["paged >= 65% of the bf16 roofline at 64 requests"].endswith("| 66% / 70% | yes |")


def test_the_memory_bound_on_the_batch_fractions_is_said_where_the_runs_measured_it():
    runs = [
        _decode_run({"float32": 1.0, "bfloat16": 1.1}, 0.30, 0.35),
        _decode_run({"float32": 1.0, "bfloat16": 1.1}, 0.50, 0.60),
    ]
    assert "memory's bound" not in decode_targets_table(runs)  # older runs: not measured
    for run, bounds in zip(runs, ((0.71, 0.62), (0.9, 0.8)), strict=True):
        for row in run["throughput"]:
            if row["dtype"] == "bfloat16" and row["concurrency"] in (32, 64):
                row["memory_ceiling_roofline_fraction"] = bounds[row["concurrency"] == 64]
    said = decode_targets_table(runs).splitlines()[-1]
    assert said.startswith("The memory's bound on those fractions")
    assert said.endswith("32 requests 71% / 90%; 64 requests 62% / 80%.")


def test_decode_targets_are_left_out_of_runs_without_the_single_stream_section():
    assert decode_targets_table([_run(1.5, 0.43)]) == ""


def _served_run(ratios: dict[tuple[str, int], float]) -> dict:
    rows = [
        {
            "dtype": dtype,
            "concurrency": n,
            "engine_tok_s": 100.0,
            "served_tok_s": 100.0 * ratio,
            "served_over_engine": ratio,
        }
        for (dtype, n), ratio in ratios.items()
    ]
    return {"rows": rows, "target": 0.95}


def test_the_served_path_is_judged_per_dtype_and_concurrency_on_every_run():
    first = {("float32", 1): 0.97, ("float32", 32): 0.90, ("bfloat16", 64): 0.96}
    second = {("float32", 1): 0.96, ("float32", 32): 0.96, ("bfloat16", 64): 0.94}
    table = served_path_targets_table([_served_run(first), _served_run(second)])
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()}
    assert lines["served >= 95% of the in-process engine, float32, 1 stream"].endswith(
        "| 0.970 / 0.960 | yes |"
    )
    assert lines["served >= 95% of the in-process engine, float32, 32 streams"].endswith(
        "| 0.900 / 0.960 | in 1 of 2 runs |"
    )
    assert lines["served >= 95% of the in-process engine, bfloat16, 64 streams"].endswith(
        "| 0.960 / 0.940 | in 1 of 2 runs |"
    )
    assert len(lines) == 2 + 3  # header, rule, one row per measured dtype and concurrency


def test_runs_at_a_stream_interval_say_so_and_are_never_mixed_with_others():
    runs = [_served_run({("bfloat16", 32): 0.96}) for _ in range(2)]
    assert "streamInterval" not in served_path_targets_table(runs)  # the default: every token
    for run in runs:
        run["stream_interval"] = 4
    table = served_path_targets_table(runs)
    assert "| served >= 95% of the in-process engine, bfloat16, 32 streams, streamInterval 4 |" in (
        table
    )
    runs[1]["stream_interval"] = 1
    with pytest.raises(ValueError, match="runs at different stream intervals: 4, 1"):
        served_path_targets_table(runs)


def test_runs_with_the_asyncio_client_say_so_and_are_never_mixed_with_others():
    runs = [_served_run({("bfloat16", 64): 0.96}) for _ in range(2)]
    assert "client" not in served_path_targets_table(runs)  # the default: a thread per stream
    for run in runs:
        run["client"] = "asyncio"
        run["stream_interval"] = 4
    table = served_path_targets_table(runs)
    assert (
        "| served >= 95% of the in-process engine, bfloat16, 64 streams, streamInterval 4, "
        "asyncio client |" in table
    )
    runs[0]["client"] = "threads"
    with pytest.raises(ValueError, match="runs with different clients: threads, asyncio"):
        served_path_targets_table(runs)


def test_runs_with_a_side_load_row_show_it_beside_served_over_engine():
    runs = [_served_run({("bfloat16", 1): 0.97, ("bfloat16", 64): 0.90}) for _ in range(2)]
    for run, side, client in zip(runs, (0.88, 0.91), (0.93, 0.94), strict=True):
        run["rows"][1]["side_load_engine_over_engine"] = side
        run["rows"][1]["client_load_engine_over_engine"] = client
    table = served_path_targets_table(runs)
    assert "| the gap explained (runs 1 / 2) |" in table
    row = "| bfloat16, 64 streams | 0.900 / 0.900 | 0.880 / 0.910 | 0.930 / 0.940 |"
    assert row in table.splitlines()
    assert "bfloat16, 1 streams" not in table  # that row was measured without a side load


def test_rows_with_the_floor_show_the_engine_beside_the_bare_grpc_chain():
    runs = [_served_run({("bfloat16", 1): 0.89, ("bfloat16", 64): 0.90}) for _ in range(2)]
    for run, floor, relay in zip(runs, (0.93, 0.94), (250.0, 310.0), strict=True):
        run["rows"][0]["floor_engine_over_engine"] = floor
        run["rows"][0]["floor_cpu_us_per_message"] = {
            "upstream_us": 300.0,
            "relay_us": relay,
            "client_us": 150.0,
        }
        run["rows"][0]["served_cpu_ms_per_1k_tokens"] = {
            "controller": 600.0,
            "bench": 300.0,
            "worker": 15000.0,
        }
    table = served_path_targets_table(runs)
    assert "| the ceiling of a gRPC served path (runs 1 / 2) |" in table
    row = "| bfloat16, 1 stream | 0.890 / 0.890 | 0.930 / 0.940 | 400 / 460 | 900 / 900 |"
    assert row in table.splitlines()
    assert "bfloat16, 64 streams | 0.900 / 0.900 | 0.9" not in table  # a row measured without it
    del runs[1]["rows"][0]["floor_engine_over_engine"]  # a run from before the floor: no table
    assert "ceiling of a gRPC served path" not in served_path_targets_table(runs)


def test_the_weights_table_has_a_row_per_format_with_quality_and_speed():
    from bench.report import weights_table

    def row(fmt, mib, agreement=None):
        return {
            "format": fmt,
            "dtype": "bfloat16",
            "weight_bytes": mib << 20,
            "perplexity": 17.3,
            "passage_tokens": 1213,
            "projections_ms": {"1": 5.0, "32": 20.0},
            "tokens_per_s": {"1": 40.0, "32": 300.0},
            **({"agreement": agreement} if agreement else {}),
        }

    run = {
        "workload": {"num_prompts": 32, "quality_tokens": 64, "concurrency": [1, 32]},
        "weight_formats": [
            row("dequantized", 313),
            row("int4", 146, {"until_first_divergence": 0.8, "identical_overall": 0.85}),
        ],
    }
    lines = weights_table(run).splitlines()
    assert lines[0].startswith("| format | weights MiB |") and "tok/s x32" in lines[0]
    assert lines[2] == (
        "| dequantized (bfloat16) | 313 | reference | reference | 17.300 | 40 | 300 | 5.0 | 20.0 |"
    )
    assert lines[3].startswith("| int4 (bfloat16) | 146 | 80.0% | 85.0% |")
    assert "32 prompts x 64 greedy tokens" in lines[-1] and "1213 tokens" in lines[-1]


def test_the_weights_table_gives_each_format_its_own_roofline_when_measured():
    from bench.report import weights_table

    def row(fmt, against, fraction):
        return {
            "format": fmt,
            "dtype": "bfloat16",
            "weight_bytes": 100 << 20,
            "perplexity": 17.3,
            "passage_tokens": 1213,
            "projections_ms": {"32": 20.0},
            "tokens_per_s": {"32": 300.0},
            "roofline": against,
            "roofline_fraction": {"32": fraction},
        }

    run = {
        "workload": {"num_prompts": 32, "quality_tokens": 64, "concurrency": [32]},
        "roofline": {
            "bfloat16": {"ops_per_s": 817e9, "tokens_per_s": 3037.0},
            "int8": {"ops_per_s": 1930e9, "tokens_per_s": 7175.0},
        },
        "weight_formats": [row("dequantized", "bfloat16", 0.38), row("int8", "int8", 0.09)],
    }
    lines = weights_table(run).splitlines()
    assert "ceilings: bfloat16 817 GOP/s, int8 1930 GOP/s" in lines[-4]
    assert lines[-2:] == ["| dequantized | 32 | bfloat16 | 38.0% |", "| int8 | 32 | int8 | 9.0% |"]


def _security(ratios: list[float], streams: int = 32) -> dict:
    return {
        "streams": streams,
        "rounds": [{"secure_over_insecure": x} for x in ratios],
        "cost_percent": 100 * (1 - sorted(ratios)[len(ratios) // 2]),
    }


def test_security_is_judged_on_every_round_pooled_with_its_interval():
    # two runs: one that alone looks over budget, one under; pooled, the median is 2% and the
    # interval's top stays under 5%
    noisy = [0.92, 0.99, 0.98, 0.97, 0.985, 0.975, 0.98, 1.01]
    table = security_table([_security(noisy[:4]), _security(noisy[4:])], ["a.json", "b.json"])
    assert "| a.json | 32 | 0.920 / 0.990 / 0.980 / 0.970 |" in table
    assert "8 rounds from 2 runs; cost median 2.0%" in table
    assert "rounds above 5%: 1" in table
    assert table.endswith("met.")


def test_security_over_budget_or_too_uncertain_is_not_met():
    over = security_table([_security([0.93, 0.94, 0.95, 0.92])], ["a.json"])
    assert over.endswith("not met.")
    # a median under 5% whose interval reaches past it is not enough either
    wide = security_table([_security([0.99, 0.90, 0.98, 0.89, 0.97])], ["a.json"])
    assert "cost median 3.0%" in wide and wide.endswith("not met.")


def test_security_rounds_at_other_concurrency_are_listed_not_pooled():
    table = security_table([_security([0.99, 0.98]), _security([0.5, 0.5], 8)], ["a", "b"])
    assert "| b | 8 | 0.500 / 0.500 |" in table
    assert "2 rounds from 1 run;" in table


def test_the_report_command_reads_security_results(tmp_path, capsys):
    path = tmp_path / "security_run1.json"
    path.write_text(json.dumps(_security([0.99, 0.97])))
    assert main([str(path)]) == 0
    assert "Pooled at 32 streams: 2 rounds from 1 run;" in capsys.readouterr().out


def test_a_runs_machine_is_described_and_what_it_lacks_is_said(tmp_path):
    from bench.machine import describe, machine_info

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Example CPU\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16\n"
        "processor\t: 1\nmodel name\t: Example CPU\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16\n"
    )
    info = machine_info(cpuinfo)
    assert info["cpu"] == "Example CPU" and info["isa"] == ["avx512f", "avx512_bf16", "amx_bf16"]
    assert describe(info).endswith("cores, avx512f avx512_bf16 amx_bf16")
    assert describe({"cpu": "x86_64"}) == "x86_64, instruction sets not recorded"
    assert describe({"cpu": "Old", "cores": 2, "isa": []}) == "Old, 2 cores, no AVX-512 or AMX"


def test_the_report_names_the_machine_of_each_run_when_they_differ():
    from bench.report import machine_lines

    amd = {"machine": {"cpu": "AMD EPYC", "cores": 2, "isa": ["avx512f"]}}
    xeon = {"machine": {"cpu": "Xeon", "cores": 2, "isa": ["avx512f", "amx_bf16"]}}
    assert machine_lines([amd, amd]) == "machine: AMD EPYC, 2 cores, avx512f"
    assert machine_lines([amd, xeon]).splitlines() == [
        "machine, run 1: AMD EPYC, 2 cores, avx512f",
        "machine, run 2: Xeon, 2 cores, avx512f amx_bf16",
    ]
    assert machine_lines([{"machine": "x86_64"}]) == ""  # the served bench's old string
