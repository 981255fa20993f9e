"""A step's time on a GPU from what it reads and computes: the roofline of one vLLM engine step.

A step of continuous batching runs every scheduled sequence's new tokens through the model once.
It reads the weights and the KV cache of every scheduled sequence from HBM, multiplies its new
tokens through every linear layer, computes attention between each new token and its context,
and, under tensor parallelism, all-reduces each layer's output twice (after attention and after
the MLP). Its time is the slower of reading and computing (Williams, Waterman and Patterson,
"Roofline", CACM 2009), plus what a step costs whatever it holds (scheduling, kernel launches,
sampling) and the all-reduces:

    step = fixed + per_seq · seqs + max(bytes / (HBM · e_hbm), FLOPs / (peak · e_compute)) + all-reduce

The numbers in `RooflineTiming` are derived once per model × GPU × settings (llmload/perf/derive.py);
the few efficiencies `e_*` are global, fitted on public measurements (`Efficiency`, efficiency.yaml,
docs/prediction.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat

from llmload.models import Strict
from llmload.yamlfile import load_yaml_model


class Efficiency(Strict):
    """The roofline's global constants: what fraction of a data sheet's peak vLLM's kernels reach, and
    what a step and a request cost beyond reading and computing. Fitted on the public points of
    docs/prediction.md (benchmarks/prediction_fit.py); the same for every model and GPU."""

    hbm: float = Field(gt=0, le=1, description="fraction of the data sheet's memory bandwidth a step's reads reach")
    compute: float = Field(gt=0, le=1, description="fraction of the dense peak FLOP/s a step's matrix products reach")
    layer_us: NonNegativeFloat = Field(description="per layer per step with CUDA graphs: kernel tails and launches")
    eager_layer_us: NonNegativeFloat = Field(description="per layer per step under --enforce-eager (no CUDA graphs)")
    step_ms: NonNegativeFloat = Field(description="per step: scheduling, input preparation, sampling")
    seq_us: NonNegativeFloat = Field(description="per sequence in a step: sampling and output processing")
    allreduce_us: NonNegativeFloat = Field(description="latency of one all-reduce between tensor-parallel GPUs")
    interconnect: float = Field(gt=0, le=1, description="fraction of the link's bandwidth an all-reduce reaches")
    api_server_ms: NonNegativeFloat = Field(
        description="the API server's CPU per request, one request after another (tokenizing, scheduling, "
        "streaming): it caps short requests"
    )
    frontend_ms: NonNegativeFloat = Field(description="latency from a request's arrival to the engine, besides that")
    fitted_on: str = Field(description="what the constants were fitted on, and how")


EFFICIENCY_FILE = Path(__file__).with_name("efficiency.yaml")  # package data (pyproject)
EFFICIENCY: Efficiency = load_yaml_model(EFFICIENCY_FILE, Efficiency)
"""The fitted constants every derived timing uses."""


class RooflineTiming(Strict):
    """One model's engine step on one GPU (of its tensor-parallel group), derived from the model's
    architecture and the GPU's data sheet. Bytes and FLOPs are per GPU; rates are effective (the data
    sheet's peak times the fitted efficiency)."""

    kind: Literal["roofline"] = "roofline"
    derivation: str = Field(description="the model, GPU and settings this was derived for, in words")
    frontend_ms: NonNegativeFloat = Field(description="latency from a request's arrival to the engine")
    api_server_ms: NonNegativeFloat = Field(description="the API server's CPU per request, served one at a time")
    weight_bytes: NonNegativeInt = Field(description="read by every step: every weight but the routed experts")
    expert_bytes: NonNegativeInt = Field(default=0, description="all routed experts' weights (0: dense)")
    experts: NonNegativeInt = Field(default=0, description="routed experts per MoE layer")
    experts_per_token: NonNegativeInt = 0
    kv_bytes_per_token: NonNegativeInt = Field(description="KV cache bytes one token holds, all layers")
    flops_per_token: NonNegativeFloat = Field(description="2 × the active linear-layer parameters (no LM head)")
    lm_head_flops: NonNegativeFloat = Field(description="per sequence a step samples: 2 × vocab × hidden")
    attention_flops_per_pair: NonNegativeFloat = Field(
        description="per (new token, context token) pair: 4 × heads × head dim × layers (QKᵀ and PV)"
    )
    hbm_bytes_per_s: PositiveFloat
    flops_per_s: PositiveFloat
    allreduces_per_step: NonNegativeInt = Field(description="2 per layer under tensor parallelism, else 0")
    allreduce_bytes_per_token: NonNegativeFloat = Field(description="a ring all-reduce's traffic per GPU per token")
    interconnect_bytes_per_s: PositiveFloat
    allreduce_s: NonNegativeFloat = Field(description="latency of one all-reduce")
    fixed_step_s: NonNegativeFloat = Field(description="every step: scheduling, launches, per-layer tails")
    seq_s: NonNegativeFloat = Field(description="each sequence a step schedules")

    def step_s(self, seqs: int, kv_tokens: int, prefill_tokens: int, prefill_pairs: int = 0) -> float:
        """Seconds one step takes: `seqs` sequences scheduled, `kv_tokens` of context read, `prefill_tokens`
        prompt tokens computed with `prefill_pairs` attention pairs (llmload.sim.engine.StepLoad)."""
        tokens = prefill_tokens + seqs
        weights = self.weight_bytes + self._experts_read(tokens)
        read_s = (weights + self.kv_bytes_per_token * kv_tokens) / self.hbm_bytes_per_s
        flops = (
            self.flops_per_token * tokens
            + self.lm_head_flops * seqs
            + self.attention_flops_per_pair * (prefill_pairs + kv_tokens)
        )
        compute_s = flops / self.flops_per_s
        comm_s = self.allreduces_per_step * (
            self.allreduce_s + self.allreduce_bytes_per_token * tokens / self.interconnect_bytes_per_s
        )
        return self.fixed_step_s + self.seq_s * seqs + max(read_s, compute_s) + comm_s

    def prefill_s(self, prompt_tokens: float) -> float:
        """What one prompt adds to the steps that compute it: its FLOPs (attention's square included) and
        its all-reduce traffic, at the compute roof (a prompt's tokens are what make a step compute-bound)."""
        pairs = prompt_tokens * (prompt_tokens + 1) / 2
        flops = self.flops_per_token * prompt_tokens + self.attention_flops_per_pair * pairs
        comm = self.allreduces_per_step * self.allreduce_bytes_per_token * prompt_tokens / self.interconnect_bytes_per_s
        return flops / self.flops_per_s + comm

    def saturation_qps(self, running: int, prompt_tokens: float, output_tokens: int) -> float:
        """Requests/s the engine completes with `running` sequences always scheduled (see StepTiming)."""
        decode_s = self.step_s(running, round(running * (prompt_tokens + output_tokens / 2)), 0)
        return running / (output_tokens * decode_s + running * self.prefill_s(prompt_tokens))

    def _experts_read(self, tokens: int) -> float:
        """Bytes of routed experts a step of `tokens` tokens reads: each token picks k of E experts per layer,
        so E·(1 − (1 − k/E)^tokens) distinct experts are read (uniform routing)."""
        if not self.experts:
            return 0.0
        untouched = (1 - self.experts_per_token / self.experts) ** tokens
        return self.expert_bytes * (1 - untouched)
