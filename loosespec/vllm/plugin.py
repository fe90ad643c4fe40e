"""The ``vllm.general_plugins`` entry point: FLy as vLLM's acceptance rule (LOSSY when enabled).

vLLM runs every general plugin in each of its processes before the model runner is built. With
``LOOSESPEC_REJECTION_SAMPLE_METHOD=fly`` this one replaces the module-level ``rejection_sample``
of ``vllm.v1.sample.rejection_sampler`` (called by the V1 runner's ``RejectionSampler.forward``, the
runner vLLM uses on CPU) by :func:`loosespec.vllm.rule.fly_rejection_sample`, and wraps
``apply_sampling_constraints`` to keep a copy of the raw logits for FLy's entropy gate (vLLM
divides sampled requests' logits by their temperature in place before verification). Without the
variable the plugin does nothing, so installing loosespec into a vLLM environment changes nothing.

Not covered, said plainly: the GPU V2 model runner (``vllm/v1/worker/gpu/spec_decode``) has its own
fused ``rejection_sample`` with another layout; with FLy enabled the plugin makes it raise (use
``VLLM_USE_V2_MODEL_RUNNER=0`` on a GPU) instead of verifying exactly while FLy looks enabled.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import torch

from .rule import COUNTERS, FlySettings, fly_rejection_sample

log = logging.getLogger("loosespec.vllm")
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
    _refuse_v2_runner()
    counters = FlyCounters(os.environ.get("LOOSESPEC_FLY_STATS_FILE"))
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


def _refuse_v2_runner() -> None:
    """FLy is wired into the V1 runner only: make the V2 runner's verification fail loudly on its first
    call (vLLM chooses the runner from the whole configuration, after plugins load) rather than verify
    exactly while the user believes FLy is on."""
    try:
        import vllm.v1.worker.gpu.spec_decode.rejection_sampler as v2
    except Exception:  # no V2 runner in this vLLM build (CPU builds import it lazily or not at all)
        return

    def refuse(*args, **kwargs):
        raise RuntimeError("loosespec FLy is wired into vLLM's V1 model runner only; start vLLM with "
                           "VLLM_USE_V2_MODEL_RUNNER=0, or unset LOOSESPEC_REJECTION_SAMPLE_METHOD")

    if hasattr(v2, "rejection_sample"):
        v2.rejection_sample = refuse
