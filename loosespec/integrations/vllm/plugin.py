"""The ``vllm.general_plugins`` entry point: FLy as vLLM's acceptance rule (LOSSY when enabled).

vLLM runs every general plugin in each of its processes before the model runner is built. With
``LOOSESPEC_REJECTION_SAMPLE_METHOD=fly`` this one replaces the module-level ``rejection_sample``
of ``vllm.v1.sample.rejection_sampler`` (called by the V1 runner's ``RejectionSampler.forward``, the
runner vLLM uses on CPU) by :func:`loosespec.integrations.vllm.rule.fly_rejection_sample`, and wraps
``apply_sampling_constraints`` to keep a copy of the raw logits for FLy's entropy gate (vLLM
divides sampled requests' logits by their temperature in place before verification). Without the
variable the plugin does nothing, so installing loosespec into a vLLM environment changes nothing.

On GPUs vLLM's default V2 model runner (``vllm/v1/worker/gpu/spec_decode``) verifies with its own
fused kernel and another layout; the plugin wraps its ``RejectionSampler._verify`` (which holds the raw
logits before processing) and rules through :func:`loosespec.integrations.vllm.rule.fly_rejection_sample_v2`, a
re-layout onto the same function. That path is tested on hand-built V2-shaped tensors and against the
installed class's signature, not on a GPU (none was available to this project).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import torch

from loosespec.integrations.vllm.rule import COUNTERS, FlySettings, fly_rejection_sample, fly_rejection_sample_v2

log = logging.getLogger("loosespec.integrations.vllm")
_STATE = threading.local()  # the raw logits of the batch being verified (one model runner per process)


class FlyCounters:
    """FLy's counters summed over this process's verification steps, with vLLM's own step counts;
    optionally written to ``LOOSESPEC_FLY_STATS_FILE`` (per process: ``{pid}`` in the path is replaced)."""

    def __init__(self, path: str | None):
        self.values = dict.fromkeys(("steps", "requests", "drafted_tokens", "accepted_tokens", *COUNTERS), 0)
        self.path = path.replace("{pid}", str(os.getpid())) if path else None
        self._last_write = 0.0

    def add(self, out: torch.Tensor, num_draft_tokens, events: dict[str, int]) -> None:
        v = self.values
        v["steps"] += 1
        v["requests"] += len(num_draft_tokens)
        v["drafted_tokens"] += int(sum(num_draft_tokens))
        v["accepted_tokens"] += int(((out >= 0).sum(-1) - 1).clamp(min=0).sum())
        for name, n in events.items():
            v[name] += n
        if self.path and time.monotonic() - self._last_write > 0.5:
            self.write()

    def write(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.values, f)
        os.replace(tmp, self.path)


def register() -> None:
    """Entry point (``vllm.general_plugins``): patch vLLM's verification when FLy is enabled."""
    settings = FlySettings.from_env()
    if settings is None:
        return
    import vllm.v1.sample.rejection_sampler as rs

    if getattr(rs.rejection_sample, "_loosespec", False):  # already patched in this process
        return
    counters = FlyCounters(os.environ.get("LOOSESPEC_FLY_STATS_FILE"))
    _patch_v2_runner(settings, counters)
    original_constraints = rs.apply_sampling_constraints
    greedy_temperature = getattr(rs.GREEDY_TEMPERATURE, "value", rs.GREEDY_TEMPERATURE)

    def apply_sampling_constraints(logits, cu_num_draft_tokens, sampling_metadata):
        # vLLM scales sampled requests' logits in place; FLy's gate reads the raw ones
        _STATE.raw = None if sampling_metadata.all_greedy else logits.clone()
        return original_constraints(logits, cu_num_draft_tokens, sampling_metadata)

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs):
        if kwargs.get("synthetic_mode"):
            raise RuntimeError("loosespec FLy and vLLM's synthetic rejection sampling cannot be combined")
        raw = getattr(_STATE, "raw", None)
        _STATE.raw = None
        is_greedy = uniform = None
        if not sampling_metadata.all_greedy:
            is_greedy = sampling_metadata.temperature == greedy_temperature
            uniform = rs.generate_uniform_probs(draft_token_ids.shape[0], num_draft_tokens,
                                                sampling_metadata.generators, target_logits.device)
        out, events = fly_rejection_sample(
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
            bonus_token_ids, is_greedy, settings, raw_logits=raw, uniform_probs=uniform,
            generators=sampling_metadata.generators)
        counters.add(out, num_draft_tokens, events)
        return out

    rejection_sample._loosespec = True
    rs.apply_sampling_constraints = apply_sampling_constraints
    rs.rejection_sample = rejection_sample
    log.warning("loosespec: FLy (LOSSY) verifies vLLM's drafts: window %d, entropy threshold %g, top-%d",
                settings.fly_window_size, settings.fly_entropy_threshold, settings.fly_entropy_top_k)


def _patch_v2_runner(settings: FlySettings, counters: FlyCounters) -> None:
    """FLy in the V2 model runner (vLLM's default on GPUs): wrap ``RejectionSampler._verify``, which holds
    the raw logits (FLy's gate reads them) before ``apply_sampling_params`` processes them, and rule through
    :func:`loosespec.integrations.vllm.rule.fly_rejection_sample_v2` instead of the fused kernel."""
    try:
        import vllm.v1.worker.gpu.spec_decode.rejection_sampler as v2
    except Exception as exc:  # no V2 runner in this vLLM build (or it cannot import here, e.g. without Triton)
        log.info("loosespec: vLLM's V2 runner is not importable here (%s); FLy covers the V1 runner", exc)
        return
    sampler_cls = getattr(v2, "RejectionSampler", None)
    if sampler_cls is None or not hasattr(sampler_cls, "_verify") or getattr(sampler_cls._verify, "_loosespec", False):
        return

    def _verify(self, logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping, idx_mapping_np,
                expanded_idx_mapping, expanded_local_pos, seq_lens_upper_bound_np, verify_draft_sampled):
        if self.synthetic_conditional_rates is not None or self.use_block_verification:
            raise RuntimeError("loosespec FLy replaces vLLM's rejection_sample_method; it cannot be combined "
                               "with 'synthetic' or 'block' verification")
        if getattr(self, "watermark_key", None) is not None:
            raise RuntimeError("loosespec FLy cannot be combined with vLLM's watermarking sampler")
        processed = self.sampler.apply_sampling_params(
            logits, expanded_idx_mapping, idx_mapping, idx_mapping_np, pos, draft_sampled, expanded_local_pos,
            seq_lens_upper_bound_np)
        states = self.sampler.sampling_states
        sampled, num_sampled, events = fly_rejection_sample_v2(
            processed, logits, draft_logits, verify_draft_sampled, cu_num_logits, pos, idx_mapping,
            states.temperature.gpu, states.seeds.gpu, self.num_speculative_steps, settings)
        drafted = (cu_num_logits[1:] - cu_num_logits[:-1] - 1).tolist()
        counters.add(sampled, drafted, events)  # sampled is -1 past num_sampled
        return processed, sampled, num_sampled

    _verify._loosespec = True
    sampler_cls._verify = _verify
