"""The kernels' ISA variants: `auto` loads the fastest this CPU runs, an operator may force any
variant this CPU runs, and a forced variant it cannot run is refused by name (by the kernels'
loaders as a reason, by the engine as a start-up error), never loaded."""

import platform
import shutil

import pytest
from intentserve.worker import kernels
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.kernels import KernelUnavailable, library, variants
from intentserve.worker.kernels.__main__ import main as kernels_main
from intentserve.worker.kernels.table import KERNEL_NAMES
from intentserve.worker.kernels.variants import (
    AMX,
    AVX512,
    NATIVE,
    VARIANT_ENV,
    X86_64_V3,
    KernelVariantError,
)
from intentserve.worker.model.registry import load_model

from tests.worker.model.kernel_paths import forced_variant
from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config, write_hf_folder


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    config = tiny_config()
    return write_hf_folder(tmp_path_factory.mktemp("tiny"), config, random_hf_weights(config))


def build_engine_on(folder):
    """A paged engine on a fresh load of the tiny model (the build rewrites the model it is given
    for the kernels it finds, so each variant gets its own)."""
    return (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=64, max_num_seqs=2)
        .build(loaded=load_model(str(folder), dtype="float32"))
    )


HAS_CC = any(shutil.which(name) for name in ("cc", "gcc", "clang"))
V2 = [f for f in X86_64_V3.needs if f not in ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma")]


@pytest.fixture
def cpu(monkeypatch):
    """Makes this process see an x86-64 CPU with the given /proc/cpuinfo flags."""

    def have(flags, machine="x86_64"):
        monkeypatch.setattr(variants, "cpu_flags_line", lambda: "flags : " + " ".join(flags))
        monkeypatch.setattr(variants.platform, "machine", lambda: machine)

    monkeypatch.delenv(VARIANT_ENV, raising=False)
    library._load_library.cache_clear()
    yield have
    library._load_library.cache_clear()


@pytest.mark.parametrize(
    ("flags", "machine", "expected"),
    [
        (AMX.needs, "x86_64", AMX),
        (AVX512.needs, "x86_64", AVX512),  # e.g. Zen 4, or Sapphire Rapids without AMX
        ([f for f in AVX512.needs if f != "avx512_bf16"], "x86_64", X86_64_V3),
        (X86_64_V3.needs, "x86_64", X86_64_V3),
        (V2, "x86_64", NATIVE),  # no portable variant runs: built for this CPU
        (AMX.needs, "aarch64", NATIVE),
    ],
)
def test_auto_loads_the_fastest_variant_this_cpu_runs(cpu, monkeypatch, flags, machine, expected):
    cpu(flags, machine)
    for setting in (None, "auto", " AUTO "):
        if setting is not None:
            monkeypatch.setenv(VARIANT_ENV, setting)
        assert variants.choose() == variants.Choice(expected, forced=False)


@pytest.mark.parametrize(
    ("name", "flags", "machine", "lacks"),
    [
        ("amx", AVX512.needs, "x86_64", "amx_tile, amx_bf16, amx_int8"),
        ("avx512", X86_64_V3.needs, "x86_64", "avx512f, avx512bw"),
        ("x86-64-v3", [f for f in X86_64_V3.needs if f != "avx2"], "x86_64", "avx2"),
        ("avx512", AMX.needs, "aarch64", "an x86-64 CPU"),
    ],
)
def test_a_forced_variant_this_cpu_cannot_run_is_refused_by_name(
    cpu, monkeypatch, name, flags, machine, lacks
):
    cpu(flags, machine)
    monkeypatch.setenv(VARIANT_ENV, name)
    with pytest.raises(KernelVariantError, match=f"{VARIANT_ENV}={name}: .*lacks {lacks}"):
        variants.choose()
    # Every loader says why and its caller keeps its torch path: never an illegal instruction.
    with pytest.raises(KernelUnavailable, match=f"{VARIANT_ENV}={name}: .*lacks {lacks}"):
        kernels.fused_ops()


@pytest.mark.parametrize("name", ["amx", "avx512", "x86-64-v3", "native"])
def test_a_variant_this_cpu_runs_can_be_forced(cpu, monkeypatch, name):
    cpu(AMX.needs)
    monkeypatch.setenv(VARIANT_ENV, name)
    assert variants.choose() == variants.Choice(variants.VARIANTS[name], forced=True)


def test_an_unknown_variant_names_the_setting_and_the_allowed_values(cpu, monkeypatch):
    monkeypatch.setenv(VARIANT_ENV, "avx9000")
    allowed = "allowed: auto, amx, avx512, x86-64-v3, native"
    with pytest.raises(KernelVariantError, match=f"{VARIANT_ENV}='avx9000': {allowed}"):
        variants.choose()


def test_a_portable_variant_is_keyed_by_its_name_native_by_this_cpu(cpu, monkeypatch):
    cpu(AMX.needs)
    paths = {v.name: library._plan("paged_decode", v)[2] for v in variants.VARIANTS.values()}
    assert len(set(paths.values())) == len(paths)  # each variant its own library
    monkeypatch.setattr(library, "_cpu_signature", lambda: "another machine")
    for variant in variants.PORTABLE:  # found on any host that runs it
        assert library._plan("paged_decode", variant)[2] == paths[variant.name]
    assert library._plan("paged_decode", NATIVE)[2] != paths["native"]  # this CPU's only


HOST_HAS_AMX = not variants.missing(AMX)


@pytest.mark.skipif(HOST_HAS_AMX, reason="this CPU has AMX: forcing amx is allowed here")
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the variants are x86-64 builds")
def test_forcing_amx_on_this_cpu_without_it_is_refused_by_the_engine(monkeypatch, tiny_folder):
    """A host without AMX (with or without AVX-512): the operator's explicit amx is a start-up error
    naming the setting, not a worker serving on other kernels."""
    monkeypatch.setenv(VARIANT_ENV, "amx")
    library._load_library.cache_clear()
    try:
        with pytest.raises(KernelVariantError, match=f"{VARIANT_ENV}=amx: .*lacks .*amx_tile"):
            build_engine_on(tiny_folder)
    finally:
        library._load_library.cache_clear()


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine (cc, gcc or clang)")
@pytest.mark.integration
@pytest.mark.parametrize("name", [v.name for v in variants.VARIANTS.values()])
def test_the_engine_reports_the_variant_it_loaded_and_serves_on_it(tiny_folder, name):
    """Each variant this CPU runs, forced: the realized report names it, and the engine serves
    on its kernels (their results against the references: the kernel tests, run per variant)."""
    with forced_variant(name):
        engine = build_engine_on(tiny_folder)
        (out,) = engine.generate(["hello"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out.new_token_ids) == 4
    report = engine.realized
    assert report.cache.kernel_variant == name
    assert f"CPU kernels: the {name} variant" in report.describe()


def test_an_image_build_compiles_every_portable_variant(cpu, monkeypatch, capsys):
    """`--build --all-variants`: every portable variant's libraries into the cache, those this
    CPU cannot run too (compiled, never loaded), so that a host of any kind finds its own; only
    the variant this process runs is loaded."""
    cpu(AVX512.needs)
    built = []
    monkeypatch.setattr(library, "build", lambda name, variant=None: built.append((name, variant)))
    monkeypatch.setattr(library, "load", lambda name: type("Lib", (), {"_name": f"{name}.so"}))
    assert kernels_main(["--build", "--all-variants", "--jobs", "1"]) == 0
    expected = [(n, v) for v in (AVX512, AMX, X86_64_V3) for n in KERNEL_NAMES]
    assert built == expected
    out = capsys.readouterr().out
    assert "variant avx512 (the fastest this CPU runs)" in out
    assert "variant amx: built" in out and "variant x86-64-v3: built" in out
    assert "fused_ops: fused_ops.so" in out
