"""The token-level loop (loosespec.decode.loop) and the drafter protocol it speaks: every round that drafted is
reported back through Drafter.feedback, and what the drafter chose comes back on the Draft, never as attributes the
loop would look for."""

import ast
from pathlib import Path

import torch

from loosespec.decode.kv import CachedLM
from loosespec.decode.loop import decode
from loosespec.decode.stats import Stats
from loosespec.drafters.base import Draft, Drafter
from loosespec.verify.rules import GreedyRule

LOOSESPEC = Path(__file__).resolve().parents[2] / "loosespec"


class Listening(Drafter):
    """Proposes the next tokens of a fixed script, says it chose ``k - 1`` and one level event; hears every round."""

    name = "listening"

    def __init__(self):
        self.heard: list[tuple[int, int]] = []

    def propose(self, seq, k):
        return Draft(torch.full((k - 1,), 65, dtype=torch.long), chosen=k - 1, events={"rounds_lookup": 1})

    def feedback(self, drafted, accepted, first_miss=None):
        self.heard.append((drafted, accepted))


class Quiet(Drafter):
    """Only ``propose``: the protocol's no-op feedback is inherited."""

    name = "quiet"

    def propose(self, seq, k):
        return Draft(torch.full((k,), 65, dtype=torch.long))


def run(engine, drafter, k=4, new=20):
    stats = Stats(prompt_tokens=3)
    ids = torch.tensor([66, 67, 68])
    out = [
        t
        for chunk in decode(CachedLM(engine.target.model), drafter, GreedyRule(), ids, new, k, (), stats)
        for t in chunk
    ]
    return out, stats


def test_every_round_that_drafted_is_reported_and_the_choice_comes_on_the_draft(tiny_engine):
    d = Listening()
    out, stats = run(tiny_engine, d)
    # every round drafts but the last, whose budget has room for the target's token alone (k = 0)
    assert len(out) == 20 and stats.rounds == len(d.heard) + 1
    assert sum(n for n, _ in d.heard) == stats.drafted_tokens
    assert sum(a for _, a in d.heard) == stats.accepted_tokens
    # the histogram records the length the drafter chose (k - 1), never the k it was offered (4 at first)
    hist = stats.to_dict()["draft_length_histogram"]
    assert "3" in hist and "4" not in hist
    assert stats.events["rounds_lookup"] == len(d.heard)  # the drafter's counters, from the draft


def test_a_drafter_with_propose_alone_runs(tiny_engine):
    out, stats = run(tiny_engine, Quiet())
    assert len(out) == 20 and stats.drafted_tokens > 0
    assert "rounds_lookup" not in stats.events
    assert "4" in stats.to_dict()["draft_length_histogram"]  # no choice on the draft: the k it was offered


def test_the_loop_looks_for_no_undeclared_drafter_attribute():
    """getattr/hasattr on the drafter was how the loop used to find last_choice, feedback and round_events."""
    for path in (LOOSESPEC / "decode").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
            ):
                target = ast.unparse(node.args[0])
                assert "drafter" not in target, f"{path.name}:{node.lineno}: {ast.unparse(node)}"


def test_the_step_loop_imports_the_token_loop():
    """SpecGuard's step loop runs the token loop it imports, not one the engine hands it."""
    from loosespec.decode import loop, steps

    assert steps.token_decode is loop.decode
    assert "token_decode" not in steps.StepParts.__dataclass_fields__
