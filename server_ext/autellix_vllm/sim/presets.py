"""Engine presets: what one simulated step costs and how much fits in a batch.

Step time = ``step_base + per_decode * decode_tokens + per_prefill * prefill_tokens``.

``a100-llama8b``: Llama-3.1-8B in bf16 on one A100-80GB, derived from public
figures rather than measured here:

* ``step_base`` 8 ms: each step streams the 16 GB of weights through HBM at
  about 2.0 TB/s (A100-80GB spec), the floor of vLLM's inter-token latency at
  small batch (7-10 ms is what public vLLM benchmarks of 8B models on A100 show);
* ``per_decode`` 0.07 ms: one sequence's KV read per step, 128 KiB per token of
  context (32 layers x 8 KV heads x 128 dims x 2 (K,V) x 2 bytes) over ~1k tokens
  of context at ~2 TB/s;
* ``per_prefill`` 0.09 ms: ~16 GFLOP per prompt token (2 x 8B parameters) at
  ~180 TFLOP/s, i.e. ~60% of the A100's 312 TFLOP/s bf16 peak;
* KV capacity: 0.9 x 80 GB minus 16 GB of weights and ~3 GB of activations,
  ~53 GB / 128 KiB = ~414k tokens = 25,900 blocks of 16 tokens;
* batch: vLLM's defaults for online serving on an A100, ``max_num_seqs`` 256 and
  a 2,048-token step budget with chunked prefill.

``unit``: every step costs one second and prefill is free; memory is unbounded.
It is the setting of the paper's Figure 2 toy example.

``cpu-tiny``: the embedded engine of this repository (the tiny random-weight
Llama on the CPU build of vLLM, 2 cores), calibrated with
``autellix bench cpu-preset``: two runs on a quiet machine,
with the launcher's one OpenMP thread, fitted a step of 1.6-2.2 ms plus
0.003-0.155 ms per sequence (2.2-2.7 ms at 8 sequences: the model is so small
that scheduling and inter-process overhead dominate), and 0.016-0.017 ms per
prefilled token. (With an OpenMP thread spinning on each of the 2 cores, a
step takes 5.5-9 ms.) The batch and KV are the launcher's
defaults: 16 sequences, 1 GiB of KV (512 bytes per token in float32: 2 layers x
1 KV head x 32 dims x K and V), in vLLM's CPU blocks of 128 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..registry import lookup


@dataclass(frozen=True)
class EnginePreset:
    name: str
    step_base: float
    per_decode: float
    per_prefill: float
    max_num_seqs: int
    token_budget: int
    kv_blocks: int
    block_size: int = 16

    def step_time(self, decode_tokens: int, prefill_tokens: int) -> float:
        return self.step_base + self.per_decode * decode_tokens + self.per_prefill * prefill_tokens

    def with_max_num_seqs(self, max_num_seqs: int | None) -> EnginePreset:
        return self if max_num_seqs is None else replace(self, max_num_seqs=max_num_seqs)


PRESETS: dict[str, EnginePreset] = {
    "a100-llama8b": EnginePreset(
        "a100-llama8b",
        step_base=0.008,
        per_decode=0.00007,
        per_prefill=0.00009,
        max_num_seqs=256,
        token_budget=2048,
        kv_blocks=25_900,
    ),
    "unit": EnginePreset(
        "unit",
        step_base=1.0,
        per_decode=0.0,
        per_prefill=0.0,
        max_num_seqs=256,
        token_budget=1 << 30,
        kv_blocks=1 << 40,
    ),
    "cpu-tiny": EnginePreset(
        "cpu-tiny",
        step_base=0.0019,
        per_decode=0.00008,
        per_prefill=0.0000165,
        max_num_seqs=16,
        token_budget=2048,
        kv_blocks=16_384,
        block_size=128,
    ),
}


def get_preset(name: str) -> EnginePreset:
    return lookup(PRESETS, name, "preset")
