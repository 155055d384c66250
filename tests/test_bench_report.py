"""bench/report.py judges the issue's targets on every run given, from the results JSON."""

from bench.report import decode_targets_table, targets_table, throughput_table


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


def test_decode_targets_are_left_out_of_runs_without_the_single_stream_section():
    assert decode_targets_table([_run(1.5, 0.43)]) == ""
