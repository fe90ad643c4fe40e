"""``niah``: needle in a haystack over Paul Graham essays (:func:`niah`); its scorer is
:func:`loosespec.eval.scoring.score_niah`."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path
from typing import Any, Callable

from loosespec.errors import LoosespecError
from loosespec.eval import datafiles
from loosespec.eval.datafiles import Problem

NIAH_NEEDLE = "The secret access code for the Dolores Park sandwich shop is {code}."
NIAH_QUESTION = "What is the secret access code for the Dolores Park sandwich shop? Answer with the code only."
NIAH_WORDS = (
    "ALPHA",
    "BRAVO",
    "CHARLIE",
    "DELTA",
    "ECHO",
    "FOXTROT",
    "GOLF",
    "HOTEL",
    "INDIA",
    "JULIET",
    "KILO",
    "LIMA",
    "MIKE",
    "NOVEMBER",
    "OSCAR",
    "PAPA",
    "QUEBEC",
    "ROMEO",
    "SIERRA",
    "TANGO",
    "UNIFORM",
    "VICTOR",
    "WHISKEY",
    "XRAY",
    "YANKEE",
    "ZULU",
)


def approx_tokens(text: str) -> int:
    """Token estimate without a tokenizer: the larger of characters/4 and words/0.75 (both err
    high for English prose with Llama-style tokenizers, ~4.3 characters per token)."""
    return max(math.ceil(len(text) / 4), math.ceil(len(text.split()) / 0.75))


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+|\n\s*")


def _haystack(directory: str | Path | None) -> str:
    essays = datafiles.load_rows("paul_graham_essays.jsonl", directory)
    return "\n\n".join(e["text"] for e in essays if e["title"] != "rss")


_SENTENCE_STOP = re.compile(r"[.!?][\"')\]]?(?=\s)")


def _cut(text: str, n: int) -> str:
    """``text[:n]`` moved back to the end of a sentence within 200 characters, else to the last
    whitespace, so no sentence (or at least no word) is split."""
    if n >= len(text):
        return text
    start = max(0, n - 200)
    stops = [m.end() for m in _SENTENCE_STOP.finditer(text, start, n)]
    if stops:
        return text[: stops[-1]]
    space = max(text.rfind(" ", 0, n), text.rfind("\n", 0, n))
    return text[: space if space > 0 else n].rstrip()


def _fit_prefix(text: str, budget: int, count: Callable[[str], int]) -> str:
    """About the longest whitespace-cut prefix of ``text`` with ``count(prefix) <= budget``, found with a
    characters-per-token estimate and a few ``count`` calls (never a tokenization of all of ``text``)."""
    sample = text[:4000]
    ratio = len(sample) / max(count(sample), 1)  # characters per token
    lo, hi = 0, len(text) + 1  # count(text[:lo]) fits; text[:hi] does not (or is past the end)
    n = min(len(text), int(budget * ratio))
    for _ in range(8):  # secant steps on the ratio
        c = count(_cut(text, n))
        if c <= budget:
            lo = max(lo, n)
            if c >= budget * 0.99 or n >= len(text):
                return _cut(text, lo)
            n = min(len(text), int(n * budget / max(c, 1)) + 1)
        else:
            hi = min(hi, n)
            n = int(n * budget / c * 0.995)
        if not lo < n < hi:
            break
    while hi - lo > max(16, lo // 200):  # bisection to within 0.5 %
        mid = (lo + hi) // 2
        if count(_cut(text, mid)) <= budget:
            lo = mid
        else:
            hi = mid
    return _cut(text, lo)


def _insert_needle(context: str, depth: float, needle: str) -> tuple[str, int]:
    """``context`` with ``needle`` at the sentence boundary nearest ``depth * len(context)``; also its position."""
    target = depth * len(context)
    bounds = [0, len(context)] + [m.end() for m in _SENTENCE_END.finditer(context)]
    b = min(bounds, key=lambda x: (abs(x - target), x))
    if b >= len(context):
        return context.rstrip() + " " + needle, len(context.rstrip()) + 1
    return context[:b] + needle + " " + context[b:], b


def niah_code(length: int, depth: float, seed: int = 0) -> str:  # the generator's seed (not a knob)
    """The needle's code for (length, depth): 4 digits and a word, e.g. ``7319-BRAVO``, seeded."""
    rng = random.Random(f"loosespec-niah/{seed}/{length}/{float(depth)}")
    return f"{rng.randrange(1000, 10000)}-{rng.choice(NIAH_WORDS)}"


def _positive_ints(value: Any, option: str) -> list[int]:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        value = [value] if isinstance(value, int) else [v for v in value.split(",") if v.strip()]
    try:
        out = [int(v) for v in value]
    except (TypeError, ValueError):
        raise LoosespecError(f"niah: {option} must be positive integers (tokens), got {value!r}") from None
    if not out or any(v < 1 for v in out) or any(isinstance(v, bool) for v in value):
        raise LoosespecError(f"niah: {option} must be positive integers (tokens), got {value!r}")
    if len(set(out)) != len(out):
        raise LoosespecError(f"niah: {option} has repeated values: {value!r}")
    return out


def _depths(value: Any) -> list[float]:
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        value = [value] if not isinstance(value, str) else [v for v in value.split(",") if v.strip()]
    try:
        out = [float(v) for v in value]
    except (TypeError, ValueError):
        raise LoosespecError(f"niah: depths must be numbers in [0, 1], got {value!r}") from None
    if not out or any(not 0.0 <= d <= 1.0 for d in out):
        raise LoosespecError(f"niah: depths must be numbers in [0, 1], got {value!r}")
    if len(set(out)) != len(out):
        raise LoosespecError(f"niah: depths has repeated values: {value!r}")
    return out


def niah(
    limit: int | None = None,
    directory: str | Path | None = None,
    context_lengths: Any = (1024, 2048, 4096),
    depths: Any = (0.0, 0.25, 0.5, 0.75, 1.0),
    count_tokens: Callable[[str], int] | None = None,
    seed: int = 0,  # the generator's seed (not a knob)
) -> list[Problem]:
    """Needle-in-a-haystack prompts, one per (context length, depth), ordered by length then depth.

    The haystack is the Paul Graham essays (``rss`` dropped) joined by blank lines in file order,
    repeated if a length needs more. For each length L (tokens) the prompt is
    ``<haystack prefix with the needle>\\n\\n<question>`` with ``count_tokens(prompt) <= L``, the
    prefix as long as fits (within ~1 %) then cut back to a sentence end if one is within 200
    characters (so typically 95-100 % of L); the chat template the caller adds is not counted.
    Without ``count_tokens`` tokens are estimated by :func:`approx_tokens`. The needle
    (:data:`NIAH_NEEDLE`) goes in at the sentence boundary nearest ``depth * len(prefix)``
    characters; its code (:func:`niah_code`) is drawn per (L, depth) from ``seed`` and is the answer.
    ``limit`` keeps the first ``limit`` problems of that (length, depth) order.
    """
    lengths, ds = _positive_ints(context_lengths, "context_lengths"), _depths(depths)
    if count_tokens is not None and not callable(count_tokens):
        raise LoosespecError(f"niah: count_tokens must be a function str -> int or None, got {count_tokens!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise LoosespecError(f"niah: seed must be an integer, got {seed!r}")
    count = count_tokens or approx_tokens
    plan = [(L, d) for L in lengths for d in ds][:limit]
    if not plan:
        return []
    haystack = _haystack(directory)
    codes: dict[tuple[int, float], str] = {}
    used: set[str] = set()
    for L, d in [(L, d) for L in lengths for d in ds]:  # over the full grid, so limit does not change codes
        code, k = niah_code(L, d, seed), 0
        while code in used:
            k += 1
            code = niah_code(L, d, seed * 1000003 + k)
        used.add(code)
        codes[L, d] = code
    question = "\n\n" + NIAH_QUESTION
    out, prefixes = [], {}
    for L, d in plan:
        needle = NIAH_NEEDLE.format(code=codes[L, d])
        if L not in prefixes:
            reserve = count(needle + " ") + count(question) + 2
            if L - reserve < 16:
                raise LoosespecError(
                    f"niah: context length {L} is too short for the needle and question "
                    f"(about {reserve} tokens); use at least {reserve + 64}"
                )
            text = haystack
            if count(haystack[-20000:]) * len(haystack) / 20000 < 1.5 * (L - reserve):  # may not fit: repeat
                while count(text) <= L - reserve:
                    text = text + "\n\n" + haystack
            prefixes[L] = _fit_prefix(text, L - reserve, count)
        context = prefixes[L]
        while True:
            body, pos = _insert_needle(context, d, needle)
            prompt = body + question
            tokens = count(prompt)
            if tokens <= L:
                break
            context = _cut(context, len(context) - max(8, 6 * (tokens - L)))  # rare: boundary tokens differ
        out.append(
            Problem(
                f"niah/{L}/{float(d)}",
                f"niah-{L}",
                prompt,
                codes[L, d],
                {
                    "context_length": L,
                    "depth": float(d),
                    "needle": needle,
                    "code": codes[L, d],
                    "position": round(pos / max(len(body), 1), 4),
                    "tokens": tokens,
                    "token_counter": "count_tokens" if count_tokens else "approx_tokens",
                },
            )
        )
    return out
