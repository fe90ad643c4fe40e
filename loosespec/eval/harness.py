"""Benchmark and evaluation harness: speed and accuracy of every method, side by side with peers.

``loosespec bench --dataset NAME --out DIR`` runs the chosen methods on the same prompts in one
process (models load once; one short warm-up per method is excluded from timing; methods
interleave per prompt so machine drift hits all alike) and appends one JSON line per prompt and
method to ``DIR/results.jsonl``. ``DIR/summary.json``, the printed table and ``DIR/*.png`` are
derived from that file alone, so ``loosespec report DIR`` redraws them at any time.

Methods (``<method>-<drafter>``): ``ar``; ``exact-``, ``rejection-`` and ``fly-`` with ``ngram``,
``model`` or ``mla``; ``specguard`` (draft-assisted, exact), ``specguard-regenerate`` and
``specguard-fly``; the peers ``hf-ar`` (``generate()``), ``hf-pld``
(``generate(prompt_lookup_num_tokens=10)``) and ``hf-assist`` (``generate(assistant_model=draft)``,
transformers' defaults, in the same precision as loosespec's methods); ``llamacpp-ar`` and
``llamacpp-pld`` (llama.cpp on the target's GGUF file, :mod:`loosespec.eval.peers.llamacpp`); ``vllm-ar``, ``vllm-ngram``, ``vllm-draft``, ``vllm-fly`` and
``vllm-fly-ngram`` served by vLLM with the loosespec plugin (:mod:`loosespec.eval.peers.vllm`; one
``vllm serve`` per method, its prompts in a block, measured against ``vllm-ar``). ``fly-*``,
``vllm-fly*`` and ``specguard*`` are LOSSY and marked so in every result.

Resuming: every finished (question, method) pair is a flushed line; a rerun with the same command
skips those. A torn last line (a run killed mid-write) is dropped with a warning and saved to
``results.jsonl.corrupt``; a damaged line elsewhere is an error. ``DIR/config.json`` holds what the
numbers depend on (models, dtype, device, dataset and its options, token budget, sampling, seed,
SpecGuard's tau); running a different configuration into the same DIR is an error. The prompt
limit and the method list may grow between runs: only the missing pairs run.

Summary metrics, per method over the prompts it shares with its baseline (``ar``; ``vllm-ar`` for the
``vllm-*`` methods when it ran, named in the summary's ``baseline``); "``ar``" below means that baseline:

- ``speedup`` = total ``ar`` wall time / total method wall time, with a 95% bootstrap interval
  over prompts (``speedup_ci95``), over the prompts where both rows ran on the same machine (every row
  records its ``hardware``; ``timed_prompts`` counts them when some did not; a directory timed on several
  machines also gets ``machines``: rows, speedup and tok/s per machine);
- ``tokens_per_s`` = new tokens / wall time (over the same prompts);
- ``mean_accepted_length`` = emitted tokens / rounds over all rounds (Spec-Bench's and vLLM's tau;
  1 for ``ar``; for the peers from the chunks ``generate`` streams per step);
- ``acceptance_rate`` = accepted draft tokens / drafted tokens (loosespec methods);
- ``accuracy`` (scored datasets) with a 95% Wilson interval, ``recovery`` = accuracy / ``ar``
  accuracy, the paired counts ``ar_right_method_wrong`` and ``ar_wrong_method_right`` and McNemar's exact
  p-value on them (``mcnemar_p``: two-sided binomial test of the discordant pairs, 1 when there are none);
- ``identical_to_ar`` = share of outputs whose token ids equal ``ar``'s;
- what actually ran, for the methods with a cost-aware drafter: ``draft_levels``, the share of rounds
  that drafted with the n-gram lookup alone, with the draft model, or not at all (``rounds_explore``:
  rounds a loose rule explored a long draft); for FLy, ``fly_deferrable_rounds`` (rounds whose draft was
  long enough to defer anywhere), ``fly_deferred``, the official counters ``fly_initial_mismatches`` and
  ``fly_window_rescues``, and ``fly_window_meaning`` (what ``fly_window_size`` counted: ``subsequent``
  positions, or ``counting the mismatch`` in rows written before 2026-12-04).
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import random
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loosespec.config import DRAFTERS, DecodeConfig, knob_default
from loosespec.errors import LoosespecError
from loosespec.methods import FLY_GUARD_COUNTERS, FLY_OFFICIAL_COUNTERS, FLY_ROUND_COUNTERS, FLY_WINDOW_MEANING

RESULTS = "results.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.json"

HF_GENERATION_KWARGS = {"hf-ar": {}, "hf-pld": {"prompt_lookup_num_tokens": 10}, "hf-assist": {}}
SPECGUARD_PRESETS = {"specguard": {}, "specguard-regenerate": {"sg_on_reject": "regenerate"},
                     "specguard-fly": {"sg_verify": "fly"}}
STEP_PRESETS = {"specguard": SPECGUARD_PRESETS}  # a step-level method's bench names and their settings
WARMUP_TOKENS = 32  # 8 left transformers' assisted generation paying its one-off set-up in the first timed run
WARMUP_PROMPT_TOKENS = 64  # the warm-up's prompt: the first prompt's start (a long prefill would only cost time)


@dataclass(frozen=True)
class BenchMethod:
    """One name ``loosespec bench --methods`` takes: a loosespec method with its drafter (or a SpecGuard
    preset), or a peer. Lossiness comes from the method registry (loosespec.methods), never from the name."""

    name: str
    kind: str  # "loosespec" | "hf" | "llamacpp" | "vllm"
    lossy: bool
    needs_draft: bool  # loosespec's engine must load the draft model for it
    method: str | None = None  # the loosespec method
    drafter: str | None = None
    overrides: dict = field(default_factory=dict)  # DecodeConfig keywords of a preset


_BENCH_METHODS: dict[str, BenchMethod] = {}


def bench_methods() -> dict[str, BenchMethod]:
    """Every bench method name: the registry's token-level methods x drafters, SpecGuard's presets, the peers."""
    if not _BENCH_METHODS:
        from loosespec.methods import METHODS
        from loosespec.eval.peers.llamacpp import LLAMACPP_METHODS, SERVER_METHODS
        from loosespec.eval.peers.vllm import VLLM_METHODS

        out = {"ar": BenchMethod("ar", "loosespec", METHODS["ar"].lossy, False, "ar")}
        for m in METHODS.values():
            if m.name != "ar" and not m.step_level:
                for d in DRAFTERS:
                    out[f"{m.name}-{d}"] = BenchMethod(f"{m.name}-{d}", "loosespec", m.lossy, d in ("model", "mla"),
                                                       m.name, d)
            elif m.step_level:
                for name, overrides in STEP_PRESETS[m.name].items():
                    out[name] = BenchMethod(name, "loosespec", m.lossy, True, m.name, None, overrides)
        for name in HF_GENERATION_KWARGS:
            out[name] = BenchMethod(name, "hf", False, name == "hf-assist")
        for name in LLAMACPP_METHODS:
            out[name] = BenchMethod(name, "llamacpp", False, False)
        for name in SERVER_METHODS:  # llama.cpp's own speculative decoding with the draft's GGUF
            out[name] = BenchMethod(name, "llamacpp", False, True)
        for name in VLLM_METHODS:  # vLLM's FLy runs loosespec's rule in vLLM: FLy's lossiness
            out[name] = BenchMethod(name, "vllm", METHODS["fly"].lossy if name.startswith("vllm-fly") else False,
                                    False)
        _BENCH_METHODS.update(out)
    return _BENCH_METHODS


def all_method_names() -> list[str]:
    return list(bench_methods())


VARIANT_SEP = "@"
# what a variant may not change: the run's settings (the same for every method, so that speedup and accuracy
# compare like with like) and what the base name already says
NOT_PER_VARIANT = ("method", "drafter", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop")


def bench_method(name: str) -> BenchMethod:
    """A bench method by name: a registered one, or a variant of a loosespec one with knobs set,
    ``<method>@<knob>=<value>[@<knob>=<value>...]`` (e.g. ``fly-ngram@num_draft_tokens=5``,
    ``fly-mla@fly_entropy_threshold=0.6``): the knobs are the decoding configuration's own names,
    validated by its schema. Lossiness is the base method's."""
    from loosespec.config import KNOBS, ConfigError, validate_knob

    known = bench_methods()
    if name in known:
        return known[name]
    base, *parts = name.split(VARIANT_SEP)
    spec = known.get(base)
    if spec is None or not parts:
        raise LoosespecError(f"unknown method '{name}'; choose from: {', '.join(known)} "
                             f"(or a variant, e.g. fly-ngram{VARIANT_SEP}num_draft_tokens=5)")
    if spec.kind != "loosespec":
        raise LoosespecError(f"'{name}': only loosespec's own methods take knob variants, not the peer '{base}'")
    overrides = dict(spec.overrides)
    for part in parts:
        knob, eq, value = part.partition("=")
        if not eq or knob not in KNOBS or knob in NOT_PER_VARIANT:
            allowed = ", ".join(k for k in KNOBS if k not in NOT_PER_VARIANT)
            raise LoosespecError(f"'{name}': '{part}' is not <knob>=<value> with a per-method knob ({allowed})")
        try:
            overrides[knob] = validate_knob(knob, value)
        except ConfigError as e:
            raise LoosespecError(f"'{name}': {e.render('field')}") from None
    return BenchMethod(name, spec.kind, spec.lossy, spec.needs_draft, spec.method, spec.drafter, overrides)


def variant_knobs(name: str) -> dict[str, str]:
    """``fly-ngram@num_draft_tokens=5`` -> {"num_draft_tokens": "5"} (as written; {} for a plain name)."""
    return dict(p.partition("=")[::2] for p in name.split(VARIANT_SEP)[1:])


def base_name(name: str) -> str:
    return name.split(VARIANT_SEP)[0]


def sweep_methods(methods: Sequence[str], knob: str, values: Sequence[str]) -> list[str]:
    """``--sweep knob=v1,v2``: each loosespec method but ``ar`` becomes one variant per value (peers stay)."""
    out = []
    for m in methods:
        if m == "ar" or bench_method(m).kind != "loosespec":
            out.append(m)
        else:
            out += [f"{m}{VARIANT_SEP}{knob}={v}" for v in values]
    return out


def parse_methods(spec: str | Sequence[str]) -> list[str]:
    """``"ar,exact-ngram,..."`` -> validated list with ``ar`` first (the speedup baseline)."""
    items = [m.strip() for m in (spec.split(",") if isinstance(spec, str) else spec) if m.strip()]
    for m in items:
        bench_method(m)  # raises, naming the method and what is wrong with it
    if len(set(items)) != len(items):
        raise LoosespecError(f"a method is listed twice in '{','.join(items)}'")
    return ["ar"] + [m for m in items if m != "ar"]


def needs_draft_model(method: str) -> bool:
    return bench_method(method).needs_draft


def is_lossy(method: str) -> bool:
    return bench_method(method).lossy


def baseline_of(method: str, methods: Sequence[str]) -> str:
    """The method a method's speedup and accuracy retention are measured against: ``vllm-ar`` for the
    ``vllm-*`` methods when it ran (same server software), ``ar`` otherwise."""
    from loosespec.eval.peers.vllm import VLLM_BASELINE, is_vllm_method

    return VLLM_BASELINE if is_vllm_method(method) and VLLM_BASELINE in methods else "ar"


def method_config(method: str, *, max_new_tokens: int, temperature: float, seed: int, has_draft: bool,
                  sg_tau: float | None = None, top_p: float = knob_default("top_p"),
                  top_k: int = knob_default("top_k"),
                  adaptive_draft_length: bool = knob_default("adaptive_draft_length")) -> DecodeConfig | None:
    """The DecodeConfig of a loosespec method (None for the transformers, llama.cpp and vLLM peers)."""
    spec = bench_method(method)
    if spec.kind != "loosespec":
        return None
    common = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, top_p=top_p, top_k=top_k,
                  has_draft_model=has_draft, adaptive_draft_length=adaptive_draft_length)
    tau = {} if sg_tau is None or spec.method != "specguard" else {"sg_tau": sg_tau}
    return DecodeConfig.create(spec.method, spec.drafter, **{**common, **tau, **spec.overrides})  # a variant's knobs win


# ---------------------------------------------------------------------------------------------
# results.jsonl: append, flush, resume
# ---------------------------------------------------------------------------------------------


class ResultsFile:
    """``DIR/results.jsonl``: read with torn-tail recovery, append one flushed line per result."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        rows, good_end, pos = [], 0, 0
        lines = data.split(b"\n")
        for i, raw in enumerate(lines):
            end = pos + len(raw) + (1 if i < len(lines) - 1 else 0)
            is_last = all(not x.strip() for x in lines[i + 1:])
            if raw.strip():
                try:
                    row = json.loads(raw)
                    if not isinstance(row, dict):
                        raise ValueError("not a JSON object")
                    if i == len(lines) - 1:  # no trailing newline: the write did not finish
                        raise ValueError("unterminated line")
                    rows.append(row)
                except ValueError as e:
                    if not is_last:
                        raise LoosespecError(f"{self.path}: line {i + 1} is damaged ({e}) and is not the last line; "
                                             f"repair or remove it before resuming") from None
                    self._drop_tail(data[good_end:], i + 1, good_end, str(e))
                    return rows
            good_end = end if raw.strip() else good_end
            pos = end
        return rows

    def _drop_tail(self, tail: bytes, line_no: int, keep: int, why: str) -> None:
        corrupt = self.path.with_name(self.path.name + ".corrupt")
        with open(corrupt, "ab") as f:
            f.write(tail if tail.endswith(b"\n") else tail + b"\n")
        with open(self.path, "r+b") as f:
            f.truncate(keep)
        warnings.warn(f"{self.path}: dropped a torn last line {line_no} ({why}); it was saved to {corrupt} "
                      f"and its (question, method) pair will run again", stacklevel=3)

    def append(self, row: dict) -> None:
        line = json.dumps(row, ensure_ascii=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


# keys that directories written before they existed lack, and the value those runs had: a directory whose FLy rows
# counted the mismatch in fly_window_size cannot be resumed with today's meaning (rows of both would mix)
LEGACY_WINDOW_MEANING = "counting the mismatch"
LEGACY_CONFIG = {"adaptive_draft_length": False, "fly_window_meaning": LEGACY_WINDOW_MEANING}
DRAFT_LEVELS = ("lookup", "model", "none")  # loosespec.decode.draftlen's rounds_<level> counters


def check_config(out: Path, config: dict) -> None:
    """Write ``DIR/config.json`` on the first run; later runs must match it key for key."""
    path = out / CONFIG
    if path.exists():
        old = {**{k: v for k, v in LEGACY_CONFIG.items() if k in config}, **json.loads(path.read_text())}
        if "draft_dtype" in config and "draft_dtype" not in old:  # written before the draft had its own precision
            old["draft_dtype"] = old.get("dtype") if old.get("draft") else None
        diff = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k))
        if diff:
            lines = "; ".join(f"{k}: {old.get(k)!r} there, {config.get(k)!r} now" for k in diff)
            raise LoosespecError(f"{out} holds results of a different configuration ({lines}); "
                                 f"use another --out directory, or rerun with the same settings")
        return
    path.write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------


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


def hf_generate(engine, method: str, ids, *, max_new_tokens: int, temperature: float, seed: int,
                top_p: float = knob_default("top_p"), top_k: int = knob_default("top_k")) -> Outcome:
    """transformers' own ``generate`` on the same loaded model(s) and prompt ids."""
    import torch
    from transformers import GenerationConfig

    from loosespec.decode.engine import sync

    eos = sorted(engine.stop_ids)
    sample = temperature > 0
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=sample, eos_token_id=eos,
                  pad_token_id=engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else eos[0],
                  **HF_GENERATION_KWARGS[method])
    if sample:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k or None)
    else:  # the checkpoints' sampling defaults would only produce warnings under greedy decoding
        kwargs.update(temperature=None, top_p=None, top_k=None)
    gc = GenerationConfig(**kwargs)
    extra = {"assistant_model": engine.draft.model, "tokenizer": engine.tokenizer} if method == "hf-assist" else {}
    if extra and engine.bridge is not None:  # transformers' universal assisted generation
        extra["assistant_tokenizer"] = engine.draft.tokenizer
    counter = _RoundCounter()
    inp = ids.unsqueeze(0).to(engine.device)
    torch.manual_seed(seed)
    sync(engine.device)
    t = time.perf_counter()
    with torch.inference_mode():
        out = engine.target.model.generate(inp, attention_mask=torch.ones_like(inp), generation_config=gc,
                                           streamer=counter, **extra)
    sync(engine.device)
    wall = time.perf_counter() - t
    new = out[0, inp.shape[1]:].tolist()  # batch of one: ends at the first end token, no padding
    text = engine.tokenizer.decode(new, skip_special_tokens=True)
    cfg = {"method": method, "generate_kwargs": {k: v for k, v in kwargs.items() if v is not None and k != "eos_token_id"}}
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
            server = engine._llama_server = LlamaServerPeer(engine.target.name, engine.draft.name,
                                                            torch.get_num_threads())
        new, wall, timings = server.generate(ids.tolist(), max_new_tokens, engine.stop_ids)
        text = engine.tokenizer.decode(new, skip_special_tokens=True)
        stats = {"new_tokens": len(new), "drafted_tokens": timings.get("draft_n"),
                 "accepted_tokens": timings.get("draft_n_accepted"), "llamacpp_timings": timings}
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
    s = settings
    if method.startswith("llamacpp-"):
        return llamacpp_generate(engine, method, ids, max_new_tokens=s["max_new_tokens"], temperature=s["temperature"])
    if method in HF_GENERATION_KWARGS:
        return hf_generate(engine, method, ids, max_new_tokens=s["max_new_tokens"], temperature=s["temperature"],
                           seed=s["seed"], top_p=s["top_p"], top_k=s["top_k"])
    cfg = method_config(method, max_new_tokens=s["max_new_tokens"], temperature=s["temperature"], seed=s["seed"],
                        top_p=s["top_p"], top_k=s["top_k"], has_draft=engine.draft is not None, sg_tau=s["sg_tau"],
                        adaptive_draft_length=s.get("adaptive_draft_length", True))
    return loosespec_generate(engine, cfg, ids)


def result_row(problem, dataset: str, method: str, outcome: Outcome, score: bool | None, model_id: str) -> dict:
    """One results.jsonl line; ``choices`` follows Spec-Bench's answer-file layout."""
    st = outcome.stats
    rounds = len(outcome.round_lengths) or st.get("rounds", 0)
    new = len(outcome.token_ids)
    return {
        "question_id": problem.id, "category": problem.category, "dataset": dataset, "method": method,
        "lossy": is_lossy(method), "model_id": f"{model_id}/{method}",
        "config": outcome.config, "output": outcome.text, "token_ids": outcome.token_ids, "new_tokens": new,
        "wall_time": round(outcome.wall_s, 4), "rounds": rounds, "accept_lengths": outcome.round_lengths,
        "mean_accepted_length": round(new / rounds, 4) if rounds else None,
        "drafted_tokens": st.get("drafted_tokens"), "accepted_tokens": st.get("accepted_tokens"),
        "stats": st, "score": score, "hardware": hardware(),
        "answer": problem.answer if problem.answer is not None and len(problem.answer) <= 200 else None,
        "choices": [{"index": 0, "turns": [outcome.text], "decoding_steps": [rounds], "new_tokens": [new],
                     "wall_time": [round(outcome.wall_s, 4)], "accept_lengths": outcome.round_lengths}],
        "tstamp": time.time(),
    }


def machine_label(hw: dict | None) -> str:
    """One line naming what a row's timing ran on, e.g. ``Intel(R) Xeon(R) Processor (avx2 avx512f; 2 threads)``
    (``hw`` is a row's ``hardware``; rows written without one read ``unrecorded``). Two rows are timed on the
    same machine when their labels are equal."""
    if not hw:
        return "unrecorded"
    label = f"{hw.get('cpu', '?')} ({' '.join(hw.get('cpu_flags') or []) or 'no flags of note'}; " \
            f"{hw.get('threads', '?')} threads)"
    return label + (f", GPU {hw['gpu']}" if hw.get("gpu") else "")


def hardware() -> dict:
    """What a timing ran on (CPU model and flags of note, GPU), recorded with every result."""
    import torch

    from loosespec.hardware import describe_device

    return describe_device(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))


SPEC_BENCH_KEYS = ("question_id", "category", "model_id", "choices", "tstamp")


def export_spec_bench(rows: Sequence[dict], dest: Path) -> list[Path]:
    """One ``<method>.jsonl`` per method with Spec-Bench's answer-file fields only (``question_id``,
    ``category``, ``model_id``, ``choices[0]`` with ``turns``, ``new_tokens``, ``wall_time``,
    ``accept_lengths``, ``decoding_steps``), the layout its ``evaluation/speed.py`` reads; pass
    ``ar.jsonl`` as its baseline file."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    by_method: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_method[r["method"]].append({k: r[k] for k in SPEC_BENCH_KEYS})
    paths = []
    for m, items in by_method.items():
        paths.append(dest / f"{m}.jsonl")
        paths[-1].write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items), encoding="utf-8")
    return paths


def pending_pairs(problems: Sequence, methods: Sequence[str], done: set[tuple[str, str]]) -> list[tuple]:
    """(problem, method) pairs still to run, problem by problem, methods interleaved."""
    return [(p, m) for p in problems for m in methods if (p.id, m) not in done]


def run_bench(engine, problems: Sequence, methods: Sequence[str], out: Path, *, dataset: str, settings: dict,
              encode: Callable, scorer: Callable[[object, str], bool | None], model_id: str,
              progress: bool = True, log: Callable[[str], None] | None = None, vllm=None) -> list[dict]:
    """Run every missing (problem, method) pair, appending each result as soon as it is scored.
    ``vllm``: :class:`loosespec.eval.peers.vllm.VllmSettings` for the ``vllm-*`` methods."""
    from tqdm.auto import tqdm

    from loosespec.eval.peers.vllm import is_vllm_method

    results = ResultsFile(out / RESULTS)
    rows = results.read()
    done = {(r["question_id"], r["method"]) for r in rows}
    todo = pending_pairs(problems, [m for m in methods if not is_vllm_method(m)], done)
    for m in [m for m in methods if is_vllm_method(m)]:
        _run_vllm_method(m, [p for p in problems if (p.id, m) not in done], out, results, rows, dataset=dataset,
                         settings=settings, encode=encode, scorer=scorer, model_id=model_id, vllm=vllm,
                         progress=progress, log=log)
    if not todo:
        return rows
    warm = list(dict.fromkeys(m for _, m in todo))
    first_ids = encode(todo[0][0])[:WARMUP_PROMPT_TOKENS]
    for m in tqdm(warm, desc="warm-up (not timed)", unit="method", disable=not progress, dynamic_ncols=True):
        # one short untimed run per method: kernel, allocator and generate() set-up
        run_method(engine, m, first_ids, {**settings, "max_new_tokens": min(WARMUP_TOKENS, settings["max_new_tokens"])})
    ids_cache: dict[str, object] = {}
    bar = tqdm(todo, desc=f"bench {dataset}", unit="run", disable=not progress, dynamic_ncols=True)
    for problem, method in bar:
        bar.set_postfix_str(f"{problem.id} {method}")
        if problem.id not in ids_cache:
            ids_cache.clear()
            ids_cache[problem.id] = encode(problem)
        outcome = run_method(engine, method, ids_cache[problem.id], settings)
        _record(problem, method, outcome, results, rows, dataset=dataset, scorer=scorer, model_id=model_id, log=log)
    return rows


def _record(problem, method: str, outcome: Outcome, results: "ResultsFile", rows: list[dict], *, dataset: str,
            scorer: Callable, model_id: str, log: Callable[[str], None] | None) -> None:
    """Score one finished run, append its row (flushed) and log it."""
    score = scorer(problem, outcome.text)
    row = result_row(problem, dataset, method, outcome, score, model_id)
    results.append(row)
    rows.append(row)
    if log is not None:
        log(f"{problem.id:24} {method:20} {row['new_tokens']:4d} tok {row['wall_time']:8.2f} s"
            + ("" if score is None else f"  {'right' if score else 'wrong'}"))


def _run_vllm_method(method: str, problems: Sequence, out: Path, results: "ResultsFile", rows: list[dict], *,
                     dataset: str, settings: dict, encode: Callable, scorer: Callable, model_id: str, vllm,
                     progress: bool, log: Callable[[str], None] | None) -> None:
    """One ``vllm serve`` for ``method``: an untimed warm-up request, then its pending prompts in turn."""
    from tqdm.auto import tqdm

    from loosespec.eval.peers.vllm import VllmServer, size_for_shared_gpu, speculative_tokens, vllm_generate

    if not problems:
        return
    if vllm is None:
        raise LoosespecError(f"method '{method}' needs vLLM settings (the CLI passes them)")
    vllm, sized = size_for_shared_gpu(vllm)  # the engine may hold part of the GPU vLLM is about to claim
    if sized and log is not None:
        log(sized)
    s = settings
    kw = dict(max_new_tokens=s["max_new_tokens"], temperature=s["temperature"], seed=s["seed"], top_p=s["top_p"],
              top_k=s["top_k"])
    server_info = {"dtype": vllm.dtype,
                   "num_speculative_tokens": None if method == "vllm-ar" else speculative_tokens(method, vllm),
                   "fly": method.startswith("vllm-fly"), "concurrency": vllm.concurrency,
                   "gpu_memory_utilization": vllm.gpu_memory_utilization}

    def finish(problem, text, token_ids, wall, stats, request):
        outcome = Outcome(text, token_ids, wall, [], stats,
                          {"method": method, "engine": "vllm", "request": request, "server": server_info})
        _record(problem, method, outcome, results, rows, dataset=dataset, scorer=scorer, model_id=model_id, log=log)

    with VllmServer(method, vllm, out / "vllm.log") as server:
        first = [int(i) for i in encode(problems[0])[:WARMUP_PROMPT_TOKENS]]
        vllm_generate(server.base_url, first, **{**kw, "max_new_tokens": min(WARMUP_TOKENS, s["max_new_tokens"])})
        bar = tqdm(total=len(problems), desc=f"bench {dataset} {method}", unit="run", disable=not progress,
                   dynamic_ncols=True)
        if vllm.concurrency == 1:  # batch of one: each request's own counters
            for problem in problems:
                text, token_ids, wall, delta, request = vllm_generate(server.base_url, [int(i) for i in encode(problem)],
                                                                      **kw)
                drafts = int(delta["drafts"])
                finish(problem, text, token_ids, wall,
                       {"new_tokens": len(token_ids), "rounds": drafts if drafts else len(token_ids),
                        "drafted_tokens": int(delta["draft_tokens"]), "accepted_tokens": int(delta["accepted"]),
                        "wall_s": round(wall, 4), "vllm_counters": delta}, request)
                bar.update()
        else:  # concurrent load: blocks of `concurrency` requests in flight; counters per block
            from concurrent.futures import ThreadPoolExecutor

            from loosespec.eval.peers.vllm import spec_counters

            n = vllm.concurrency
            with ThreadPoolExecutor(n) as pool:
                for b in range(0, len(problems), n):
                    block = problems[b: b + n]
                    before, t = spec_counters(server.base_url), time.perf_counter()
                    futures = [pool.submit(vllm_generate, server.base_url, [int(i) for i in encode(p)],
                                           counters=False, **kw) for p in block]
                    done = [f.result() for f in futures]
                    makespan = time.perf_counter() - t
                    after = spec_counters(server.base_url)
                    delta = {k: after[k] - before[k] for k in after}
                    toks = sum(len(d[1]) for d in done)
                    tau = 1 + delta["accepted"] / delta["drafts"] if delta["drafts"] else 1.0
                    for problem, (text, token_ids, wall, _, request) in zip(block, done):
                        # vLLM's counters cannot be split between requests in flight together: each row's
                        # rounds come from its block's mean accepted length
                        finish(problem, text, token_ids, wall,
                               {"new_tokens": len(token_ids), "rounds": max(1, round(len(token_ids) / tau)),
                                "rounds_from_block": True, "wall_s": round(wall, 4),
                                "block": {"requests": len(block), "makespan_s": round(makespan, 4),
                                          "new_tokens": toks, "vllm_counters": delta}}, request)
                        bar.update()
        bar.close()


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return round(max(0.0, mid - half), 4), round(min(1.0, mid + half), 4)


def mcnemar_exact(b: int, c: int) -> float:
    """McNemar's exact test of paired right/wrong outcomes: the two-sided binomial p-value of ``b`` discordant
    pairs one way against ``c`` the other under p = 1/2 (scipy's ``binomtest``); 1.0 without discordant pairs."""
    if b + c == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(b, b + c, 0.5).pvalue)


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], reps: int = 2000,
                    seed: int = 0) -> tuple | None:  # the resampling's seed (not a knob)
    """95% percentile bootstrap interval of sum(num)/sum(den), resampling paired items.

    Seeded, so a function of its arguments: remembered per process (a report summarises each method once
    per table and again per category and retention check; 0.1 s each at n = 100)."""
    return _bootstrap_ratio(tuple(num), tuple(den), reps, seed)


@functools.lru_cache(maxsize=4096)
def _bootstrap_ratio(num: tuple, den: tuple, reps: int, seed: int) -> tuple | None:
    n = len(num)
    if n < 2:
        return None
    rng = random.Random(seed)
    stats = []
    for _ in range(reps):
        idx = [rng.randrange(n) for _ in range(n)]
        d = sum(den[i] for i in idx)
        if d > 0:
            stats.append(sum(num[i] for i in idx) / d)
    stats.sort()
    return round(stats[int(0.025 * (len(stats) - 1))], 3), round(stats[int(0.975 * (len(stats) - 1))], 3)


def pooled_mean_accepted_length(new_tokens: Sequence[int], rounds: Sequence[int]) -> float | None:
    """Spec-Bench's mean accepted length over several generations: all emitted tokens / all rounds (pooled,
    not the mean of per-prompt values). The one definition every report of this project uses."""
    total = sum(rounds)
    return round(sum(new_tokens) / total, 4) if total else None


def _method_summary(mine: list[dict], ar: dict[str, dict]) -> dict:
    paired = [r for r in mine if r["question_id"] in ar]
    # a results directory may grow over sessions on different machines: a method's time is compared with
    # ar's on the same prompt only where both ran on the same machine (``timed_prompts`` says how many did)
    timed = [r for r in paired if machine_label(r.get("hardware")) == machine_label(ar[r["question_id"]].get("hardware"))]
    wall = sum(r["wall_time"] for r in timed)
    ar_wall = sum(ar[r["question_id"]]["wall_time"] for r in timed)
    toks = sum(r["new_tokens"] for r in timed)
    drafted = [r["drafted_tokens"] for r in paired if r.get("drafted_tokens") is not None]
    accepted = [r["accepted_tokens"] for r in paired if r.get("accepted_tokens") is not None]
    s = {
        "prompts": len(paired), "lossy": any(r["lossy"] for r in mine),
        "speedup": round(ar_wall / wall, 4) if wall > 0 else None,
        "speedup_ci95": bootstrap_ratio([ar[r["question_id"]]["wall_time"] for r in timed],
                                        [r["wall_time"] for r in timed]),
        "wall_s": round(wall, 3), "new_tokens": toks,
        "tokens_per_s": round(toks / wall, 4) if wall > 0 else None,
        "mean_accepted_length": pooled_mean_accepted_length([r["new_tokens"] for r in paired],
                                                            [r["rounds"] for r in paired]),
        "acceptance_rate": round(sum(accepted) / sum(drafted), 4) if drafted and sum(drafted) else None,
        "identical_to_ar": round(sum(r["token_ids"] == ar[r["question_id"]]["token_ids"] for r in paired)
                                 / len(paired), 4) if paired else None,
    }
    if len(timed) < len(paired):
        s["timed_prompts"] = len(timed)
    scored = [r for r in paired if r.get("score") is not None and ar[r["question_id"]].get("score") is not None]
    if scored:
        right = sum(bool(r["score"]) for r in scored)
        ar_right = sum(bool(ar[r["question_id"]]["score"]) for r in scored)
        acc, ar_acc = right / len(scored), ar_right / len(scored)
        s.update({
            "scored": len(scored), "accuracy": round(acc, 4), "accuracy_ci95": wilson(right, len(scored)),
            "ar_accuracy": round(ar_acc, 4), "recovery": round(acc / ar_acc, 4) if ar_acc else None,
            "ar_right_method_wrong": sum(bool(ar[r["question_id"]]["score"]) and not r["score"] for r in scored),
            "ar_wrong_method_right": sum(not ar[r["question_id"]]["score"] and bool(r["score"]) for r in scored),
        })
        s["mcnemar_p"] = mcnemar_exact(s["ar_right_method_wrong"], s["ar_wrong_method_right"])
    blocks = {(b["makespan_s"], b["new_tokens"]): b["vllm_counters"]
              for r in paired if (b := r.get("stats", {}).get("block"))}
    if blocks:  # vLLM under concurrent load: tokens of all requests / time the blocks took
        s["throughput_tokens_per_s"] = round(sum(t for _, t in blocks) / sum(m for m, _ in blocks), 4)
        drafted_in_blocks = sum(c["draft_tokens"] for c in blocks.values())
        if s["acceptance_rate"] is None and drafted_in_blocks:  # rows cannot split the counters; blocks can
            s["acceptance_rate"] = round(sum(c["accepted"] for c in blocks.values()) / drafted_in_blocks, 4)
    steps = [r["stats"].get("steps") for r in paired if r.get("stats", {}).get("steps")]
    if steps:
        s["step_accept_rate"] = round(sum(r["stats"]["accepted_steps"] for r in paired if r["stats"].get("steps"))
                                      / sum(steps), 4)
    # fly_prefix_mismatches was fly_mismatches in rows written before 2026-12-01 (renamed: not the paper's count)
    fly = {"fly_prefix_mismatches": sum(r["stats"].get("fly_prefix_mismatches", r["stats"].get("fly_mismatches", 0))
                                        for r in paired),
           "fly_deferred": sum(r["stats"].get("fly_deferred", 0) for r in paired)}
    for name in FLY_GUARD_COUNTERS:  # only when FLy's copy guard was on (--fly-copy-guard)
        if any(name in r["stats"] for r in paired):
            fly[name] = sum(r["stats"].get(name, 0) for r in paired)
    for name in FLY_OFFICIAL_COUNTERS + FLY_ROUND_COUNTERS:  # rows written before 2026-12-04 lack them
        if any(name in r["stats"] for r in paired):
            fly[name] = sum(r["stats"].get(name, 0) for r in paired)
    if fly["fly_prefix_mismatches"] or any(r.get("config", {}).get("method") == "fly" for r in paired):
        s.update(fly)
        meanings = {r.get("config", {}).get("fly_window_meaning", LEGACY_WINDOW_MEANING) for r in paired}
        s["fly_window_meaning"] = meanings.pop() if len(meanings) == 1 else "mixed"
    s.update(_levels(paired))
    return s


def _levels(rows: list[dict]) -> dict:
    """The share of rounds per draft level (``draft_levels``), and the exploration rounds, over rows with counts."""
    counts = {lv: sum(r.get("stats", {}).get(f"rounds_{lv}", 0) for r in rows) for lv in DRAFT_LEVELS}
    total = sum(counts.values())
    if not total:
        return {}
    out = {"draft_levels": {lv: round(c / total, 4) for lv, c in counts.items()}, "level_rounds": total}
    explore = sum(r.get("stats", {}).get("rounds_explore", 0) for r in rows)
    if explore:
        out["rounds_explore"] = explore
    return out


def summarize(rows: Sequence[dict], methods: Sequence[str] | None = None) -> dict:
    """Per method (``methods``) and per category (``categories``); see the module docstring."""
    methods = list(methods or dict.fromkeys(r["method"] for r in rows))
    present = {r["method"] for r in rows}
    base = {b: {r["question_id"]: r for r in rows if r["method"] == b} for b in ("ar", "vllm-ar")}
    out = {"methods": {}, "categories": {}}
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        if mine:
            b = baseline_of(m, present)
            out["methods"][m] = {**_method_summary(mine, base[b]), **({"baseline": b} if b != "ar" else {})}
    for cat in sorted({r["category"] for r in rows}):
        out["categories"][cat] = {}
        for m in methods:
            mine = [r for r in rows if r["method"] == m and r["category"] == cat]
            if mine:
                b = baseline_of(m, present)
                cat_base = {q: r for q, r in base[b].items() if r["category"] == cat}
                out["categories"][cat][m] = _method_summary(mine, cat_base)
    machines = dict.fromkeys(machine_label(r.get("hardware")) for r in rows)
    if len(machines) > 1:  # speed per machine (accuracy is the whole set's, above)
        out["machines"] = {}
        for label in machines:
            here = [r for r in rows if machine_label(r.get("hardware")) == label]
            on = {"rows": len(here), "methods": {}}
            here_base = {b: {r["question_id"]: r for r in here if r["method"] == b} for b in base}
            for m in methods:
                mine = [r for r in here if r["method"] == m]
                if mine and here_base[baseline_of(m, present)]:
                    ms = _method_summary(mine, here_base[baseline_of(m, present)])
                    on["methods"][m] = {k: ms[k] for k in ("prompts", "speedup", "speedup_ci95", "tokens_per_s")}
            out["machines"][label] = on
    return out


def _fmt(v, spec: str = ".2f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def format_table(summary: dict) -> str:
    # under concurrent load (vLLM, --vllm-concurrency N) tok/s is each request's own rate; the column
    # "throughput tok/s" is what the server delivered: every request's tokens over the time the blocks took
    load = any("throughput_tokens_per_s" in s for s in summary["methods"].values())
    head = ("| method | n | speedup (95% CI) | tok/s |" + (" throughput tok/s |" if load else "")
            + " mean accepted length | acceptance rate | accuracy (95% CI) "
            "| recovery | ar right, method wrong | ar wrong, method right | McNemar p | identical to ar |")
    lines = [head, "| --- |" + " ---: |" * (head.count("|") - 2)]
    for m, s in summary["methods"].items():
        ci = s.get("speedup_ci95")
        speed = _fmt(s["speedup"]) + "x" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
        if "timed_prompts" in s:  # the others ran on another machine than their ar row
            speed += f", {s['timed_prompts']} timed"
        acc = "-"
        if "accuracy" in s:
            a = s["accuracy_ci95"]
            acc = f"{s['accuracy']:.2f} ({a[0]:.2f}-{a[1]:.2f})"
        lines.append(
            f"| {m}{' (lossy)' if s['lossy'] else ''} | {s['prompts']} | {speed} | {_fmt(s['tokens_per_s'])} | "
            + (f"{_fmt(s.get('throughput_tokens_per_s'))} | " if load else "") +
            f"{_fmt(s['mean_accepted_length'])} | {_fmt(s['acceptance_rate'])} | {acc} | {_fmt(s.get('recovery'))} | "
            f"{s.get('ar_right_method_wrong', '-')} | {s.get('ar_wrong_method_right', '-')} | {_fmt(s.get('mcnemar_p'), '.3g')} | "
            f"{_fmt(s['identical_to_ar'])} |")
    return "\n".join(lines)


def format_drafting_table(summary: dict) -> str:
    """What actually ran, per method with a cost-aware drafter or FLy: the share of rounds per draft level, and for
    FLy the rounds long enough to defer, the deferrals and the official accept rate (rescues / initial
    mismatches). Empty when no method has these counts."""
    rows = [(m, s) for m, s in summary["methods"].items() if "draft_levels" in s or "fly_deferred" in s]
    if not rows:
        return ""
    lines = ["| method | rounds | lookup only | draft model | no draft | explored | could defer | deferrals "
             "| official accept rate (rescues / mismatches) | window counts |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for m, s in rows:
        lv = s.get("draft_levels") or {}
        pct = lambda x: "-" if x is None else f"{100 * x:.0f}%"  # noqa: E731
        deferrable = s.get("fly_deferrable_rounds")
        total = s.get("level_rounds")
        rate = "-"
        if s.get("fly_initial_mismatches"):
            rate = f"{s['fly_window_rescues'] / s['fly_initial_mismatches']:.3f} ({s['fly_window_rescues']} / " \
                   f"{s['fly_initial_mismatches']})"
        lines.append(f"| {m}{' (lossy)' if s['lossy'] else ''} | {total if total else '-'} | {pct(lv.get('lookup'))} | "
                     f"{pct(lv.get('model'))} | {pct(lv.get('none'))} | {s.get('rounds_explore', 0) if lv else '-'} | "
                     + (f"{deferrable}" + (f" ({pct(deferrable / total)})" if total else "") if deferrable is not None
                        else "-")
                     + f" | {s.get('fly_deferred', '-')} | {rate} | {s.get('fly_window_meaning', '-')} |")
    return "\n".join(lines)


def format_machine_table(summary: dict) -> str:
    """Where a set was timed on several machines: per machine and method, n, speedup (95% CI) and tok/s."""
    lines = ["| machine | method | n | speedup (95% CI) | tok/s |", "| --- | --- | ---: | ---: | ---: |"]
    for label, on in summary.get("machines", {}).items():
        for m, s in on["methods"].items():
            ci = s.get("speedup_ci95")
            lines.append(f"| {label} | {m} | {s['prompts']} | {_fmt(s['speedup'])}x"
                         + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "") + f" | {_fmt(s['tokens_per_s'])} |")
    return "\n".join(lines)


def format_category_table(summary: dict) -> str:
    """Per category and method: n, speedup, mean accepted length, accuracy, recovery, identical to ar."""
    lines = ["| category | method | n | speedup | mean accepted length | accuracy | recovery | identical to ar |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for cat, per in summary["categories"].items():
        for m, s in per.items():
            lines.append(f"| {cat} | {m}{' (lossy)' if s['lossy'] else ''} | {s['prompts']} | {_fmt(s['speedup'])}x | "
                         f"{_fmt(s['mean_accepted_length'])} | {_fmt(s.get('accuracy'))} | {_fmt(s.get('recovery'))} | "
                         f"{_fmt(s['identical_to_ar'])} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot(rows: Sequence[dict], summary: dict, out: Path) -> list[Path]:
    """speedup_by_category.png, recovery_vs_speedup.png (scored sets), accepted_lengths.png,
    acceptance_by_position.png (pooled over prompts: rounds accepting draft position i / rounds drafting it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    methods = [m for m in summary["methods"] if m != "ar"]
    cats = list(summary["categories"])
    if methods and cats:
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats) * max(1, len(methods)) / 3), 4))
        width = 0.8 / len(methods)
        for i, m in enumerate(methods):
            ys = [summary["categories"][c].get(m, {}).get("speedup") for c in cats]
            xs = [j + i * width for j in range(len(cats))]
            # a method that did not run in a category has no bar (and says so), never a bar of height 0
            ax.bar(xs, [math.nan if y is None else y for y in ys], width,
                   label=m + (" (lossy)" if is_lossy(m) else ""))
            for x, y in zip(xs, ys):
                if y is None:
                    ax.text(x, 0.02, "n/a", rotation=90, ha="center", va="bottom", fontsize=6,
                            transform=ax.get_xaxis_transform())
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats, rotation=20, ha="right")
        ax.set_ylabel("speedup over ar (wall time)")
        ax.set_title("Speedup by category")
        ax.legend(fontsize=7)
        paths.append(_save(plt, fig, out / "speedup_by_category.png"))
    scored = [m for m in methods if summary["methods"][m].get("recovery") is not None]
    if scored:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for m in scored:
            s = summary["methods"][m]
            ax.scatter(s["speedup"], s["recovery"], marker="x" if s["lossy"] else "o")
            ax.annotate(m, (s["speedup"], s["recovery"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.axvline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xlabel("speedup over ar")
        ax.set_ylabel("accuracy recovery (method / ar)")
        ax.set_title("Accuracy recovery vs speedup (x: lossy)")
        paths.append(_save(plt, fig, out / "recovery_vs_speedup.png"))
    lengths = {m: [x for r in rows if r["method"] == m for x in r["accept_lengths"]] for m in summary["methods"]}
    lengths = {m: v for m, v in lengths.items() if v and m != "ar"}
    if lengths:
        top = max(max(v) for v in lengths.values())
        fig, ax = plt.subplots(figsize=(6, 4))
        bins = [x + 0.5 for x in range(0, top + 1)]
        for m, v in lengths.items():
            ax.hist(v, bins=bins, histtype="step", density=True, label=m, lw=1.4)
        ax.set_xlabel("tokens emitted per round (accepted + 1)")
        ax.set_ylabel("share of rounds")
        ax.set_title("Accepted lengths per method")
        ax.legend(fontsize=7)
        paths.append(_save(plt, fig, out / "accepted_lengths.png"))
    paths += _plot_sweeps(plt, summary, out)
    per_pos = acceptance_by_position(rows)
    if per_pos:
        fig, ax = plt.subplots(figsize=(6, 4))
        for m, rates in per_pos.items():
            ax.plot(range(1, len(rates) + 1), rates, marker="o", ms=3, label=m + (" (lossy)" if is_lossy(m) else ""))
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance (rounds accepting it / rounds drafting it)")
        ax.set_ylim(0, 1.02)
        ax.set_title("Acceptance by draft position")
        ax.legend(fontsize=7)
        paths.append(_save(plt, fig, out / "acceptance_by_position.png"))
    return paths


def sweeps(methods: Sequence[str]) -> dict[str, dict[str, list[tuple[float, str]]]]:
    """{knob: {base method: [(value, variant name), ...] sorted by value}} for the knobs that at least two
    variants of one method set (and nothing else): what ``--sweep`` runs."""
    out: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for m in methods:
        knobs = variant_knobs(m)
        if len(knobs) != 1:
            continue
        (knob, value), = knobs.items()
        try:
            x = float(value)
        except ValueError:
            continue  # a categorical knob has no axis
        out[knob][base_name(m)].append((x, m))
    return {k: {b: sorted(v) for b, v in per.items() if len(v) > 1} for k, per in out.items()
            if any(len(v) > 1 for v in per.values())}


def _plot_sweeps(plt, summary: dict, out: Path) -> list[Path]:
    """speedup_by_<knob>.png per swept knob: speedup over ar (95% bootstrap interval as bars where there is one)
    and, on a scored set, accuracy against the knob's value, one line per method; every point is a run."""
    paths = []
    for knob, per_base in sweeps(list(summary["methods"])).items():
        scored = any(summary["methods"][m].get("accuracy") is not None for v in per_base.values() for _, m in v)
        fig, axes = plt.subplots(1, 2 if scored else 1, figsize=(10 if scored else 5.5, 4), squeeze=False)
        for base, points in per_base.items():
            label = base + (" (lossy)" if is_lossy(base) else "")
            xs = [x for x, _ in points]
            s = [summary["methods"][m] for _, m in points]
            ys = [r.get("speedup") for r in s]
            ci = [r.get("speedup_ci95") or (y, y) for r, y in zip(s, ys)]
            err = [[y - lo if y is not None and lo is not None else 0 for y, (lo, _) in zip(ys, ci)],
                   [hi - y if y is not None and hi is not None else 0 for y, (_, hi) in zip(ys, ci)]]
            axes[0][0].errorbar(xs, [math.nan if y is None else y for y in ys], yerr=err, marker="o", ms=4,
                                capsize=3, label=label)
            if scored:
                axes[0][1].plot(xs, [math.nan if r.get("accuracy") is None else r["accuracy"] for r in s],
                                marker="o", ms=4, label=label)
        axes[0][0].axhline(1.0, color="black", lw=0.8, ls="--")
        axes[0][0].set_xlabel(knob)
        axes[0][0].set_ylabel("speedup over ar (wall time)")
        axes[0][0].set_title(f"Speedup against {knob}")
        axes[0][0].legend(fontsize=7)
        if scored:
            ar_acc = next((summary["methods"][m].get("ar_accuracy") for v in per_base.values() for _, m in v
                           if summary["methods"][m].get("ar_accuracy") is not None), None)
            if ar_acc is not None:
                axes[0][1].axhline(ar_acc, color="black", lw=0.8, ls="--", label="ar")
            axes[0][1].set_xlabel(knob)
            axes[0][1].set_ylabel("accuracy")
            axes[0][1].set_title(f"Accuracy against {knob}")
            axes[0][1].legend(fontsize=7)
        paths.append(_save(plt, fig, out / f"speedup_by_{knob}.png"))
    return paths


def acceptance_by_position(rows: Sequence[dict]) -> dict[str, list[float]]:
    """Per method, pooled over its rows: accepted / drafted at each draft position (rows with the counts)."""
    drafted: dict[str, list[int]] = defaultdict(list)
    accepted: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        st = r.get("stats") or {}
        d, a = st.get("num_drafted_per_pos"), st.get("num_accepted_tokens_per_pos")
        if not d or a is None:
            continue
        for counts, new in ((drafted[r["method"]], d), (accepted[r["method"]], a)):
            counts.extend([0] * (len(new) - len(counts)))
            for i, x in enumerate(new):
                counts[i] += x
    return {m: [a / d for a, d in zip(accepted[m] + [0] * (len(drafted[m]) - len(accepted[m])), drafted[m]) if d]
            for m in drafted if any(drafted[m])}


def report(out: Path, methods: Sequence[str] | None = None, config: dict | None = None,
           draw: bool = True, write: bool = True) -> tuple[dict, str]:
    """(Re)build ``summary.json`` (unless not ``write``), the table and the plots from ``DIR/results.jsonl``."""
    out = Path(out)
    if not (out / RESULTS).exists():
        raise LoosespecError(f"no {RESULTS} in {out}: run `loosespec bench --out {out}` first")
    rows = ResultsFile(out / RESULTS).read()
    if not rows:
        raise LoosespecError(f"{out / RESULTS} holds no results yet")
    if config is None and (out / CONFIG).exists():
        config = json.loads((out / CONFIG).read_text())
    summary = summarize(rows, methods)
    if "ar" not in summary["methods"]:
        raise LoosespecError(f"{out} has no ar results: speedup and recovery are measured against ar")
    summary["config"] = config or {}
    summary["rows"] = len(rows)
    if write:
        (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    text = format_table(summary)
    drafting = format_drafting_table(summary)
    if drafting:
        text += "\n\nWhat ran (share of rounds by draft level; FLy: rounds long enough to defer, deferrals):\n\n" + drafting
    if len(summary["categories"]) > 1:
        text += "\n\nBy category:\n\n" + format_category_table(summary)
    if summary.get("machines"):
        text += ("\n\nTimed on several machines; speedup pairs each row with ar's on the same prompt and machine. "
                 "By machine:\n\n" + format_machine_table(summary))
    if draw:
        plot(rows, summary, out)
    return summary, text


def run_config(*, target: str, draft: str | None, dtype: str, device: str, dataset: str, options: dict,
               max_new_tokens: int, temperature: float, top_p: float, top_k: int, seed: int,
               sg_tau: float | None, scorer: str,
               adaptive_draft_length: bool = knob_default("adaptive_draft_length"),
               draft_dtype: str | None = None) -> dict:
    """What the numbers in a results directory depend on (compared on every resume). ``draft_dtype``: the draft's
    precision (None: the target's, or no draft)."""
    import torch
    import transformers

    from loosespec import __version__

    return {"target": target, "draft": draft, "dtype": dtype, "device": device, "dataset": dataset,
            "draft_dtype": None if draft is None else draft_dtype or dtype,
            "dataset_options": options, "max_new_tokens": max_new_tokens, "temperature": temperature,
            "top_p": top_p, "top_k": top_k, "seed": seed, "sg_tau": sg_tau, "scorer": scorer,
            "adaptive_draft_length": adaptive_draft_length, "fly_window_meaning": FLY_WINDOW_MEANING,
            "loosespec": __version__, "torch": torch.__version__.split("+")[0],
            "transformers": transformers.__version__, "machine": platform.machine()}
