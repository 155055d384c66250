import pytest
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.model.registry import load_model

from tests.worker.model.kernel_paths import variant_fixture
from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config, write_hf_folder

# Each kernel test once per ISA variant (kernel_paths.variant_fixture); a GEMM's module narrows
# it to the variants whose build has its path.
kernel_variant = variant_fixture()


@pytest.fixture(scope="session")
def tiny_loaded(tmp_path_factory):
    """A tiny random-weight Llama (2 layers, 320 tokens): the whole engine runs in milliseconds,
    so the engine and its serving loop can be tested in the fast layer."""
    config = tiny_config()
    folder = write_hf_folder(tmp_path_factory.mktemp("tiny"), config, random_hf_weights(config))
    return load_model(str(folder), dtype="float32")


@pytest.fixture
def tiny_engine(tiny_loaded):
    """Builds a fresh paged engine over the shared tiny model."""

    def build(max_model_len: int = 128, max_num_seqs: int = 16):
        return (
            EngineBuilder()
            .paged_attention("on")
            .kv_cache_memory(bytes=1 << 20)
            .scheduler(max_model_len=max_model_len, max_num_seqs=max_num_seqs)
            .build(loaded=tiny_loaded)
        )

    return build
