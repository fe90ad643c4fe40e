"""Acceptance rules: pure functions on tensors, no model, cache or config object inside.

The package's ground floor: nothing here imports a loosespec module above it (only :mod:`loosespec.errors`).
Defaults written here equal the knobs' declared defaults in :mod:`loosespec.config` by test
(``tests/verify/test_defaults.py``), not by import; FLy's counter names, boundaries and theta check live in
:mod:`loosespec.verify.fly`, where :mod:`loosespec.methods` and :mod:`loosespec.config` read them.

Vocabulary (methods.md): one **round** is the draft proposing ``K`` tokens ``d[0..K-1]`` and the
target scoring ``[last_committed, d_0 .. d_{K-1}]`` in one forward, which gives ``K + 1`` rows of
logits ``z[0..K]`` (row ``j`` predicts the token at draft position ``j``). A rule keeps
``num_accepted`` draft tokens (a prefix) and emits exactly one more target token: the
**correction** at the first rejected position, or the **bonus** after a fully accepted draft.
"""

from loosespec.verify.exact import first_false, greedy_verify, match_mask, prefix_verdict
from loosespec.verify.rejection import rejection_verify
from loosespec.verify.sampling import SamplingParams, logits_to_probs, sample
from loosespec.verify.types import Verdict

__all__ = [
    "Verdict",
    "SamplingParams",
    "logits_to_probs",
    "sample",
    "match_mask",
    "first_false",
    "prefix_verdict",
    "greedy_verify",
    "rejection_verify",
]
