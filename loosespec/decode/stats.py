"""Per-run statistics (methods.md §6), with vLLM's and Spec-Bench's conventions.

- ``mean_accepted_length`` (tau) = emitted tokens / rounds, the bonus or correction token
  included, so plain autoregressive decoding has tau = 1.
- ``acceptance_rate`` = accepted draft tokens / drafted tokens.
- ``drafts`` = rounds that drafted at least one token (vLLM's ``num_drafts``; with the cost-aware
  draft length some rounds draft nothing), an accepted SpecGuard step counting as one.
- ``per_position_acceptance[i]`` = rounds that accepted position i / rounds that drafted one;
  the counts behind it are ``num_drafted_per_pos`` and ``num_accepted_tokens_per_pos`` (vLLM's name),
  so rates pool across runs.
- vLLM's names beside loosespec's (:data:`VLLM_NAMES`): ``num_drafts`` = ``drafts``, ``num_draft_tokens`` =
  ``drafted_tokens``, ``num_accepted_tokens`` = ``accepted_tokens``, so a reader of vLLM's counters finds them.
- rule counters (FLy: ``fly_prefix_mismatches``, ``fly_deferred``, ``fly_hard_rejects``,
  ``fly_window_rejects``, ``fly_boundary_rejects``, and ``fly_copy_rejects`` with the copy guard on)
  are summed over rounds.
- SpecGuard (method ``specguard``): ``steps``, ``accepted_steps`` (the draft's step kept),
  ``target_steps`` (written by the target), ``candidates_drafted``, ``step_accept_rate`` and the
  mean ``grounding``, ``confidence`` and ``score`` of the scored candidates. An accepted step
  counts as one round whose tokens were all drafted and accepted; target steps add their own
  token-level rounds.
- ``wall_s`` covers prefill and decoding (model loading excluded); ``ttft_s`` is the time to the
  first committed token; ``tokens_per_s`` = new_tokens / wall_s.
- across tokenizers (:mod:`loosespec.drafters.bridge`): ``drafted_tokens`` and ``accepted_tokens`` count
  the target's tokens (what it verified and kept) and ``draft_units_drafted`` the draft model's
  own tokens before re-encoding.
- ``draft_length_histogram``: how many rounds drafted up to k tokens, k as the cost-aware draft
  length chose it (:mod:`loosespec.decode.draftlen`; 0 = a plain target step), or the fixed K.
- ``precision``: the precision the target ran in (``int8``, ``bfloat16``, ...), set by the engine.
- Counts describe committed output: where output is cut after the rounds that produced it (a
  SpecGuard target step at its delimiter, a stop string), :meth:`Stats.uncommit` takes the cut tokens
  back out of the rounds, so ``sum(round_lengths) == new_tokens`` always.
- ``round_lengths``: tokens emitted by each round (Spec-Bench's ``accept_lengths``), kept on the
  object for histograms, left out of ``to_dict``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

STEP = "step"  # the round record of an accepted SpecGuard step
# vLLM's name -> loosespec's, for the counts both have: vLLM's SpecDecodingStats (vllm/v1/spec_decode/metrics.py,
# exported as the Prometheus counters vllm:spec_decode_<name>) counts num_drafts (request steps that proposed draft
# tokens: observe_draft), num_draft_tokens (tokens proposed) and num_accepted_tokens (draft tokens accepted, the
# bonus token not counted). num_accepted_tokens_per_pos already has vLLM's name.
VLLM_NAMES = {"num_drafts": "drafts", "num_draft_tokens": "drafted_tokens", "num_accepted_tokens": "accepted_tokens"}


@dataclass
class Stats:
    new_tokens: int = 0
    rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    wall_s: float = 0.0
    ttft_s: float = 0.0
    prompt_tokens: int = 0
    drafted_at: list[int] = field(default_factory=list)  # per position: rounds drafting it
    accepted_at: list[int] = field(default_factory=list)  # per position: rounds accepting it
    events: dict[str, int] = field(default_factory=dict)  # a rule's own counters (FLy), summed
    skipped_steps: int = 0  # SpecGuard steps the target wrote without an attempt (step_summary)
    steps: list[dict] = field(default_factory=list)  # SpecGuard: one record per step
    candidates_drafted: int = 0
    draft_lengths: dict[int, int] = field(default_factory=dict)  # chosen draft length -> rounds
    precision: str | None = None
    # per round, in order: (drafted, accepted, emitted, chosen draft length | None | STEP); round_lengths and
    # drafts derive from it, and uncommit() edits it
    round_records: list[tuple] = field(default_factory=list, repr=False)
    _choice: int | None = field(default=None, repr=False)

    def record_round(self, drafted: int, accepted: int, emitted: int, events: Mapping[str, int] | None = None) -> None:
        self.rounds += 1
        for name, count in (events or {}).items():
            self.events[name] = self.events.get(name, 0) + count
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        self.new_tokens += emitted
        self.round_records.append((drafted, accepted, emitted, self._choice))
        self._choice = None
        if drafted > len(self.drafted_at):
            grow = drafted - len(self.drafted_at)
            self.drafted_at += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(drafted):
            self.drafted_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1

    def record_draft_length(self, k: int) -> None:
        self.draft_lengths[k] = self.draft_lengths.get(k, 0) + 1
        self._choice = k

    def uncommit(self, n: int) -> None:
        """Take back the last ``n`` emitted tokens: output cut after the rounds that emitted it (a SpecGuard
        step ends at its delimiter, a stop string ends the text), so that the counts describe only what was
        committed. A round left with nothing is removed entirely; a round cut short keeps what it committed,
        its accepted draft tokens reduced to those among them."""
        while n > 0 and self.round_records:
            drafted, accepted, emitted, choice = self.round_records[-1]
            keep = emitted - n
            if keep <= 0:
                self.round_records.pop()
                self.rounds -= 1
                self.drafted_tokens -= drafted
                self.accepted_tokens -= accepted
                self.new_tokens -= emitted
                if choice != STEP:  # an accepted SpecGuard step has no per-position counts
                    for i in range(drafted):
                        self.drafted_at[i] -= 1
                    for i in range(accepted):
                        self.accepted_at[i] -= 1
                if choice not in (None, STEP):
                    self.draft_lengths[choice] -= 1
                    if not self.draft_lengths[choice]:
                        del self.draft_lengths[choice]
                n -= emitted
            else:
                kept = min(accepted, keep)
                if choice != STEP:
                    for i in range(kept, accepted):
                        self.accepted_at[i] -= 1
                self.accepted_tokens -= accepted - kept
                self.new_tokens -= n
                self.round_records[-1] = (drafted, kept, keep, choice)
                n = 0
        # a position only the removed rounds drafted is drafted by none now: drop it (a rate over 0 rounds is none)
        while self.drafted_at and not self.drafted_at[-1]:
            self.drafted_at.pop()
        del self.accepted_at[len(self.drafted_at) :]

    def record_step(self, record: dict, candidates: int) -> None:
        """A SpecGuard step: ``record`` has grounding, confidence, score, accepted, agrees, tokens."""
        self.steps.append(record)
        self.candidates_drafted += candidates
        if record["accepted"]:
            self.rounds += 1
            self.drafted_tokens += record["tokens"]
            self.accepted_tokens += record["tokens"]
            self.new_tokens += record["tokens"]
            self.round_records.append((record["tokens"], record["tokens"], record["tokens"], STEP))

    @property
    def round_lengths(self) -> list[int]:
        """Tokens emitted by each round, in order (Spec-Bench's ``accept_lengths``)."""
        return [r[2] for r in self.round_records]

    @property
    def drafts(self) -> int:
        """Rounds that drafted at least one token (vLLM's ``num_drafts``); an accepted SpecGuard step is one."""
        return sum(1 for r in self.round_records if r[0] > 0)

    def step_summary(self) -> dict:
        """SpecGuard's steps: ``steps`` attempted (candidates drafted and scored), of which ``accepted_steps`` kept
        the draft's and ``target_steps`` were written by the target; ``skipped_steps`` the target wrote without an
        attempt (``sg_steps adaptive``: attempts cost more per token there)."""
        if not self.steps and not self.skipped_steps:
            return {}
        n = len(self.steps)
        accepted = sum(r["accepted"] for r in self.steps)

        def mean(key: str) -> float | None:
            return round(sum(r[key] for r in self.steps) / n, 4) if n else None

        return {
            "steps": n,
            "accepted_steps": accepted,
            "target_steps": n - accepted,
            "skipped_steps": self.skipped_steps,
            "candidates_drafted": self.candidates_drafted,
            # attempts per number of candidates, e.g. {"1": 30, "4": 2}: what adaptive chose
            "attempts_by_k": {
                str(k): sum(r.get("k") == k for r in self.steps)
                for k in sorted({r.get("k") for r in self.steps if r.get("k")})
            },
            "step_accept_rate": round(accepted / n, 4) if n else None,
            "mean_grounding": mean("grounding"),
            "mean_confidence": mean("confidence"),
            "mean_score": mean("score"),
        }

    @property
    def mean_accepted_length(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "prompt_tokens": self.prompt_tokens,
            "rounds": self.rounds,
            "drafts": self.drafts,
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            # the same counts under vLLM's names (SpecDecodingStats in vllm/v1/spec_decode/metrics.py; per-response
            # here, per scheduler step there), beside loosespec's: see VLLM_NAMES
            **{vllm: getattr(self, ours) for vllm, ours in VLLM_NAMES.items()},
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "per_position_acceptance": [round(a / d, 4) for a, d in zip(self.accepted_at, self.drafted_at)],
            "num_drafted_per_pos": list(self.drafted_at),
            "num_accepted_tokens_per_pos": list(self.accepted_at),
            "wall_s": round(self.wall_s, 4),
            "ttft_s": round(self.ttft_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 3),
            **(
                {"draft_length_histogram": {str(k): v for k, v in sorted(self.draft_lengths.items())}}
                if self.draft_lengths
                else {}
            ),
            **({"precision": self.precision} if self.precision else {}),
            **self.events,
            **self.step_summary(),
        }
