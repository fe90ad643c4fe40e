"""``loosespec calibrate``: a LOSSY method's thresholds chosen on problems no benchmark reads."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Optional

import typer

from loosespec.cli.options import (
    ALLOW_CODE_HELP,
    DATA_DIR_HELP,
    SANDBOX_HELP,
    csv_numbers,
    knob_options,
    knob_values,
    load_options,
    tqdm_write,
)
from loosespec.cli.root import app
from loosespec.config import DecodeConfig, knob_default
from loosespec.errors import LoosespecError
from loosespec.loading import CACHE_OPTIONS, LoadConfig
from loosespec.methods import METHODS
from loosespec.models import DEFAULT_DRAFT

log = logging.getLogger(__name__)


@app.command()
@knob_options(
    "drafter",
    "max_new_tokens",
    "seed",
    "sg_candidates",
    "sg_temperature",
    "sg_beta",
    "sg_delimiter",
    "sg_embedder",
    "sg_select",
    "sg_first",
    "sg_batch_candidates",
)
@load_options(
    exclude=("revision", "draft_revision", "draft_quantize", *CACHE_OPTIONS),
    defaults={"draft": DEFAULT_DRAFT},
    helps={"draft": "Draft model (SpecGuard drafts steps with it; FLy drafts with MLA)."},
)
def calibrate(
    method: str = typer.Option(  # (not a knob)
        "specguard",
        help="Method to calibrate: specguard (tau, beta, the confidence "
        "variant) | fly (theta, W, K and the copy guard; LOSSY method).",
    ),
    dataset: str = typer.Option(
        "gsm8k-train",
        help="Set(s) to calibrate on, comma-separated: gsm8k-train (GSM8K's "
        "train split), mbpp-train (MBPP's train split, code), which no benchmark reads; or any "
        "bench set (then do not benchmark on those problems).",
    ),
    limit: int = typer.Option(20, help="First N problems of each set."),
    margin: float = typer.Option(
        0.1,
        help="specguard: target_prefers label: the candidate's mean token log-prob under "
        "the target is within MARGIN nats of the target's own step's.",
    ),
    accept_rate: Optional[float] = typer.Option(
        None,
        help="specguard: share of steps the proposed tau should accept; "
        "default: the share of steps the target wrote exactly as the draft did.",
    ),
    theta: str = typer.Option("0.3,0.5,0.7,0.9", help="fly: entropy thresholds to try (comma list)."),
    window: str = typer.Option("2,3,5,8", help="fly: windows to try, positions after the mismatch (comma list)."),
    k: str = typer.Option("15", help="fly: draft lengths K to try (comma list); the baseline drafts the largest."),
    copy_guard: str = typer.Option("0,4", help="fly: copy guard lengths to try (comma list; 0 = off)."),
    confirm: int = typer.Option(
        3,
        help="fly: at most this many settings of the screen's frontier run for real "
        "(a bisection: 3 resolves a frontier of up to 15).",
    ),
    min_retention: float = typer.Option(0.99, help="fly: the accuracy retention the chosen setting must keep."),
    load: LoadConfig = None,  # --target, --draft, --dtype, --quantize, --device (loosespec.loading)
    data_dir: Optional[str] = typer.Option(None, help=DATA_DIR_HELP),
    out: Optional[Path] = typer.Option(
        None,
        help="Write the report here (JSON; a .md table beside it; the per-problem "
        "records in OUT.steps.jsonl for specguard, OUT.runs.jsonl for fly).",
    ),
    allow_code_execution: bool = typer.Option(False, "--allow-code-execution", help=ALLOW_CODE_HELP),
    sandbox: Optional[str] = typer.Option(None, help=SANDBOX_HELP),
    **knobs,
):
    """Calibrate a LOSSY method's thresholds on problems no benchmark reads.

    specguard: tau, beta and the confidence variant from scored steps. Every step is written by the
    target (tau above 1, draft-assisted exact verification), while its draft candidate is still
    scored. Labels per step: "agrees" (the target wrote exactly the candidate) and "target prefers"
    (the target's mean token log-prob of the candidate is within --margin of its own step's). Prints
    the AUC of C, G and S against both labels, their length bias, and the chosen sg_confidence,
    sg_beta and sg_tau.

    fly: theta, W, K and the copy guard for this model pair: a baseline trace (exact verification,
    the largest K every round: the target's own output), every setting of the grid screened on it
    offline, then the real pipeline on settings of the screen's frontier, bisected for the loosest that
    keeps --min-retention of the baseline's accuracy; the fastest confirmed setting that keeps it is
    chosen. Wall-clock
    tokens/s: run it on a quiet machine.

    With --out, per-problem records are written as each problem finishes: rerun to resume, or with a
    larger --limit to add problems.
    """
    from loosespec.decode.engine import Engine
    from loosespec.eval.datasets import load_dataset
    from loosespec.extras import BENCH, require

    require(BENCH, "loosespec calibrate")  # its statistics: before any model loads
    # what is calibrated is the method's own: the step score's tau and beta of a step-level method (SpecGuard),
    # the loose window rule's theta, W and K (FLy)
    spec = METHODS.get(method)
    if spec is None or not (spec.step_level or spec.loose_window):
        raise LoosespecError(f"calibrate supports methods 'specguard' (tau) and 'fly' (theta, W), got '{method}'")
    if accept_rate is not None and not (0.0 < accept_rate <= 1.0):
        raise LoosespecError(f"accept_rate must be in (0, 1], got {accept_rate}")
    if margin < 0:
        raise LoosespecError(f"--margin must be >= 0, got {margin}")
    if limit < 1:
        raise LoosespecError(f"--limit must be a positive integer, got {limit}")
    sets = [d.strip() for d in dataset.split(",") if d.strip()]
    if not sets:
        raise LoosespecError("--dataset names no set")
    from loosespec.eval import datasets as D

    sandbox_mode = D.check_code_execution(sets, allow_code_execution, sandbox)  # before anything loads
    if sandbox_mode is not None:
        log.info(f"# model-written code is scored in the sandbox, mode {sandbox_mode}")
    if spec.loose_window:
        return _calibrate_fly(
            sets,
            limit,
            theta,
            window,
            k,
            copy_guard,
            confirm,
            min_retention,
            load,
            data_dir,
            out,
            knob_values(knobs),
            score_options={} if sandbox_mode is None else {"allow_code_execution": True, "sandbox": sandbox_mode},
        )
    if len(sets) > 1:
        raise LoosespecError("calibrate --method specguard takes one --dataset")
    problems = load_dataset(sets[0], limit, data_dir)
    kw = knob_values(knobs)
    cfg = DecodeConfig.create(method, kw.pop("drafter", None), has_draft_model=True, **kw)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    engine = Engine.load_from(load, torch_draft=True)  # SpecGuard reads the draft's attentions
    from loosespec.eval.calibrate import calibrate_specguard, format_analysis

    steps_file = None if out is None else out.with_name(out.stem + ".steps.jsonl")
    try:
        report = calibrate_specguard(engine, problems, cfg, accept_rate, steps_file=steps_file, margin=margin)
    except ValueError as e:  # no scored steps
        raise LoosespecError(str(e)) from None
    report["command"] = " ".join(["loosespec"] + sys.argv[1:])
    text = format_analysis(report)  # once: the diagnosis' bootstrap intervals take seconds
    if out is not None:
        from loosespec.fileio import atomic_write_text

        atomic_write_text(out, json.dumps(report, indent=1) + "\n")  # replaced whole: never a torn report
        atomic_write_text(out.with_suffix(".md"), text + "\n")
    print(text)


def _calibrate_fly(
    sets,
    limit,
    theta,
    window,
    k,
    copy_guard,
    confirm,
    min_retention,
    load: LoadConfig,
    data_dir,
    out,
    kw,
    score_options,
) -> None:
    """``calibrate --method fly`` (loosespec.eval.calibrate_fly)."""
    from loosespec.decode.engine import Engine
    from loosespec.decode.text import encode_prompt
    from loosespec.eval import datasets as D
    from loosespec.eval.calibrate_fly import calibrate_fly, format_report, grid

    unused = sorted(n for n in kw if n not in ("max_new_tokens",) and kw[n] != knob_default(n))
    if unused:
        raise LoosespecError(
            f"calibrate --method fly does not use {', '.join('--' + n.replace('_', '-') for n in unused)}"
        )
    if confirm < 0:
        raise LoosespecError(f"--confirm must be >= 0, got {confirm}")
    if not 0.0 < min_retention <= 1.5:
        raise LoosespecError(f"--min-retention must be in (0, 1.5], got {min_retention}")
    settings = grid(
        csv_numbers(theta, float, "--theta"),
        csv_numbers(window, int, "--window"),
        csv_numbers(k, int, "--k"),
        csv_numbers(copy_guard, int, "--copy-guard"),
    )
    for s in settings:  # every setting checked by the configuration's own rules before anything loads
        DecodeConfig.create("fly", "mla", has_draft_model=True, **s.knobs())
    if not settings:
        raise LoosespecError("the grid is empty: every --window must be smaller than some --k")
    if load.draft_model in (None, ""):
        raise LoosespecError("calibrate --method fly drafts with MLA: it needs --draft")
    problems, set_of = [], {}
    for name in sets:
        for p in D.load_dataset(name, limit, data_dir):
            problems.append(p)
            set_of[p.id] = name
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    engine = Engine.load_from(load)
    runs = None if out is None else out.with_name(out.stem + ".runs.jsonl")
    report = calibrate_fly(
        engine,
        problems,
        settings,
        max_new_tokens=kw.get("max_new_tokens", 256),
        encode=lambda p: encode_prompt(engine.tokenizer, p.prompt),
        scorer=lambda p, text: D.score(
            set_of[p.id], p, text, **(score_options if D.executes_code(set_of[p.id]) else {})
        ),
        confirm=confirm,
        min_retention=min_retention,
        runs_file=runs,
        log=tqdm_write,
    )
    from loosespec.eval.run import hardware
    from loosespec.eval.stats import machine_label

    report.update(
        command=" ".join(["loosespec"] + sys.argv[1:]),
        datasets=sets,
        limit=limit,
        target=load.target,
        draft=load.draft,
        precision=engine.precision,
        hardware=machine_label(hardware()),
    )
    text = format_report(report)
    if out is not None:
        from loosespec.fileio import atomic_write_text

        atomic_write_text(out, json.dumps(report, indent=1) + "\n")  # replaced whole: never a torn report
        atomic_write_text(out.with_suffix(".md"), text + "\n")
    print(text)
