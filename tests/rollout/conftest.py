"""The token episode shares the trainer adapters' tiny tokenizer, models and scripted turns."""

from integrations.conftest import (  # noqa: F401 - fixtures, found by name
    endoftext_model_dir,
    helpers,
    qwen3_model_dir,
    tiny_tokenizer,
)
