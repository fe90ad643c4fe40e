"""The methods, one object each: what a method is called, whether it is lossy, the rule it verifies
with, the counters it reports. Everything that needs to know about methods reads this registry:
``DecodeConfig`` (names, lossiness), ``Engine.build`` (the rule), the server's Prometheus counters,
the bench harness (method names and lossiness labels). Adding a method is one :class:`Method` here
(plus its rule in :mod:`loosespec.verify.rules`, or its step loop for step-level methods).

FLy's counter names, boundaries and theta check live with its rule (:mod:`loosespec.verify.fly`): this module
and :mod:`loosespec.config` import them from there, never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass

# FLy's counter names live with its rule; FLY_WINDOW_MEANING is re-exported for the bench harness
from loosespec.verify.fly import FLY_WINDOW_MEANING  # noqa: F401 (re-exported)
from loosespec.verify.fly import (FLY_COUNTERS, FLY_GUARD_COUNTERS, FLY_OFFICIAL_COUNTERS, FLY_ROUND_COUNTERS,
                                  PromptCopyGuard)
from loosespec.verify.rules import FlyRule, GreedyRule, RejectionRule

ALL_FLY_COUNTERS = FLY_COUNTERS + FLY_OFFICIAL_COUNTERS + FLY_ROUND_COUNTERS + FLY_GUARD_COUNTERS


@dataclass(frozen=True)
class Method:
    name: str
    summary: str  # one line for --help
    lossy: bool
    counters: tuple[str, ...] = ()  # the rule's per-round counters (Stats.events), summed and exported
    step_level: bool = False  # drafts whole steps (SpecGuard), its token-level rounds use make_rule's rule
    # the rule's deferral boundary assumes drafts of the full K, as the official FLy code drafts: the model
    # drafter's confidence stop is off for it (a draft cut short would shrink the boundary every round)
    full_drafts: bool = False

    def make_rule(self, cfg, sampling, generator, prompt_ids=None):
        """The rule verifying this method's rounds (for a step-level method: its target steps' rounds).
        ``prompt_ids``: the request's prompt, which FLy's copy guard compares drafts with."""
        fly = self.name == "fly" or (self.step_level and cfg.sg_on_reject == "draft-assisted"
                                     and cfg.sg_verify == "fly")
        if fly:
            guard = None
            if cfg.fly_copy_guard:
                if prompt_ids is None:
                    raise ValueError("FLy's copy guard (fly_copy_guard) compares drafts with the prompt: pass "
                                     "prompt_ids")
                guard = PromptCopyGuard(prompt_ids, cfg.fly_copy_guard)
            return FlyRule(cfg.fly_entropy_threshold, cfg.fly_window_size, cfg.fly_entropy_top_k,
                           cfg.num_draft_tokens, cfg.fly_sampling, sampling, generator, guard, cfg.fly_boundary)
        return GreedyRule() if sampling.greedy else RejectionRule(sampling, generator)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("ar", "autoregressive: the target alone, one token per forward (lossless; the speedup baseline)",
           lossy=False),
    Method("exact", "greedy speculative decoding, exact-match verification (lossless)", lossy=False),
    Method("rejection", "speculative sampling, Leviathan/Chen rejection rule (lossless in distribution)",
           lossy=False),
    Method("fly", "FLy loose verification: a mismatch is kept where the target is uncertain (entropy gate) and the "
           "draft matches for the next tokens (deferred window). LOSSY: output differs from the target's",
           lossy=True, counters=ALL_FLY_COUNTERS, full_drafts=True),
    Method("specguard", "SpecGuard step-level verification: the draft writes whole reasoning steps, accepted when "
           "its attention grounding and confidence agree, else the target writes the step. LOSSY: output differs "
           "from the target's", lossy=True, counters=ALL_FLY_COUNTERS, step_level=True),
)}
LOSSY_METHODS = frozenset(m.name for m in METHODS.values() if m.lossy)
# every counter a method may report, in a stable order (the server exports each as loosespec:<name>)
ALL_COUNTERS: tuple[str, ...] = tuple(dict.fromkeys(c for m in METHODS.values() for c in m.counters))
