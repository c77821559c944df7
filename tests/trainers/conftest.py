import contextlib

import pytest
from corpus import project_text


@contextlib.contextmanager
def torch_threads(n: int):
    """Torch's intra-op threads set to ``n`` inside the block, and put back after it."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random-init tiny causal LM with a tokenizer trained on the README (one per module)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from bat_gym.trainers.tiny_model import build_tiny_model

    texts = project_text()
    return build_tiny_model(tmp_path_factory.mktemp("m"), texts, vocab_size=600, hidden_size=64)
