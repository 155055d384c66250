"""bench/decode_attention.py runs the compiled kernel end to end and reports what it read."""

import json
import shutil

import pytest

from bench.decode_attention import FIRST_CONTEXT, HEAD_DIM, KV_HEADS, LAYERS, Step, main

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")),
        reason="the bench runs the compiled kernel; no C compiler on this machine",
    ),
]


def test_a_small_run_reports_each_timing_and_the_bytes_of_its_step(tmp_path, capsys):
    out = tmp_path / "attention.json"
    assert main(["--sequences", "3", "--rounds", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    contexts = Step(3, 1).context.tolist()
    assert contexts == [FIRST_CONTEXT, FIRST_CONTEXT + 37, FIRST_CONTEXT + 74]
    assert result["kv_bytes_per_step"] == sum(contexts) * KV_HEADS * HEAD_DIM * 2 * 2 * LAYERS
    assert all(result[f"{name}_ms"] > 0 for name in ("cold", "hot", "read"))
    assert "cold / read" in capsys.readouterr().out


def test_bad_sizes_are_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        main(["--sequences", "0"])
    assert "--sequences" in capsys.readouterr().err
