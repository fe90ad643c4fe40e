"""The parameter sets :class:`loosespec.config.DecodeConfig` fills unset knobs from: FLy's presets and SpecGuard's
decision rules, each chosen by a committed calibration run (``loosespec calibrate``) that a test re-reads.

Recalibrate for another pair or task: these were measured on the embedded Qwen2.5-Coder 1.5B/0.5B pair.
"""

from __future__ import annotations

FLY_NUM_DRAFT_TOKENS = 15  # FLy's K in the paper and the official code, whatever the drafter
# FLy's parameter sets (--fly-preset): what the knobs fly_entropy_threshold, fly_window_size, fly_boundary and, for
# method fly, num_draft_tokens and adaptive_draft_length take when not given.
# - paper: the paper and the official code: theta 0.3, the official W = 6 counting the mismatch (5 positions after
#   it here, vLLM's meaning), the official boundary, K = 15 drafted every round (the cost-aware length off).
# - calibrated: chosen for the embedded Qwen2.5-Coder 1.5B/0.5B pair by `make calibrate-fly` (loosespec calibrate
#   --method fly: problems no benchmark reads; results/calibration/fly.md), the fastest setting that kept >= 99% of
#   ar's accuracy there; tests/eval/test_calibrate_fly.py checks these equal its choice. Recalibrate for your pair.
FLY_PRESETS = {
    "calibrated": {
        "fly_entropy_threshold": 0.9,
        "fly_window_size": 5,
        "fly_boundary": "window",
        "fly_copy_guard": 0,
        "num_draft_tokens": 15,
        "adaptive_draft_length": True,
    },
    "paper": {
        "fly_entropy_threshold": 0.3,
        "fly_window_size": 5,
        "fly_boundary": "official",
        "fly_copy_guard": 0,
        "num_draft_tokens": FLY_NUM_DRAFT_TOKENS,
        "adaptive_draft_length": False,
    },
}
DEFAULT_FLY_PRESET = "calibrated"

# SpecGuard's decision rule per candidate selection (sg_select) and rule (sg_decision): what sg_confidence,
# sg_beta, sg_tau and sg_grounding_tau take when not given. The papers publish none; each was chosen on GSM8K's
# train split (problems no benchmark reads), default pair, int8, to accept the share of steps the target prefers:
# - embedding, weighted: `make calibrate-specguard` (50 problems, 241 steps; results/calibration/specguard.md):
#   the confidence variant and beta whose S best separates the steps the target prefers, and its tau;
# - the others: the held-out calibrations (`make calibrate-specguard-heldout`, 70 problems each;
#   results/calibration/specguard-heldout.md, specguard-attention-heldout.md): the rule fitted on the first 42
#   problems with SpecGuard's G (rollout over the last 3 layers, minimum over the step), so the held-out 28 score
#   exactly what ships.
# sg_beta under "both" only weighs the S that step records report; the rule does not read it.
# tests/eval/test_calibrate.py checks each equals its run's choice.
SG_RULES = {
    ("embedding", "weighted"): {"sg_confidence": "mean", "sg_beta": 0.8, "sg_tau": 0.825098, "sg_grounding_tau": None},
    ("embedding", "both"): {"sg_confidence": "min", "sg_beta": 0.8, "sg_tau": 0.429732, "sg_grounding_tau": 0.330632},
    ("attention", "weighted"): {"sg_confidence": "mean", "sg_beta": 0.9, "sg_tau": 0.864735, "sg_grounding_tau": None},
    ("attention", "both"): {"sg_confidence": "min", "sg_beta": 0.9, "sg_tau": 0.419542, "sg_grounding_tau": 0.322288},
}
