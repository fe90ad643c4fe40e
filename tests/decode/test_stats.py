"""Per-run statistics (:class:`loosespec.decode.stats.Stats`): vLLM's names for the counts beside loosespec's."""

from __future__ import annotations

from loosespec.decode.stats import VLLM_NAMES, Stats


def three_rounds() -> Stats:
    s = Stats()
    s.record_round(drafted=3, accepted=2, emitted=3)
    s.record_round(drafted=0, accepted=0, emitted=1)  # a plain target step: drafts nothing, no draft counted
    s.record_round(drafted=4, accepted=0, emitted=1)
    return s


def test_the_summary_has_vllms_counts_beside_loosespecs():
    d = three_rounds().to_dict()
    # vLLM's SpecDecodingStats (vllm/v1/spec_decode/metrics.py): num_drafts counts the steps that proposed draft
    # tokens, num_draft_tokens the tokens proposed, num_accepted_tokens those accepted (no bonus token)
    assert d["num_drafts"] == 2 and d["num_draft_tokens"] == 7 and d["num_accepted_tokens"] == 2
    assert d["num_accepted_tokens_per_pos"] == [1, 1, 0, 0]
    # loosespec's own fields keep their names and values
    assert (d["drafts"], d["drafted_tokens"], d["accepted_tokens"], d["rounds"]) == (2, 7, 2, 3)
    assert d["mean_accepted_length"] == round(5 / 3, 4)
    # vLLM's derived rates from these counts: acceptance rate and mean acceptance length (bonus included)
    assert round(d["num_accepted_tokens"] / d["num_draft_tokens"], 4) == d["acceptance_rate"] == round(2 / 7, 4)
    assert 1 + d["num_accepted_tokens"] / d["num_drafts"] == 2.0
    assert all(d[vllm] == d[ours] for vllm, ours in VLLM_NAMES.items())


def test_vllms_counts_follow_an_uncommit():
    s = three_rounds()
    s.uncommit(1)  # the last round (one token, nothing accepted) is taken back whole
    d = s.to_dict()
    assert (d["num_drafts"], d["num_draft_tokens"], d["num_accepted_tokens"]) == (1, 3, 2)
    # the positions only the removed round drafted (4th) are gone, not rates over no rounds
    assert d["num_drafted_per_pos"] == [1, 1, 1] and d["num_accepted_tokens_per_pos"] == [1, 1, 0]
    assert d["per_position_acceptance"] == [1.0, 1.0, 0.0]
