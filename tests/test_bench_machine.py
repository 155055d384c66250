"""bench/machine.py: what a result ran on, read from /proc/cpuinfo, and said in one line."""

from bench.machine import describe, machine_info

CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni amx_bf16 amx_tile
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni amx_bf16 amx_tile
"""


def test_the_cpu_and_the_kernel_flags_it_has_in_their_own_order(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO)
    info = machine_info(cpuinfo)
    assert info["cpu"] == "Intel(R) Xeon(R) Platinum 8480C"
    assert info["isa"] == ["avx512f", "avx512_vnni", "amx_bf16"]  # amx_tile is not a kernel flag
    assert isinstance(info["cores"], int) and info["cores"] >= 1
    assert describe(info) == (
        f"Intel(R) Xeon(R) Platinum 8480C, {info['cores']} cores, avx512f avx512_vnni amx_bf16"
    )


def test_without_cpuinfo_no_flags_are_guessed(tmp_path):
    info = machine_info(tmp_path / "missing")
    assert info["isa"] == [] and info["cpu"]
    assert describe(info).endswith("no AVX-512 or AMX")


def test_an_old_result_says_what_it_did_not_record():
    assert describe({}) == "CPU not recorded, instruction sets not recorded"
