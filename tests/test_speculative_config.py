"""vLLM's speculative_config in loosespec's knobs and back (loosespec.speculative_config): one case per key of the
table, round-tripped and reaching the DecodeConfig with its meaning; what loosespec does not have refused by name."""

from __future__ import annotations

import json

import pytest

from loosespec.config import KNOBS, ConfigError, DecodeConfig
from loosespec.drafters import DRAFTERS
from loosespec.methods import METHODS
from loosespec.speculative_config import (
    ACCEPTED_KEYS,
    HELP,
    VLLM_KEYS,
    VLLM_METHODS,
    VLLM_REJECTION_SAMPLE_METHODS,
    SpeculativeConfigError,
    from_vllm,
    merge,
    merge_draft,
    to_vllm,
)

# (vLLM's speculative_config, loosespec's knobs, the draft model, what DecodeConfig.create then holds)
CASES = {
    "method": ({"method": "ngram"}, {"drafter": "ngram"}, None, {"drafter": "ngram"}),
    "model": (
        {"method": "draft_model", "model": "org/draft"},
        {"drafter": "model"},
        "org/draft",
        {"drafter": "model"},
    ),
    "rejection_sample_method": (
        {"rejection_sample_method": "fly"},
        {"method": "fly"},
        None,
        {"method": "fly", "lossy": True},
    ),
    "num_speculative_tokens": ({"num_speculative_tokens": 7}, {"num_draft_tokens": 7}, None, {"num_draft_tokens": 7}),
    "prompt_lookup_max": ({"prompt_lookup_max": 5}, {"prompt_lookup_max": 5}, None, {"prompt_lookup_max": 5}),
    "prompt_lookup_min": ({"prompt_lookup_min": 1}, {"prompt_lookup_min": 1}, None, {"prompt_lookup_min": 1}),
    "fly_window_size": (
        {"rejection_sample_method": "fly", "fly_window_size": 4},
        {"method": "fly", "fly_window_size": 4},
        None,
        {"fly_window_size": 4},
    ),
    "fly_entropy_threshold": (
        {"rejection_sample_method": "fly", "fly_entropy_threshold": 0.6},
        {"method": "fly", "fly_entropy_threshold": 0.6},
        None,
        {"fly_entropy_threshold": 0.6},
    ),
    "fly_entropy_top_k": (
        {"rejection_sample_method": "fly", "fly_entropy_top_k": 5},
        {"method": "fly", "fly_entropy_top_k": 5},
        None,
        {"fly_entropy_top_k": 5},
    ),
}


def test_every_key_of_the_table_has_a_case_and_names_what_loosespec_has():
    assert set(CASES) == set(ACCEPTED_KEYS)
    assert set(VLLM_METHODS.values()) <= set(DRAFTERS)
    assert set(VLLM_REJECTION_SAMPLE_METHODS.values()) - {None} <= set(METHODS)
    assert set(VLLM_KEYS.values()) <= set(KNOBS)
    for key in ACCEPTED_KEYS:  # --help says which keys are taken
        assert key in HELP


@pytest.mark.parametrize("key", list(CASES))
def test_each_key_round_trips_and_reaches_the_config(key):
    spec, knobs, draft, expected = CASES[key]
    read = from_vllm(json.dumps(spec))  # the command line's form
    assert read.knobs == knobs and read.draft == draft
    assert from_vllm(spec).knobs == knobs  # a request's form
    assert to_vllm(knobs, draft) == spec
    assert from_vllm(to_vllm(read.knobs, read.draft)).knobs == knobs
    cfg = DecodeConfig.create(**read.knobs, has_draft_model=draft is not None).to_dict()
    assert {k: cfg[k] for k in expected} == expected


def test_the_standard_rejection_sampler_is_loosespecs_default_method():
    assert from_vllm({"rejection_sample_method": "standard"}).knobs == {}
    assert from_vllm({"rejection_sample_method": "standard"}).lossless
    assert to_vllm({"method": "exact"}) == to_vllm({"method": "rejection"}) == {}  # vLLM's default: left out
    with pytest.raises(ValueError, match="specguard"):
        to_vllm({"method": "specguard"})
    with pytest.raises(ValueError, match="mla"):
        to_vllm({"drafter": "mla"})


def test_the_vllm_examples():
    ngram = from_vllm('{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}')
    cfg = DecodeConfig.create(**ngram.knobs)
    assert (cfg.drafter, cfg.num_draft_tokens, cfg.prompt_lookup_max) == ("ngram", 5, 4)
    fly = from_vllm(
        {
            "method": "draft_model",
            "model": "PATH_OR_ID",
            "num_speculative_tokens": 8,
            "rejection_sample_method": "fly",
            "fly_window_size": 5,
            "fly_entropy_threshold": 0.3,
            "fly_entropy_top_k": 3,
        }
    )
    assert fly.draft == "PATH_OR_ID"
    cfg = DecodeConfig.create(**fly.knobs, has_draft_model=True)
    assert (cfg.method, cfg.drafter, cfg.num_draft_tokens) == ("fly", "model", 8)
    assert (cfg.fly_window_size, cfg.fly_entropy_threshold, cfg.fly_entropy_top_k) == (5, 0.3, 3)
    assert from_vllm({"model": "d"}).knobs == {"drafter": "model"}  # vLLM's proposer for a bare model


@pytest.mark.parametrize(
    "spec,field,words",
    [
        ({"method": "eagle", "model": "x"}, "method", ["'eagle'", "ngram, draft_model"]),
        ({"method": "mtp"}, "method", ["'mtp'", "ngram, draft_model"]),
        ({"method": "medusa"}, "method", ["'medusa'"]),
        ({"rejection_sample_method": "synthetic"}, "rejection_sample_method", ["'synthetic'", "standard, fly"]),
        ({"speculative_token_tree": "[(0,)]"}, "speculative_token_tree", ["'speculative_token_tree'", "fly_window"]),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens", ["num_speculative_tokens must be >= 1, got 0"]),
        ({"fly_entropy_threshold": 0.005}, "fly_entropy_threshold", ["fly_entropy_threshold", "ambiguous"]),
        ({"model": ""}, "model", ["model must be a model name"]),
    ],
)
def test_what_loosespec_does_not_have_is_refused_by_name(spec, field, words):
    with pytest.raises(SpeculativeConfigError) as e:
        from_vllm(spec)
    assert e.value.field == f"speculative_config.{field}"
    assert isinstance(e.value, ConfigError)  # the CLI and the server phrase it as any knob's error
    for w in words:
        assert w in str(e.value), str(e.value)


@pytest.mark.parametrize("text", ["{method: ngram}", "[1, 2]", "5"])
def test_not_a_json_object(text):
    with pytest.raises(SpeculativeConfigError, match="speculative_config") as e:
        from_vllm(text)
    assert "--speculative-config" in e.value.render("cli")


def test_a_knob_given_both_ways_must_agree():
    spec = from_vllm({"method": "ngram", "num_speculative_tokens": 5, "rejection_sample_method": "fly"})
    assert merge(spec, {"num_draft_tokens": 5, "top_k": 3}) == {
        "num_draft_tokens": 5,
        "top_k": 3,
        "drafter": "ngram",
        "method": "fly",
    }
    assert merge(spec, {"num_draft_tokens": 8, "method": "exact"}, given=())["method"] == "fly"  # defaults give way
    with pytest.raises(SpeculativeConfigError) as e:
        merge(spec, {"num_draft_tokens": 8})
    assert e.value.field == "speculative_config.num_speculative_tokens"
    assert "num_speculative_tokens is 5 but num_draft_tokens is 8" in str(e.value)
    assert "--speculative-config num_speculative_tokens is 5 but --num-draft-tokens is 8" in e.value.render("cli")
    with pytest.raises(SpeculativeConfigError, match="method is 'ngram' but drafter is 'mla'"):
        merge(spec, {"drafter": "mla"})
    with pytest.raises(SpeculativeConfigError, match="rejection_sample_method is 'fly' but method is 'exact'"):
        merge(spec, {"method": "exact"})
    with pytest.raises(SpeculativeConfigError, match="'standard' is lossless but method is 'fly'"):
        merge(from_vllm({"rejection_sample_method": "standard"}), {"method": "fly"})
    assert merge(from_vllm({"rejection_sample_method": "standard"}), {"method": "rejection"}) == {"method": "rejection"}


def test_the_draft_model_is_the_draft_option():
    spec = from_vllm({"model": "org/draft"})
    assert merge_draft(spec, "auto", given=False) == "org/draft"
    assert merge_draft(spec, "org/draft", given=True) == "org/draft"
    assert merge_draft(from_vllm({"method": "ngram"}), "auto", given=True) == "auto"
    with pytest.raises(SpeculativeConfigError, match="model is 'org/draft' but --draft is 'other'"):
        merge_draft(spec, "other", given=True)
