"""``loosespec generate``: one completion, streamed, with its statistics (and ar's, with --compare-ar)."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Optional

import typer

from loosespec.cli.options import knob_options, knob_values, load_options
from loosespec.cli.root import app
from loosespec.config import DecodeConfig
from loosespec.drafters import drafter_needs_draft_model
from loosespec.errors import LoosespecError
from loosespec.loading import LoadConfig
from loosespec.methods import METHODS, may_use_draft_model

log = logging.getLogger(__name__)


def _read_prompt(prompt: Optional[str], prompt_file: Optional[Path]) -> str:
    if prompt is not None and prompt_file is not None:
        raise LoosespecError("give the prompt as an argument or with --prompt-file, not both")
    if prompt_file is not None:
        try:
            return prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise LoosespecError(f"cannot read prompt file {prompt_file}: {getattr(e, 'strerror', None) or e}") from e
    if prompt is None:
        raise LoosespecError("no prompt: pass PROMPT, '-' to read standard input, or --prompt-file PATH")
    if prompt == "-":
        return sys.stdin.read()
    return prompt


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
    prompt: Optional[str] = typer.Argument(None, help="Prompt text, or '-' to read standard input."),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", help="Read the prompt from this file."),
    load: LoadConfig = None,  # --target, --draft, --dtype, ... (loosespec.loading)
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as plain text, without the chat template."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (text, token_ids, stats, config)."),
    compare_ar: bool = typer.Option(
        False, "--compare-ar", help="Also run plain autoregressive decoding on the same prompt and report the speedup."
    ),
    **knobs,
):
    """Generate a completion, streaming it to the terminal (or as one JSON object with --json).

    Methods ar, exact and rejection are lossless. fly and specguard are LOSSY: fly accepts some
    draft tokens the target would not have chosen, specguard whole draft steps; their output
    differs from the target's own and their results carry "lossy": true.
    """
    from loosespec.decode.engine import Engine

    text = _read_prompt(prompt, prompt_file)
    draft_spec = load.draft_model
    kw = knob_values(knobs)
    method, drafter = kw.pop("method"), kw.pop("drafter", None)
    if not may_use_draft_model(method, drafter):
        draft_spec = None  # no draft model is used: loading one would only cost time and memory
    cfg = DecodeConfig.create(
        method, drafter, kw.pop("num_draft_tokens", None), has_draft_model=draft_spec is not None, **kw
    )
    if draft_spec is None and drafter_needs_draft_model(cfg.drafter):  # fail before loading anything
        raise LoosespecError(f"drafter '{cfg.drafter}' needs a draft model (--draft), but none is loaded")
    engine = Engine.load_from(
        load.replace(draft=draft_spec), progress=not json_out, torch_draft=METHODS[cfg.method].torch_draft
    )
    if compare_ar:  # warm-up, not timed: first forwards pay one-off kernel and allocator set-up
        engine.generate(text, dataclasses.replace(cfg, max_new_tokens=4), raw=raw)
    label = method if cfg.drafter is None else f"{method}-{cfg.drafter}"
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
        if engine.target.precision is not None:
            p = engine.target.precision
            log.info(f"precision: {p.name} ({p.reason})")
        d = engine.draft.precision if engine.draft is not None else None
        if d is not None and d != engine.target.precision:
            log.info(f"draft precision: {d.name} ({d.reason})")
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
    if json_out:
        print(json.dumps(out))
