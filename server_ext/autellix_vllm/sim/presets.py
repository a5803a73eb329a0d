"""Engine presets: what one simulated step costs and how much fits in a batch.

Step time = ``step_base + per_decode * decode_tokens + per_prefill * prefill_tokens
+ per_context_token * context_tokens + per_prefill_pair * prefill_pairs``, where
``context_tokens`` is the context the step's decodes attend over (each decoding
call's prompt and output so far: its KV is read once per step) and
``prefill_pairs`` counts (prefilled token, earlier token it attends to) pairs.
The two context terms are 0 in ``a100-llama8b``, ``unit`` and ``cpu-tiny``;
``a100-llama8b-kv`` is ``a100-llama8b`` with them on, and with
``exact_macro_steps``; ``cpu-smollm2`` has both, measured.

A preset may also have a host-memory KV tier (``kv_offload_gib``, ``autellix
simulate --kv-offload-gib``): its size is turned into blocks with
``kv_bytes_per_token`` and it transfers at ``host_bytes_per_s``, by default
PCIe 4.0 x16's ~25 GB/s (the link's 31.5 GB/s raw; nvbandwidth measures
24.8 GB/s host-to-device on A100-SXM4-80GB over PCIe 4.0 x16).

``a100-llama8b``: Llama-3.1-8B in bf16 on one A100-80GB, derived from public
figures rather than measured here:

* ``step_base`` 8 ms: each step streams the 16 GB of weights through HBM at
  about 2.0 TB/s (A100-80GB spec), the floor of vLLM's inter-token latency at
  small batch (7-10 ms is what public vLLM benchmarks of 8B models on A100 show);
* ``per_decode`` 0.07 ms per decoding sequence. Read as one sequence's KV read
  per step over ~1k tokens of context, 128 KiB per token (32 layers x 8 KV heads
  x 128 dims x 2 (K,V) x 2 bytes) at ~2 TB/s; equally, one token's 16 GFLOP of
  linear layers at ~230 TFLOP/s (74% of peak), which at a full batch outweighs
  the weight stream. ``a100-llama8b-kv`` keeps it as the per-sequence part and
  reads the KV per token of context instead;
* ``per_context_token`` (``a100-llama8b-kv``) 65.5 ns: 128 KiB of KV per token
  read at ~2 TB/s, in every decode step, so a step over 100k tokens of context
  costs 6.6 ms more and one over the whole KV (414k tokens) 27 ms more;
* ``per_prefill_pair`` (``a100-llama8b-kv``) 2.9 ns: attention compute per
  (prefilled token, earlier token) pair, 32 layers x 32 query heads x 128 dims
  x 2 (QK^T, PV) x 2 FLOP = 0.52 MFLOP at ~180 TFLOP/s. Prefilling 100k tokens
  from scratch then costs 14.6 s of attention on top of 9 s of linear layers;
  without the term, recomputing a long context would look 2.6x cheaper than it is;
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
1 KV head x 32 dims x K and V), in vLLM's CPU blocks of 128 tokens. Its context
KV read would be ~73 ns per token of decode context (512 bytes at the ~7 GB/s
one core of the development machine reads: a numpy sum over 256 MiB). It stays
0: with the launcher's 1,024-token context a full batch reads at most 16k tokens
(~1.2 ms), and the calibration's 900-token prompts already include their
attention in ``per_prefill``.

``cpu-smollm2``: SmolLM2-135M-Instruct in bfloat16 (``--model smollm2``) on the
CPU build of vLLM, the launcher's one OpenMP thread on the 2-core development
machine, calibrated with ``autellix bench cpu-preset --model smollm2``. Four
runs, at load averages of 2 to 13 from other jobs (a fifth, caught by a load
spike, fitted nonsense and is left out), fitted ``step_base`` 12.0, 16.8, 17.0
and 22.5 ms (each step streams the 270 MB of weights), ``per_decode`` 1.6, 2.0,
2.4 and 3.6 ms a sequence, and ``per_context_token`` 0, 4.4, 6.6 and 7.1 us a
token of decode context (the step at 4 sequences of 800-token prompts against
2-token ones); the preset takes the medians. The prefill is fitted on the
times to the first token of 32- to 2,400-token prompts (two runs): a prompt
token costs ``per_prefill`` 0.66 ms (0.64 and 0.68; 270 MFLOP a token on one
core) plus ``per_prefill_pair`` 0.42 us (0.38 and 0.46) per earlier token it
attends to, so a 2,400-token prompt takes 2.8 s where a flat 0.8 ms a token
gave 1.9 s. Without the pair term the simulator ran the KV-bound agent replay
of docs/benchmarks.md 22% too fast under FCFS, which recomputes long contexts
(``autellix bench fidelity``: median error 0.21 against 0.07 with it). Unlike
``cpu-tiny``'s, this model's steps are model work, so decode context and
prefill matter. The batch and KV are the launcher's defaults: 16 sequences,
1 GiB of KV at 23,040 bytes a token = 46,592 tokens, 364 of vLLM's CPU blocks
of 128 tokens (vLLM's own count at startup).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..registry import lookup

# PCIe 4.0 x16 host-to-device as measured (nvbandwidth), not the link's raw 31.5 GB/s.
PCIE4_X16_BYTES_PER_S = 25e9

# Llama-3.1-8B: 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes (bf16).
LLAMA8B_KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2

# SmolLM2-135M: 30 layers x 3 KV heads x 64 dims x (K, V) x 2 bytes (bf16).
SMOLLM2_KV_BYTES_PER_TOKEN = 30 * 3 * 64 * 2 * 2

# What a100-llama8b-kv adds to a100-llama8b: the context terms of Llama-3.1-8B on
# an A100-80GB (module doc), the KV read at ~2 TB/s and the attention (32 layers x
# 32 query heads x 128 dims x 2 x 2 FLOP per pair) at ~180 TFLOP/s; and exact
# macro steps.
A100_LLAMA8B_KV_MODEL = {
    "per_context_token": LLAMA8B_KV_BYTES_PER_TOKEN / 2.0e12,
    "per_prefill_pair": 32 * 32 * 128 * 2 * 2 / 1.8e14,
    "exact_macro_steps": True,
}


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
    # Seconds per token of context the step's decodes read (KV read; 0: off).
    per_context_token: float = 0.0
    # Seconds per (prefilled token, earlier token it attends to) pair (0: off).
    per_prefill_pair: float = 0.0
    # Bytes of KV per token: turns a host tier's GiB into blocks and transfer time.
    kv_bytes_per_token: int = 0
    # The host-memory KV tier, in GiB (0: none).
    kv_offload_gib: float = 0.0
    host_bytes_per_s: float = PCIE4_X16_BYTES_PER_S
    # Macro steps that also end where admission could change (a step that preempted
    # admitted nothing; a waiting call's fit changes as cached prefixes are evicted),
    # so that they give exactly the results of single steps. False: a coarser bound,
    # off by up to one bisection step of a sweep under KV pressure.
    exact_macro_steps: bool = False

    def step_time(
        self,
        decode_tokens: int,
        prefill_tokens: int,
        context_tokens: int = 0,
        prefill_pairs: int = 0,
    ) -> float:
        return (
            self.step_base
            + self.per_decode * decode_tokens
            + self.per_prefill * prefill_tokens
            + self.per_context_token * context_tokens
            + self.per_prefill_pair * prefill_pairs
        )

    @property
    def host_blocks(self) -> int:
        """The host tier's capacity in blocks (0 without one)."""
        if not self.kv_offload_gib:
            return 0
        return int(self.kv_offload_gib * 2**30) // (self.kv_bytes_per_token * self.block_size)

    @property
    def host_seconds_per_token(self) -> float:
        """Time to move one token's KV between host and GPU memory."""
        return self.kv_bytes_per_token / self.host_bytes_per_s

    def slowed(self, factor: float) -> EnginePreset:
        """This preset with every step cost times ``factor`` (the same engine on a
        machine ``factor`` times slower)."""
        if not factor > 0:
            raise ValueError(f"a time scale must be positive, got {factor}")
        return replace(
            self,
            step_base=self.step_base * factor,
            per_decode=self.per_decode * factor,
            per_prefill=self.per_prefill * factor,
            per_context_token=self.per_context_token * factor,
            per_prefill_pair=self.per_prefill_pair * factor,
        )

    def with_max_num_seqs(self, max_num_seqs: int | None) -> EnginePreset:
        return self if max_num_seqs is None else replace(self, max_num_seqs=max_num_seqs)

    def with_kv_offload_gib(self, gib: float | None) -> EnginePreset:
        """This preset with a host-memory KV tier of ``gib`` GiB (None: as it is)."""
        if gib is None:
            return self
        if gib < 0:
            raise ValueError(f"the host KV tier cannot be negative, got {gib} GiB")
        if gib and not self.kv_bytes_per_token:
            raise ValueError(f"preset {self.name} has no KV size per token for a host tier")
        return replace(self, kv_offload_gib=gib)


_A100_LLAMA8B = EnginePreset(
    "a100-llama8b",
    step_base=0.008,
    per_decode=0.00007,
    per_prefill=0.00009,
    max_num_seqs=256,
    token_budget=2048,
    kv_blocks=25_900,
    kv_bytes_per_token=LLAMA8B_KV_BYTES_PER_TOKEN,
)

PRESETS: dict[str, EnginePreset] = {
    "a100-llama8b": _A100_LLAMA8B,
    "a100-llama8b-kv": replace(_A100_LLAMA8B, name="a100-llama8b-kv", **A100_LLAMA8B_KV_MODEL),
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
        kv_bytes_per_token=512,
    ),
    "cpu-smollm2": EnginePreset(
        "cpu-smollm2",
        step_base=0.0169,
        per_decode=0.0022,
        per_prefill=0.00066,
        per_context_token=0.0000055,
        per_prefill_pair=0.00000042,
        max_num_seqs=16,
        token_budget=2048,
        kv_blocks=364,
        block_size=128,
        kv_bytes_per_token=SMOLLM2_KV_BYTES_PER_TOKEN,
    ),
}


def get_preset(preset: str | EnginePreset) -> EnginePreset:
    """A preset by name, or ``preset`` itself: a variant made with ``replace``
    needs no registration to be simulated or swept."""
    if isinstance(preset, EnginePreset):
        return preset
    return lookup(PRESETS, preset, "preset")
