"""Frozen, validated decoding configuration.

Field names are the public names everywhere: CLI flags (``--num-draft-tokens``), ``--json``
output, result files and (later) server request fields. Where vLLM or transformers already has a
name for a knob, loosespec uses it (``prompt_lookup_max``, ``prompt_lookup_min``, ``top_p``,
``top_k``, ``max_new_tokens``, ``seed``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .errors import LoosespecError

METHODS = {
    "ar": "autoregressive: the target alone, one token per forward (lossless; the speedup baseline)",
    "exact": "greedy speculative decoding, exact-match verification (lossless)",
    "rejection": "speculative sampling, Leviathan/Chen rejection rule (lossless in distribution)",
    "fly": "FLy loose verification: a mismatch is kept where the target is uncertain (entropy gate) and the "
           "draft matches for the next tokens (deferred window). LOSSY: output differs from the target's",
    "specguard": "SpecGuard step-level verification: the draft writes whole reasoning steps, accepted when its "
                 "attention grounding and confidence agree, else the target writes the step. LOSSY: output "
                 "differs from the target's",
}
LOSSY_METHODS = frozenset({"fly", "specguard"})
FLY_SAMPLING = ("two-sample", "rejection")
SG_EMBEDDERS = ("draft", "sentence-transformer")
SG_ON_REJECT = ("draft-assisted", "regenerate")
SG_VERIFY = ("exact", "fly")
# SpecGuard's tau: the papers publish none. `make calibrate-specguard CAL_N=4 SG_BENCH_TOKENS=256` (loosespec
# calibrate on the first 4 GSM8K problems, default pair, bf16) proposed it: it accepts the share of
# steps the target wrote exactly as the draft did (4 of 17); ROC AUC of the score for that agreement
# 0.69, precision 0.25. A small sample: recalibrate on your task (results/calibration_specguard.json).
DEFAULT_SG_TAU = 0.608913
DRAFTERS = {
    "ngram": "prompt lookup: copy what followed an earlier occurrence of the last n-gram",
    "model": "a small draft model, autoregressive",
    "mla": "draft model accelerated by n-gram lookup (FLy's multi-level acceleration)",
}
# Draft length per round when --num-draft-tokens is not given: PLD's 10 for n-gram lookup,
# FLy's K = 15 for MLA; 8 for a plain draft model (it stops earlier on low confidence anyway).
DEFAULT_NUM_DRAFT_TOKENS = {"ngram": 10, "model": 8, "mla": 15}
FLY_NUM_DRAFT_TOKENS = 15  # FLy's K, whatever the drafter


def default_drafter(method: str, has_draft_model: bool) -> str | None:
    """``ar`` has none; otherwise ``mla`` with a draft model, ``ngram`` without."""
    if method == "ar":
        return None
    return "mla" if has_draft_model else "ngram"


@dataclass(frozen=True)
class DecodeConfig:
    """Everything that decides what one generation computes (models and prompt aside)."""

    method: str = "exact"
    drafter: str | None = None  # None only for method "ar"
    num_draft_tokens: int = 10  # K: draft tokens proposed per round
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: tuple[str, ...] = field(default_factory=tuple)
    prompt_lookup_max: int = 3  # n-gram lookup: longest suffix n-gram tried first
    prompt_lookup_min: int = 1
    mla_lookup_tokens: int = 6  # MLA: n-gram candidates per draft-model forward (FLy's M)
    draft_confidence_threshold: float = 0.3  # model drafter, greedy: stop drafting below this top prob
    # cost-aware draft length (loosespec.draftlen): each round drafts 0..K tokens, as far as it pays;
    # False drafts K every round (paper-faithful runs). Token-level methods only: SpecGuard's steps keep K
    adaptive_draft_length: bool = True
    # FLy (method "fly"); names as in the vLLM FLy port
    fly_window_size: int = 6  # W, counting the mismatch itself (the official code's meaning)
    fly_entropy_threshold: float = 0.3  # theta; 0 disables the gate, > ln(top_k) closes it
    fly_entropy_top_k: int = 3
    fly_sampling: str = "two-sample"  # T > 0: "two-sample" (official code) | "rejection" (vLLM port)
    # SpecGuard (method "specguard"); `drafter` then drafts the target's rejected steps (draft-assisted)
    sg_candidates: int = 4  # k draft candidates per step, the first greedy
    sg_temperature: float = 0.7  # sampling temperature of the other candidates
    sg_beta: float = 0.3  # S = beta * confidence + (1 - beta) * grounding
    sg_tau: float = DEFAULT_SG_TAU  # accept a step iff S >= tau
    sg_delimiter: str = "\n\n"  # a step ends with it (or an end token)
    sg_embedder: str = "draft"  # "draft" (mean-pooled draft hidden states) | "sentence-transformer"
    sg_on_reject: str = "draft-assisted"  # "draft-assisted" (candidate as draft) | "regenerate" (target alone)
    sg_verify: str = "exact"  # rule verifying the candidate in draft-assisted mode: "exact" | "fly"
    sg_max_step_tokens: int = 128  # a step longer than this is cut (and scored) there

    @property
    def lossy(self) -> bool:
        return self.method in LOSSY_METHODS

    def __post_init__(self):
        def bad(msg: str):
            raise LoosespecError(msg)

        if self.method not in METHODS:
            bad(f"unknown method '{self.method}'; choose one of: {', '.join(METHODS)}")
        if self.method == "ar":
            if self.drafter is not None:
                bad("method 'ar' uses no drafter; drop --drafter or pick a speculative method")
        elif self.drafter not in DRAFTERS:
            bad(f"unknown drafter '{self.drafter}'; choose one of: {', '.join(DRAFTERS)}")
        if self.method == "exact" and self.temperature != 0.0:
            bad("method 'exact' is greedy (temperature 0); use --method rejection to sample")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            bad(f"max_new_tokens must be a positive integer, got {self.max_new_tokens}")
        if not isinstance(self.num_draft_tokens, int) or self.num_draft_tokens < 1:
            bad(f"num_draft_tokens must be a positive integer, got {self.num_draft_tokens}")
        if not (self.temperature >= 0.0):
            bad(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            bad(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            bad(f"top_k must be a non-negative integer (0 disables it), got {self.top_k}")
        if not (1 <= self.prompt_lookup_min <= self.prompt_lookup_max):
            bad("need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min} and {self.prompt_lookup_max}")
        if self.mla_lookup_tokens < 1:
            bad(f"mla_lookup_tokens must be >= 1, got {self.mla_lookup_tokens}")
        if not (0.0 <= self.draft_confidence_threshold <= 1.0):
            bad(f"draft_confidence_threshold must be in [0, 1], got {self.draft_confidence_threshold}")
        if not isinstance(self.fly_window_size, int) or self.fly_window_size < 1:
            bad(f"fly_window_size must be a positive integer, got {self.fly_window_size}")
        if not (self.fly_entropy_threshold >= 0.0):
            bad(f"fly_entropy_threshold must be >= 0, got {self.fly_entropy_threshold}")
        if not isinstance(self.fly_entropy_top_k, int) or self.fly_entropy_top_k < 1:
            bad(f"fly_entropy_top_k must be a positive integer, got {self.fly_entropy_top_k}")
        if self.fly_sampling not in FLY_SAMPLING:
            bad(f"unknown fly_sampling '{self.fly_sampling}'; choose one of: {', '.join(FLY_SAMPLING)}")
        if not isinstance(self.sg_candidates, int) or self.sg_candidates < 1:
            bad(f"sg_candidates must be a positive integer, got {self.sg_candidates}")
        if not (self.sg_temperature > 0.0):
            bad(f"sg_temperature must be > 0 (the first candidate is always greedy), got {self.sg_temperature}")
        if not (0.0 <= self.sg_beta <= 1.0):
            bad(f"sg_beta must be in [0, 1], got {self.sg_beta}")
        if not (self.sg_tau >= 0.0):
            bad(f"sg_tau must be >= 0 (scores lie in [0, 1]; above 1 rejects every step), got {self.sg_tau}")
        if not self.sg_delimiter:
            bad("sg_delimiter must be a non-empty string")
        if self.sg_embedder not in SG_EMBEDDERS:
            bad(f"unknown sg_embedder '{self.sg_embedder}'; choose one of: {', '.join(SG_EMBEDDERS)}")
        if self.sg_on_reject not in SG_ON_REJECT:
            bad(f"unknown sg_on_reject '{self.sg_on_reject}'; choose one of: {', '.join(SG_ON_REJECT)}")
        if self.sg_verify not in SG_VERIFY:
            bad(f"unknown sg_verify '{self.sg_verify}'; choose one of: {', '.join(SG_VERIFY)}")
        if not isinstance(self.sg_max_step_tokens, int) or self.sg_max_step_tokens < 1:
            bad(f"sg_max_step_tokens must be a positive integer, got {self.sg_max_step_tokens}")
        if any(not s for s in self.stop):
            bad("stop strings must be non-empty")

    @classmethod
    def create(cls, method: str = "exact", drafter: str | None = None, num_draft_tokens: int | None = None,
               has_draft_model: bool = False, **kw) -> "DecodeConfig":
        """Build a config, filling the drafter and draft length defaults the way the CLI does."""
        if drafter is None:
            drafter = default_drafter(method, has_draft_model)
        if num_draft_tokens is None:
            num_draft_tokens = FLY_NUM_DRAFT_TOKENS if method == "fly" else DEFAULT_NUM_DRAFT_TOKENS.get(drafter, 1)
        if "stop" in kw:
            kw["stop"] = tuple(kw["stop"] or ())
        return cls(method=method, drafter=drafter, num_draft_tokens=num_draft_tokens, **kw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["stop"] = list(self.stop)
        d["lossy"] = self.lossy
        return d
