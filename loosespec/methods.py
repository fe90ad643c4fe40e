"""The methods, one object each: what a method is called, whether it is lossy, and what it needs.

A :class:`Method` owns everything that differs between methods: the rule it verifies with (its factory,
``rule``), how its draft samples, whether its rule reads the draft's probabilities, whether it takes a drafter at
all (``speculative``), whether it drafts whole steps in its own loop (``step_level``, which needs the draft model),
the counters it reports, and the configuration rules that are its own (``greedy_only``, ``loose_window``).
Everything that needs to know about methods reads this registry and asks the object, never the name: the
configuration (:mod:`loosespec.config`), ``Engine.build`` and the loop, the CLI, the server, the bench's method
table, the transformers integration. Adding a method is one :class:`Method` here plus its rule (a factory here
building a :class:`~loosespec.verify.rules.Rule`; a step-level method's loop is SpecGuard's,
:mod:`loosespec.decode.steps`). Besides the drafter table (:data:`loosespec.drafters.DRAFTERS`), this is the one
module that compares method names (``tests/test_layout.py`` checks).

FLy's counter names, boundaries and theta check live with its rule (:mod:`loosespec.verify.fly`): this module
and :mod:`loosespec.config` import them from there, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loosespec.drafters import DRAFTERS

# FLy's counter names live with its rule; FLY_WINDOW_MEANING is re-exported for the bench harness
from loosespec.verify.fly import (
    FLY_COUNTERS,
    FLY_GUARD_COUNTERS,
    FLY_OFFICIAL_COUNTERS,
    FLY_ROUND_COUNTERS,
    FLY_WINDOW_MEANING,  # noqa: F401 (re-exported)
    PromptCopyGuard,
)
from loosespec.verify.rules import FlyParams, FlyRule, GreedyRule, RejectionRule, Rule
from loosespec.verify.sampling import SamplingParams

ALL_FLY_COUNTERS = FLY_COUNTERS + FLY_OFFICIAL_COUNTERS + FLY_ROUND_COUNTERS + FLY_GUARD_COUNTERS

# A rule factory: (the run's DecodeConfig, the target's sampling, the shared generator, the request's prompt ids or
# None) -> the rule verifying the method's rounds
RuleFactory = Callable[..., Rule]


def lossless_rule(cfg, sampling: SamplingParams, generator, prompt_ids=None) -> Rule:
    """Exact match when greedy, else speculative sampling (lossless either way)."""
    return GreedyRule() if sampling.greedy else RejectionRule(sampling, generator)


def fly_rule(cfg, sampling: SamplingParams, generator, prompt_ids=None) -> Rule:
    """FLy's loose rule with the run's FLy knobs; ``prompt_ids``: the request's prompt, which FLy's copy guard
    compares drafts with (needed when ``fly_copy_guard`` is on)."""
    guard = None
    if cfg.fly_copy_guard:
        if prompt_ids is None:
            raise ValueError("FLy's copy guard (fly_copy_guard) compares drafts with the prompt: pass prompt_ids")
        guard = PromptCopyGuard(prompt_ids, cfg.fly_copy_guard)
    params = FlyParams(
        cfg.fly_entropy_threshold, cfg.fly_window_size, cfg.fly_entropy_top_k, cfg.num_draft_tokens, cfg.fly_boundary
    )
    return FlyRule(params, cfg.fly_sampling, sampling, generator, guard)


def specguard_rule(cfg, sampling: SamplingParams, generator, prompt_ids=None) -> Rule:
    """The rule of SpecGuard's target steps: the rule of the method ``sg_verify`` names when the rejected candidate
    is verified (``draft-assisted``), else (``regenerate``: the target writes the step alone) the lossless one."""
    verify = METHODS[cfg.sg_verify] if cfg.sg_on_reject == "draft-assisted" else METHODS["exact"]
    return verify.make_rule(cfg, sampling, generator, prompt_ids)


def same_sampling(cfg, sampling: SamplingParams) -> SamplingParams:
    """The draft samples as the target does."""
    return sampling


def fly_draft_sampling(cfg, sampling: SamplingParams) -> SamplingParams:
    """FLy's two-sample variant drafts greedily, as the official code does."""
    return SamplingParams(0.0) if cfg.fly_sampling == "two-sample" else sampling


def never(cfg, sampling: SamplingParams) -> bool:
    return False


def when_sampling(cfg, sampling: SamplingParams) -> bool:
    """Rejection sampling reads the draft's ``q`` (at temperature > 0)."""
    return not sampling.greedy


def fly_draft_probs(cfg, sampling: SamplingParams) -> bool:
    """FLy reads ``q`` in its ``rejection`` sampling variant only."""
    return not sampling.greedy and cfg.fly_sampling == "rejection"


@dataclass(frozen=True)
class Method:
    name: str
    summary: str  # one line for --help
    lossy: bool
    rule: RuleFactory  # the rule verifying its rounds (for a step-level method: its target steps' rounds)
    counters: tuple[str, ...] = ()  # the rule's per-round counters (Stats.events), summed and exported
    # takes a token-level drafter; False: the target alone, one token per round (ar, the speedup baseline)
    speculative: bool = True
    # drafts whole steps with the draft model in SpecGuard's step loop (loosespec.decode.steps), its target steps
    # verified by `rule`; that loop reads the draft's attentions (a transformers draft, not llama.cpp's) and copies
    # its cache per step (the dynamic cache)
    step_level: bool = False
    # the rule's deferral boundary assumes drafts of the full K, as the official FLy code drafts: the model
    # drafter's confidence stop is off for it (a draft cut short would shrink the boundary every round)
    full_drafts: bool = False
    greedy_only: bool = False  # refuses temperature > 0 (exact match)
    # its rule defers a mismatch when the fly_window_size positions after it match (FLy): the window must fit in
    # K, the cost-aware draft length prices deferrals, and --fly-preset sets its K and draft length policy
    loose_window: bool = False
    draft_sampling: Callable[..., SamplingParams] = same_sampling  # (cfg, target's sampling) -> the draft's
    reads_draft_probs: Callable[..., bool] = never  # (cfg, target's sampling) -> the rule reads the draft's q

    @property
    def needs_draft_model(self) -> bool:
        """Needs a draft model whatever its drafter (a step-level method drafts its steps with it)."""
        return self.step_level

    @property
    def torch_draft(self) -> bool:
        """Runs the draft as a transformers model (a step-level method reads its attentions): the draft's
        ``auto`` precision is resolved for that, never llama.cpp's int4."""
        return self.step_level

    def make_rule(self, cfg, sampling: SamplingParams, generator, prompt_ids=None) -> Rule:
        """The rule verifying this method's rounds (for a step-level method: its target steps' rounds).
        ``prompt_ids``: the request's prompt, which FLy's copy guard compares drafts with."""
        return self.rule(cfg, sampling, generator, prompt_ids)

    def needs_draft_probs(self, cfg, sampling: SamplingParams) -> bool:
        """Whether the rule needs the draft's distribution ``q`` (rejection sampling, or FLy on it)."""
        return self.reads_draft_probs(cfg, sampling)


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "ar",
            "autoregressive: the target alone, one token per forward (lossless; the speedup baseline)",
            lossy=False,
            rule=lossless_rule,
            speculative=False,
        ),
        Method(
            "exact",
            "greedy speculative decoding, exact-match verification (lossless)",
            lossy=False,
            rule=lossless_rule,
            greedy_only=True,
        ),
        Method(
            "rejection",
            "speculative sampling, Leviathan/Chen rejection rule (lossless in distribution)",
            lossy=False,
            rule=lossless_rule,
            reads_draft_probs=when_sampling,
        ),
        Method(
            "fly",
            "FLy loose verification: a mismatch is kept where the target is uncertain (entropy gate) and the "
            "draft matches for the next tokens (deferred window). LOSSY: output differs from the target's",
            lossy=True,
            rule=fly_rule,
            counters=ALL_FLY_COUNTERS,
            full_drafts=True,
            loose_window=True,
            draft_sampling=fly_draft_sampling,
            reads_draft_probs=fly_draft_probs,
        ),
        Method(
            "specguard",
            "SpecGuard step-level verification: the draft writes whole reasoning steps, accepted when "
            "its attention grounding and confidence agree, else the target writes the step. LOSSY: output differs "
            "from the target's",
            lossy=True,
            rule=specguard_rule,
            counters=ALL_FLY_COUNTERS,
            step_level=True,
        ),
    )
}
LOSSY_METHODS = frozenset(m.name for m in METHODS.values() if m.lossy)
# the method every other is measured against: the one that does not speculate (the bench's first row)
BASELINE: str = next(m.name for m in METHODS.values() if not m.speculative)
# every counter a method may report, in a stable order (the server exports each as loosespec:<name>)
ALL_COUNTERS: tuple[str, ...] = tuple(dict.fromkeys(c for m in METHODS.values() for c in m.counters))


def default_method(sampling: bool) -> str:
    """The method a run takes when none is named: the lossless one for its sampling, exact match when greedy,
    rejection sampling at temperature > 0 (exact is greedy only)."""
    return "rejection" if sampling else "exact"


def needs_draft_model(method: str, drafter: str | None) -> bool:
    """Whether ``method`` with ``drafter`` needs a draft model: the method's own steps, or its drafter's (False for
    unknown names, which the configuration refuses)."""
    m = METHODS.get(method)
    if m is not None and m.needs_draft_model:
        return True
    entry = DRAFTERS.get(drafter) if drafter is not None else None
    return entry is not None and entry.needs_draft_model


def may_use_draft_model(method: str, drafter: str | None) -> bool:
    """Whether a run of ``method`` with ``drafter`` (None: the default drafter, which drafts with a draft model
    when one is loaded) can use a draft model at all; the front ends load none where it cannot. Unknown names:
    True (the configuration refuses them)."""
    m = METHODS.get(method)
    if m is None or m.needs_draft_model:
        return True
    if not m.speculative:
        return False
    return drafter is None or drafter not in DRAFTERS or DRAFTERS[drafter].needs_draft_model
