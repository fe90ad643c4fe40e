"""``loosespec generate``: a completion per prompt, streamed, with its statistics (and ar's, with --compare-ar)."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import List, Optional

import typer

from loosespec.cli.options import (
    apply_speculative_config,
    knob_options,
    knob_values,
    load_options,
    speculative_config_option,
)
from loosespec.cli.root import app
from loosespec.config import DecodeConfig
from loosespec.drafters import drafter_needs_draft_model
from loosespec.errors import LoosespecError
from loosespec.loading import LoadConfig
from loosespec.methods import METHODS, may_use_draft_model

log = logging.getLogger(__name__)


def _read_prompts(prompts: Optional[List[str]], prompt_file: Optional[Path]) -> list[str]:
    if prompts and prompt_file is not None:
        raise LoosespecError("give the prompt as an argument or with --prompt-file, not both")
    if prompt_file is not None:
        try:
            return [prompt_file.read_text(encoding="utf-8")]
        except (OSError, UnicodeDecodeError) as e:
            raise LoosespecError(f"cannot read prompt file {prompt_file}: {getattr(e, 'strerror', None) or e}") from e
    if not prompts:
        raise LoosespecError("no prompt: pass PROMPT, '-' to read standard input, or --prompt-file PATH")
    if prompts.count("-") > 1:
        raise LoosespecError("'-' (standard input) may be given once")
    return [sys.stdin.read() if p == "-" else p for p in prompts]


def _summary(label: str, s: dict) -> str:
    line = (
        f"[{label}] {s['new_tokens']} tokens in {s['wall_s']:.2f} s ({s['tokens_per_s']:.2f} tok/s), "
        f"{s['rounds']} rounds, mean accepted length {s['mean_accepted_length']:.2f}, "
        f"acceptance {100 * s['acceptance_rate']:.1f}%, target forwards {s['target_forwards']}, "
        f"draft forwards {s['draft_forwards']}, ttft {s['ttft_s']:.2f} s"
        + (f", {s['precision']}" if s.get("precision") else "")
    )
    hist = s.get("draft_length_histogram")
    if hist and len(hist) > 1:  # the cost-aware draft length varied: say how
        line += ", draft length k:rounds " + " ".join(f"{k}:{v}" for k, v in hist.items())
    if "draft_units_drafted" in s:  # drafting across tokenizers: say which units are which
        line += (
            f"; across tokenizers: drafted {s['drafted_tokens']} and accepted {s['accepted_tokens']} in target "
            f"tokens ({s['draft_units_drafted']} draft-model tokens proposed)"
        )
    if "steps" in s:
        line += (
            f", steps {s['steps']} ({s['accepted_steps']} from the draft, {s['target_steps']} from the target), "
            f"mean score {s['mean_score']:.3f}"
        )
    return line


@app.command()
@knob_options()
@load_options()
def generate(
    ctx: typer.Context,
    prompts: Optional[List[str]] = typer.Argument(
        None,
        metavar="[PROMPT]...",
        help="Prompt text, or '-' to read standard input; several prompts run one after another.",
    ),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", help="Read the prompt from this file."),
    load: LoadConfig = None,  # --target, --draft, --dtype, ... (loosespec.loading)
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as plain text, without the chat template."),
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON object (text, token_ids, stats, config) per prompt, one per line."
    ),
    compare_ar: bool = typer.Option(
        False, "--compare-ar", help="Also run plain autoregressive decoding on the same prompt and report the speedup."
    ),
    speculative_config: Optional[str] = speculative_config_option(),
    **knobs,
):
    """Generate a completion, streaming it to the terminal (or as one JSON object with --json).

    Several prompts run one after another, each completion under a line '==> prompt 2/3 <=='.
    The method, unless --method names one, is exact when greedy and rejection with --temperature
    above 0; the drafter, unless --drafter names one, mla with a draft model, ngram without.

    Methods ar, exact and rejection are lossless. fly and specguard are LOSSY: fly accepts some
    draft tokens the target would not have chosen, specguard whole draft steps; their output
    differs from the target's own and their results carry "lossy": true.
    """
    from loosespec.decode.engine import Engine

    texts = _read_prompts(prompts, prompt_file)
    draft_spec = load.draft_model
    kw = knob_values(knobs)
    if speculative_config is not None:  # vLLM's spelling (loosespec.speculative_config)
        kw, load = apply_speculative_config(ctx, speculative_config, kw, load)
        draft_spec = load.draft_model
    cfg = DecodeConfig(**kw)  # no --method: exact when greedy, rejection when sampling
    if not may_use_draft_model(cfg.method, cfg.drafter):
        draft_spec = None  # no draft model is used: loading one would only cost time and memory
    cfg = cfg.resolved(has_draft_model=draft_spec is not None)  # no --drafter: the default for the models loaded
    if draft_spec is None and drafter_needs_draft_model(cfg.drafter):  # fail before loading anything
        raise LoosespecError(f"drafter '{cfg.drafter}' needs a draft model (--draft), but none is loaded")
    engine = Engine.load_from(
        load.replace(draft=draft_spec), progress=not json_out, torch_draft=METHODS[cfg.method].torch_draft
    )
    if compare_ar:  # warm-up, not timed: first forwards pay one-off kernel and allocator set-up
        engine.generate(texts[0], dataclasses.replace(cfg, max_new_tokens=4), raw=raw)
    if not json_out:
        if engine.target.precision is not None:
            p = engine.target.precision
            log.info(f"precision: {p.name} ({p.reason})")
        d = engine.draft.precision if engine.draft is not None else None
        if d is not None and d != engine.target.precision:
            log.info(f"draft precision: {d.name} ({d.reason})")
    for i, text in enumerate(texts):
        if len(texts) > 1 and not json_out:
            sys.stdout.write(("\n" if i else "") + f"==> prompt {i + 1}/{len(texts)} <==\n")
        out = _complete(engine, text, cfg, raw, json_out, compare_ar)
        if json_out:
            print(json.dumps(out))


def _complete(engine, text: str, cfg: DecodeConfig, raw: bool, json_out: bool, compare_ar: bool) -> dict:
    """One prompt's completion, streamed to stdout (unless ``json_out``), its statistics logged (and ar's, with
    ``compare_ar``); returns its --json object."""
    label = cfg.method if cfg.drafter is None else f"{cfg.method}-{cfg.drafter}"
    if cfg.lossy:
        label += ", LOSSY"
    gen = engine.stream(text, cfg, raw=raw)
    for chunk in gen:
        if not json_out:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    result = gen.result()
    out = result.to_dict()
    if not json_out:
        sys.stdout.write("\n")
        log.info(_summary(label, out["stats"]))
    if compare_ar:
        ar = engine.generate(text, dataclasses.replace(cfg, method="ar", drafter=None), raw=raw)
        speedup = ar.stats.wall_s / result.stats.wall_s if result.stats.wall_s > 0 else 0.0
        same = ar.token_ids == result.token_ids
        out["ar"] = {"stats": ar.stats.to_dict(), "token_ids_equal": same}
        out["speedup"] = round(speedup, 3)
        if not json_out:
            log.info(_summary("ar", out["ar"]["stats"]))
            log.info(
                f"speedup over autoregressive: {speedup:.2f}x (wall time, same prompt, same process); "
                f"output identical to autoregressive: {same}"
            )
            if not same:
                at = next(
                    (i for i, (a, b) in enumerate(zip(ar.token_ids, result.token_ids)) if a != b),
                    min(len(ar.token_ids), len(result.token_ids)),
                )
                why = (
                    "the method is lossy"
                    if cfg.lossy
                    else f"in {engine.precision} a forward over several tokens rounds differently from a 1-token "
                    "forward and can flip a near-tie; int8 (--quantize int8) and float32 keep lossless methods "
                    "equal to ar"
                )
                log.info(f"first difference at new token {at}: {why}")
    return out
