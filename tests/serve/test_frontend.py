"""Request -> DecodeConfig (loosespec.serve.frontend), without a live server: the server's defaults and a request's
fields."""

import pytest

pytest.importorskip("fastapi")

from loosespec.serve.frontend import Frontend  # noqa: E402
from loosespec.serve.protocol import ApiError, CompletionRequest, ServerSettings  # noqa: E402


def test_a_request_naming_no_method_follows_its_temperature(tiny_engine):
    """`loosespec serve` without --method: a request that samples gets rejection, not exact's 400."""
    auto = Frontend(tiny_engine, ServerSettings(served_model_name="tiny"))

    def cfg(frontend, **fields):
        return frontend.decode_config(CompletionRequest(prompt="abc", **fields), 8)

    assert (cfg(auto).method, cfg(auto).drafter) == ("exact", "mla")  # the engine has a draft model
    sampled = cfg(auto, temperature=0.7)
    assert (sampled.method, sampled.drafter, sampled.temperature) == ("rejection", "mla", 0.7)
    assert cfg(auto, temperature=0.7, method="fly").method == "fly"  # a method the request names is kept
    with pytest.raises(ApiError) as e:  # named by the request: exact is greedy
        cfg(auto, temperature=0.7, method="exact")
    assert e.value.status == 400 and e.value.param == "temperature"
    pinned = Frontend(tiny_engine, ServerSettings(served_model_name="tiny", defaults={"method": "exact"}))
    with pytest.raises(ApiError):  # named by the server (serve --method exact): kept too
        cfg(pinned, temperature=0.7)
    drafted = Frontend(tiny_engine, ServerSettings(served_model_name="tiny", defaults={"drafter": "ngram"}))
    assert (cfg(drafted, temperature=0.7).method, cfg(drafted, temperature=0.7).drafter) == ("rejection", "ngram")
