import pytest
from intentserve.worker.model.registry import load_model


@pytest.fixture(scope="session")
def smollm2_fp32():
    """The default model, loaded once (GGUF dequantization takes seconds) and shared read-only."""
    return load_model("smollm2-135m", dtype="float32")
