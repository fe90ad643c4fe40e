"""Running one bench method on one prompt: loosespec's engine, transformers' ``generate`` (``hf-*``) or
llama.cpp (``llamacpp-*``) on the same prompt ids, timed (:func:`run_method`, an :class:`Outcome`); the scorer's
verdict on the output (:func:`judge_output`) and the ``results.jsonl`` row (:func:`result_row`).

Scoring failures are not wrong answers. Every row stores the scorer's verdict
(:class:`loosespec.eval.scoring.Verdict`): ``score`` (True, False, or None for no answer), ``score_status``
(``right``, ``wrong``, ``error``, ``unscored``) and ``score_detail`` (e.g. the sandbox mode, or what
failed). A program under test that fails, times out or runs out of memory is ``wrong``; ``error`` means the
harness failed (a sandbox that could not start, a scorer's own exception). Every row also records the
``hardware`` its timing ran on (:func:`hardware`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loosespec.config import DecodeConfig, knob_default
from loosespec.errors import LoosespecError
from loosespec.eval.bench_methods import HF_ASSISTED, HF_GENERATION_KWARGS, bench_method, is_lossy, method_config
from loosespec.eval.scoring import ScoringError, Verdict, as_verdict


class _RoundCounter:
    """A transformers streamer that records how many tokens each ``generate`` step emits."""

    def __init__(self):
        self.lengths: list[int] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:  # generate() first streams the prompt
            self._prompt_seen = True
            return
        self.lengths.append(int(value.numel()))

    def end(self) -> None:
        pass


@dataclass
class Outcome:
    text: str
    token_ids: list[int]
    wall_s: float
    round_lengths: list[int]
    stats: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)


def hf_generate(
    engine,
    method: str,
    ids,
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    top_p: float = knob_default("top_p"),
    top_k: int = knob_default("top_k"),
) -> Outcome:
    """transformers' own ``generate`` on the same loaded model(s) and prompt ids."""
    import torch
    from transformers import GenerationConfig

    from loosespec.hardware import sync

    eos = sorted(engine.stop_ids)
    sample = temperature > 0
    kwargs = dict(
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        eos_token_id=eos,
        pad_token_id=engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else eos[0],
        **HF_GENERATION_KWARGS[method],
    )
    if sample:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k or None)
    else:  # the checkpoints' sampling defaults would only produce warnings under greedy decoding
        kwargs.update(temperature=None, top_p=None, top_k=None)
    gc = GenerationConfig(**kwargs)
    extra = {"assistant_model": engine.draft.model, "tokenizer": engine.tokenizer} if method in HF_ASSISTED else {}
    if extra and engine.bridge is not None:  # transformers' universal assisted generation
        extra["assistant_tokenizer"] = engine.draft.tokenizer
    counter = _RoundCounter()
    inp = ids.unsqueeze(0).to(engine.device)
    torch.manual_seed(seed)
    sync(engine.device)
    t = time.perf_counter()
    with torch.inference_mode():
        out = engine.target.model.generate(
            inp, attention_mask=torch.ones_like(inp), generation_config=gc, streamer=counter, **extra
        )
    sync(engine.device)
    wall = time.perf_counter() - t
    new = out[0, inp.shape[1] :].tolist()  # batch of one: ends at the first end token, no padding
    text = engine.tokenizer.decode(new, skip_special_tokens=True)
    cfg = {
        "method": method,
        "generate_kwargs": {k: v for k, v in kwargs.items() if v is not None and k != "eos_token_id"},
    }
    return Outcome(text, new, wall, counter.lengths, {"new_tokens": len(new), "rounds": len(counter.lengths)}, cfg)


def loosespec_generate(engine, cfg: DecodeConfig, ids) -> Outcome:
    r = engine.generate(ids, cfg)
    return Outcome(r.text, r.token_ids, r.stats.wall_s, list(r.stats.round_lengths), r.stats.to_dict(), cfg.to_dict())


def llamacpp_generate(engine, method: str, ids, *, max_new_tokens: int, temperature: float) -> Outcome:
    """llama.cpp on the target's GGUF file, greedy, same prompt ids, budget and end tokens."""
    import torch

    from loosespec.eval.peers.llamacpp import SERVER_METHODS, LlamaCppPeer, LlamaServerPeer

    if temperature != 0:
        raise LoosespecError("llamacpp-* methods run greedy only here (--temperature 0)")
    if method in SERVER_METHODS:
        server = getattr(engine, "_llama_server", None)
        if server is None:
            server = engine._llama_server = LlamaServerPeer(
                engine.target.name, engine.draft.name, torch.get_num_threads()
            )
        new, wall, timings = server.generate(ids.tolist(), max_new_tokens, engine.stop_ids)
        text = engine.tokenizer.decode(new, skip_special_tokens=True)
        stats = {
            "new_tokens": len(new),
            "drafted_tokens": timings.get("draft_n"),
            "accepted_tokens": timings.get("draft_n_accepted"),
            "llamacpp_timings": timings,
        }
        cfg = {"method": method, "server": str(server.binary), "args": server.args, "threads": server.threads}
        return Outcome(text, new, wall, [], stats, cfg)
    peer = getattr(engine, "_llamacpp", None)
    if peer is None:
        peer = engine._llamacpp = LlamaCppPeer(engine.target.name, torch.get_num_threads())
    new, wall = peer.generate(method, ids.tolist(), max_new_tokens, engine.stop_ids)
    text = engine.tokenizer.decode(new, skip_special_tokens=True)
    cfg = {"method": method, "gguf": str(peer.path), "threads": peer.threads}
    return Outcome(text, new, wall, [], {"new_tokens": len(new)}, cfg)


def run_method(engine, method: str, ids, settings: dict) -> Outcome:
    """One run of the bench method ``method``, by what runs it (:attr:`BenchMethod.kind`): llama.cpp,
    transformers' ``generate`` or loosespec's engine (the vLLM methods run in a server of their own,
    :mod:`loosespec.eval.harness`)."""
    s = settings
    kind = bench_method(method).kind
    if kind == "llamacpp":
        return llamacpp_generate(engine, method, ids, max_new_tokens=s["max_new_tokens"], temperature=s["temperature"])
    if kind == "hf":
        return hf_generate(
            engine,
            method,
            ids,
            max_new_tokens=s["max_new_tokens"],
            temperature=s["temperature"],
            seed=s["seed"],
            top_p=s["top_p"],
            top_k=s["top_k"],
        )
    cfg = method_config(
        method,
        max_new_tokens=s["max_new_tokens"],
        temperature=s["temperature"],
        seed=s["seed"],
        top_p=s["top_p"],
        top_k=s["top_k"],
        has_draft=engine.draft is not None,
        sg_tau=s["sg_tau"],
        adaptive_draft_length=s.get("adaptive_draft_length", True),
    )
    return loosespec_generate(engine, cfg, ids)


def result_row(
    problem,
    dataset: str,
    method: str,
    outcome: Outcome,
    score: "bool | None | Verdict",
    model_id: str,
    run_id: str | None = None,
) -> dict:
    """One results.jsonl line; ``choices`` follows Spec-Bench's answer-file layout. ``score``: the scorer's
    verdict (a :class:`~loosespec.eval.scoring.Verdict`, or a bool / None as plain scorers return),
    stored as ``score``, ``score_status`` and ``score_detail``."""
    verdict = as_verdict(score)
    st = outcome.stats
    rounds = len(outcome.round_lengths) or st.get("rounds", 0)
    new = len(outcome.token_ids)
    return {
        "question_id": problem.id,
        "category": problem.category,
        "dataset": dataset,
        "method": method,
        "lossy": is_lossy(method),
        "model_id": f"{model_id}/{method}",
        "config": outcome.config,
        "output": outcome.text,
        "token_ids": outcome.token_ids,
        "new_tokens": new,
        "wall_time": round(outcome.wall_s, 4),
        "rounds": rounds,
        "accept_lengths": outcome.round_lengths,
        "mean_accepted_length": round(new / rounds, 4) if rounds else None,
        "drafted_tokens": st.get("drafted_tokens"),
        "accepted_tokens": st.get("accepted_tokens"),
        "stats": st,
        "score": verdict.score,
        "score_status": verdict.status,
        "score_detail": dict(verdict.detail),
        "hardware": hardware(),
        "answer": problem.answer if problem.answer is not None and len(problem.answer) <= 200 else None,
        "choices": [
            {
                "index": 0,
                "turns": [outcome.text],
                "decoding_steps": [rounds],
                "new_tokens": [new],
                "wall_time": [round(outcome.wall_s, 4)],
                "accept_lengths": outcome.round_lengths,
            }
        ],
        "tstamp": time.time(),
        "run_id": run_id,
    }


def hardware() -> dict:
    """What a timing ran on (CPU model and flags of note, GPU), recorded with every result."""
    import torch

    from loosespec.hardware import describe_device

    return describe_device(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))


def judge_output(scorer: Callable, problem, text: str) -> tuple[Verdict, BaseException | None]:
    """The scorer's verdict on ``text`` as a Verdict, never raising for a failure of the scoring: a
    :class:`~loosespec.eval.scoring.ScoringError` or a scorer's own exception is ``Verdict("error", ...)``
    (no answer, scored again on resume). Any other :class:`LoosespecError` (bad scoring options) is an error verdict
    too and is returned second, for the caller to raise once the row is safe."""
    try:
        return as_verdict(scorer(problem, text)), None
    except ScoringError as e:
        return Verdict("error", {"error": str(e), **e.detail}), None
    except LoosespecError as e:
        return Verdict("error", {"error": str(e)}), e
    except Exception as e:  # a scorer's bug is the harness's failure, not a wrong answer
        return Verdict("error", {"error": f"{type(e).__name__}: {e}"}), None
