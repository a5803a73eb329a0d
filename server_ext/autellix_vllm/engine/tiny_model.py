"""The ``tiny`` model: a random-weight Llama that vLLM's CPU build starts in seconds.

Nothing is downloaded. The model folder holds a ``config.json`` and a
character-level tokenizer; the weights come from ``--load-format dummy``
(random), so the text is gibberish but every token is printable and its
length is controlled with ``max_tokens`` and ``ignore_eos``.

The folder is built once in the cache (:func:`~autellix_vllm.engine.cache.build_once`),
so concurrent first uses never see half a model.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from autellix_vllm.engine.cache import build_once, default_cache_dir

# Bump when the files written below change, so stale caches are rebuilt.
TINY_MODEL_VERSION = 2
# The longest context any caller asks of it (the overhead benchmark: 4,096).
MAX_POSITION_EMBEDDINGS = 4096
SERVED_MODEL_NAME = "autellix-tiny"

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3
# Every printable ASCII character plus newline: the model can emit any text.
# (string.printable also has tab, carriage return, vertical tab and form feed;
# only newline is kept of the whitespace controls.)
CHARACTERS = [c for c in string.printable if c.isprintable()] + ["\n"]

# Renders `role: content` lines and ends with the assistant's turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def tiny_model_dir(cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / f"tiny-llama-v{TINY_MODEL_VERSION}"


def ensure_tiny_model(cache_dir: Path | None = None) -> Path:
    """Return the tiny model's folder, building it first if it is missing."""
    return build_once(tiny_model_dir(cache_dir), _write_model)


def _write_model(folder: Path) -> None:
    _write_tokenizer(folder)
    _write_model_config(folder)


def _write_tokenizer(folder: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # One token per character: split on the empty pattern, keep every piece.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(""), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(folder)


def model_config() -> dict[str, Any]:
    """The tiny Llama's ``config.json``, also used by the model-free test schedulers."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        # Exactly the tokenizer's vocabulary, so every sampled id decodes.
        "vocab_size": len(SPECIAL_TOKENS) + len(CHARACTERS),
        # head_dim = hidden / heads = 32: the smallest size CPU attention supports.
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def _write_model_config(folder: Path) -> None:
    (folder / "config.json").write_text(json.dumps(model_config(), indent=2))
