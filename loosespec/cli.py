"""``loosespec`` command line: generate, bench, report, calibrate, serve, models.

Errors from bad input are printed as one line (``loosespec: error: ...``) with exit status 2;
no traceback reaches the terminal.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
from pathlib import Path
from typing import List, Optional

os.environ.setdefault("TYPER_USE_RICH", "0")  # plain one-screen click errors, no boxed tracebacks
import typer  # noqa: E402

from loosespec.config import (KNOBS, VLLM_KNOBS, ConfigError, DecodeConfig, knob_default, knob_help,  # noqa: E402
                     knob_info, knob_type)
from loosespec.errors import LoosespecError  # noqa: E402
from loosespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, EMBEDDED  # noqa: E402

BENCH_DEFAULT_METHODS = ("ar", "exact-ngram", "exact-mla", "fly-ngram", "fly-mla", "hf-pld", "hf-assist")

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  help="Loose speculative decoding for LLMs, with lossless baselines and measurements.")
models_app = typer.Typer(invoke_without_command=True, help="List the embedded models, or prepare one (pull).")
app.add_typer(models_app, name="models")

_DTYPE_HELP = ("auto | bfloat16 | float16 | float32. auto: bfloat16 on CUDA (float16 before Ampere); on x86 CPUs "
               "float32 with int8 Linear layers (see --quantize), also where amx_bf16/avx512_bf16 would allow "
               "bfloat16, whose batched matmuls leave lossless methods unequal to ar")
_CACHE_HELP = ("dynamic | static (transformers' cache_implementation). static: the KV cache preallocated at "
               "--max-cache-len positions, rolled back in place (full-attention models; not specguard); needed by "
               "--compile")
_COMPILE_HELP = ("torch.compile the draft steps and verifies on the static cache, padded to fixed lengths (CUDA "
                 "graphs on a GPU). Off by default: compiling costs minutes on a CPU, and GPUs are yet to be measured "
                 "(docs/gpu.md)")
_MAX_CACHE_HELP = "Positions of the static cache: at least prompt + new tokens + 32 (--cache-implementation static)."
_QUANTIZE_HELP = ("auto | none | int8 | int4. int8: Linear layers in int8 (weights per channel, activations per "
                  "token; lossless methods stay equal to ar within it), CPU only; int4: the GGUF's own 4-bit weights "
                  "run by llama.cpp (embedded models and .gguf files; needs llama-cpp-python: make peers), CPU only, "
                  "no SpecGuard; its batched forward rounds rows differently from a 1-token forward, so lossless "
                  "methods are not token-identical to ar in it; auto: int8 on a CPU with torch's int8 engine "
                  "when --dtype is auto (never int4 for a target; see --draft-quantize)")

_DRAFT_QUANTIZE_HELP = ("auto | none | int8 | int4: the draft model's --quantize. auto: as --quantize when that is "
                        "given; with --quantize auto, int4 (llama.cpp) for a GGUF draft where llama-cpp-python is "
                        "installed (a draft only proposes: its rounding cannot change what the target accepts), "
                        "else as the target")


def _draft_quantize_option():
    return typer.Option("auto", "--draft-quantize", help=_DRAFT_QUANTIZE_HELP)


def _revision_option():
    return typer.Option(None, "--revision", help="Hugging Face Hub revision (branch, tag or commit) of a --target "
                        "given as a Hub id; its commit is recorded. Hub weights load as safetensors only. An error "
                        "for an embedded model (pinned by sha256), a .gguf file or a local directory.")


def _draft_revision_option():
    return typer.Option(None, "--draft-revision", help="--revision for a --draft given as a Hub id.")


# ---------------------------------------------------------------------------------------------
# Decoding knobs as options: derived from their one declaration (loosespec.config)
# ---------------------------------------------------------------------------------------------


def _option_type(name: str):
    kind = knob_type(name)
    if name == "stop":
        return list[str]
    if knob_info(name).auto:
        args = [a for a in getattr(kind, "__args__", (kind,)) if a is not type(None)]
        return Optional[args[0]]
    return kind


def _option(name: str, default):
    k = knob_info(name)
    if default is inspect.Parameter.empty:
        default = None if k.auto else knob_default(name)
    if name == "stop":
        default = list(default or [])
    elif k.escapes and isinstance(default, str):
        default = repr(default)[1:-1]  # shown as typed: \n
    decls = [k.flag] if k.flag else []
    return typer.Option(default, *decls, help=knob_help(name))


def knob_options(*names: str, exclude: tuple[str, ...] = (), defaults: Optional[dict] = None):
    """Add the decoding knobs (all CLI knobs, or ``names``) to a command as options, declared from the schema.

    The command takes them as ``**knobs``; :func:`knob_values` turns them into ``DecodeConfig`` keywords.
    Adding a knob to ``DecodeConfig`` adds it to every command using this, with its help and bounds.
    """
    chosen = [n for n in (names or [n for n in KNOBS if knob_info(n).cli]) if n not in exclude]
    defaults = defaults or {}

    def deco(fn):
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        extra = []
        for n in chosen:
            option = _option(n, defaults.get(n, inspect.Parameter.empty))
            kind = _option_type(n)
            extra.append(inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=option,
                                           annotation=Optional[kind] if option.default is None else kind))

        def command(**kw):
            return fn(**kw)

        command.__name__, command.__qualname__, command.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        command.__module__ = fn.__module__
        command.__signature__ = sig.replace(parameters=own + extra)
        return command

    return deco


def knob_values(knobs: dict) -> dict:
    """Option values -> DecodeConfig keywords: escapes interpreted, stop strings as a tuple, unset auto knobs
    left out (DecodeConfig.create fills them)."""
    out = {}
    for name, value in knobs.items():
        k = knob_info(name)
        if value is None and k.auto:
            continue
        if k.escapes and isinstance(value, str):
            value = _unescape(value)
        if name == "stop":
            value = tuple(value or ())
        out[name] = value
    return out


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


def resolve_draft(draft: str, target: str) -> Optional[str]:
    """``none`` -> None; ``auto`` -> the default draft for the default target, else None."""
    if draft.lower() == "none":
        return None
    if draft.lower() == "auto":
        return DEFAULT_DRAFT if target == DEFAULT_TARGET else None
    return draft


def _unescape(text: str) -> str:
    """``\\n`` typed on a command line -> a newline (and the other Python string escapes)."""
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError as e:
        raise LoosespecError(f"bad escape in {text!r}: {e.reason}") from e


def _summary(label: str, s: dict) -> str:
    line = (f"[{label}] {s['new_tokens']} tokens in {s['wall_s']:.2f} s ({s['tokens_per_s']:.2f} tok/s), "
            f"{s['rounds']} rounds, mean accepted length {s['mean_accepted_length']:.2f}, "
            f"acceptance {100 * s['acceptance_rate']:.1f}%, target forwards {s['target_forwards']}, "
            f"draft forwards {s['draft_forwards']}, ttft {s['ttft_s']:.2f} s"
            + (f", {s['precision']}" if s.get("precision") else ""))
    hist = s.get("draft_length_histogram")
    if hist and len(hist) > 1:  # the cost-aware draft length varied: say how
        line += ", draft length k:rounds " + " ".join(f"{k}:{v}" for k, v in hist.items())
    if "draft_units_drafted" in s:  # drafting across tokenizers: say which units are which
        line += (f"; across tokenizers: drafted {s['drafted_tokens']} and accepted {s['accepted_tokens']} in target "
                 f"tokens ({s['draft_units_drafted']} draft-model tokens proposed)")
    if "steps" in s:
        line += (f", steps {s['steps']} ({s['accepted_steps']} from the draft, {s['target_steps']} from the target), "
                 f"mean score {s['mean_score']:.3f}")
    return line


@app.command()
@knob_options()
def generate(
    prompt: Optional[str] = typer.Argument(None, help="Prompt text, or '-' to read standard input."),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", help="Read the prompt from this file."),
    target: str = typer.Option(DEFAULT_TARGET, help="Target model: embedded name, HF id, local dir or .gguf file."),
    draft: str = typer.Option("auto", help=f"Draft model (same forms as --target), or 'none'. 'auto': {DEFAULT_DRAFT} "
                              f"for the default target, none for other targets."),
    revision: Optional[str] = _revision_option(),
    draft_revision: Optional[str] = _draft_revision_option(),
    dtype: str = typer.Option("auto", help=_DTYPE_HELP),
    quantize: str = typer.Option("auto", help=_QUANTIZE_HELP),
    draft_quantize: str = _draft_quantize_option(),
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N | mps"),
    cache_implementation: str = typer.Option("dynamic", help=_CACHE_HELP),
    compile: bool = typer.Option(False, "--compile/--no-compile", help=_COMPILE_HELP),
    max_cache_len: int = typer.Option(8192, min=1, help=_MAX_CACHE_HELP),
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as plain text, without the chat template."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (text, token_ids, stats, config)."),
    compare_ar: bool = typer.Option(False, "--compare-ar",
                                    help="Also run plain autoregressive decoding on the same prompt and report the speedup."),
    **knobs,
):
    """Generate a completion, streaming it to the terminal (or as one JSON object with --json).

    Methods ar, exact and rejection are lossless. fly and specguard are LOSSY: fly accepts some
    draft tokens the target would not have chosen, specguard whole draft steps; their output
    differs from the target's own and their results carry "lossy": true.
    """
    from loosespec.decode.engine import Engine

    text = _read_prompt(prompt, prompt_file)
    draft_spec = resolve_draft(draft, target)
    kw = knob_values(knobs)
    method, drafter = kw.pop("method"), kw.pop("drafter", None)
    if method == "ar" or (drafter == "ngram" and method != "specguard"):
        draft_spec = None  # no draft model is used: loading one would only cost time and memory
    cfg = DecodeConfig.create(method, drafter, kw.pop("num_draft_tokens", None), has_draft_model=draft_spec is not None,
                              **kw)
    if draft_spec is None and cfg.drafter in ("model", "mla"):  # fail before loading anything
        raise LoosespecError(f"drafter '{cfg.drafter}' needs a draft model (--draft), but none is loaded")
    engine = Engine.load(target, draft_spec, dtype=dtype, device=device, progress=not json_out, quantize=quantize,
                         cache_implementation=cache_implementation, compile=compile, max_cache_len=max_cache_len,
                         draft_quantize=draft_quantize, torch_draft=cfg.method == "specguard", revision=revision,
                         draft_revision=draft_revision)
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
            print(f"precision: {p.name} ({p.reason})", file=sys.stderr)
        d = engine.draft.precision if engine.draft is not None else None
        if d is not None and d != engine.target.precision:
            print(f"draft precision: {d.name} ({d.reason})", file=sys.stderr)
        print(_summary(label, out["stats"]), file=sys.stderr)
    if compare_ar:
        ar = engine.generate(text, dataclasses.replace(cfg, method="ar", drafter=None), raw=raw)
        speedup = ar.stats.wall_s / result.stats.wall_s if result.stats.wall_s > 0 else 0.0
        same = ar.token_ids == result.token_ids
        out["ar"] = {"stats": ar.stats.to_dict(), "token_ids_equal": same}
        out["speedup"] = round(speedup, 3)
        if not json_out:
            print(_summary("ar", out["ar"]["stats"]), file=sys.stderr)
            print(f"speedup over autoregressive: {speedup:.2f}x (wall time, same prompt, same process); "
                  f"output identical to autoregressive: {same}", file=sys.stderr)
            if not same:
                at = next((i for i, (a, b) in enumerate(zip(ar.token_ids, result.token_ids)) if a != b),
                          min(len(ar.token_ids), len(result.token_ids)))
                why = ("the method is lossy" if cfg.lossy else
                       f"in {engine.precision} a forward over several tokens rounds differently from a 1-token "
                       "forward and can flip a near-tie; int8 (--quantize int8) and float32 keep lossless methods "
                       "equal to ar")
                print(f"first difference at new token {at}: {why}", file=sys.stderr)
    if json_out:
        print(json.dumps(out))


_ALLOW_CODE_HELP = ("Run model-written code to score humaneval and mbpp-train (pass@1), in loosespec's sandbox "
                    "(also: LOOSESPEC_ALLOW_CODE_EXECUTION=1). Without it those sets are refused.")
_SANDBOX_HELP = ("auto | full | net | none: the sandbox that model-written code runs in (also: LOOSESPEC_SANDBOX). "
                 "auto: the best this machine gives, and never none (no isolation), which must be named; see the "
                 "README's 'Evaluation' section for what each mode protects.")
_DATA_DIR_HELP = ("Folder with evaluation set .jsonl files to use instead of the copies shipped with loosespec "
                  "(a file missing there comes from $LOOSESPEC_DATA, then the shipped copy); 'hub': the standard "
                  "Hugging Face Hub datasets (pip install 'loosespec[hub]').")


@app.command()
@knob_options("drafter", "max_new_tokens", "seed", "sg_candidates", "sg_temperature", "sg_beta", "sg_delimiter",
              "sg_embedder", "sg_select", "sg_batch_candidates")
def calibrate(
    method: str = typer.Option("specguard", help="Method to calibrate: specguard (tau, beta, the confidence "  # (not a knob)
                               "variant) | fly (theta, W, K and the copy guard; LOSSY method)."),
    dataset: str = typer.Option("gsm8k-train", help="Set(s) to calibrate on, comma-separated: gsm8k-train (GSM8K's "
                                "train split), mbpp-train (MBPP's train split, code), which no benchmark reads; or any "
                                "bench set (then do not benchmark on those problems)."),
    limit: int = typer.Option(20, help="First N problems of each set."),
    margin: float = typer.Option(0.1, help="specguard: target_prefers label: the candidate's mean token log-prob under "
                                 "the target is within MARGIN nats of the target's own step's."),
    accept_rate: Optional[float] = typer.Option(None, help="specguard: share of steps the proposed tau should accept; "
                                                "default: the share of steps the target wrote exactly as the draft did."),
    theta: str = typer.Option("0.3,0.5,0.7,0.9", help="fly: entropy thresholds to try (comma list)."),
    window: str = typer.Option("2,3,5,8", help="fly: windows to try, positions after the mismatch (comma list)."),
    k: str = typer.Option("15", help="fly: draft lengths K to try (comma list); the baseline drafts the largest."),
    copy_guard: str = typer.Option("0,4", help="fly: copy guard lengths to try (comma list; 0 = off)."),
    confirm: int = typer.Option(3, help="fly: at most this many settings of the screen's frontier run for real "
                                "(a bisection: 3 resolves a frontier of up to 15)."),
    min_retention: float = typer.Option(0.99, help="fly: the accuracy retention the chosen setting must keep."),
    target: str = typer.Option(DEFAULT_TARGET, help="Target model."),
    draft: str = typer.Option(DEFAULT_DRAFT, help="Draft model (SpecGuard drafts steps with it; FLy drafts with MLA)."),
    dtype: str = typer.Option("auto", help=_DTYPE_HELP),
    quantize: str = typer.Option("auto", help=_QUANTIZE_HELP),
    device: str = typer.Option("auto"),
    data_dir: Optional[str] = typer.Option(None, help=_DATA_DIR_HELP),
    out: Optional[Path] = typer.Option(None, help="Write the report here (JSON; a .md table beside it; the per-problem "
                                       "records in OUT.steps.jsonl for specguard, OUT.runs.jsonl for fly)."),
    allow_code_execution: bool = typer.Option(False, "--allow-code-execution", help=_ALLOW_CODE_HELP),
    sandbox: Optional[str] = typer.Option(None, help=_SANDBOX_HELP),
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
    from loosespec.eval.datasets import load_dataset
    from loosespec.decode.engine import Engine

    if method not in ("specguard", "fly"):
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
        print(f"# model-written code is scored in the sandbox, mode {sandbox_mode}", file=sys.stderr)
    if method == "fly":
        return _calibrate_fly(sets, limit, theta, window, k, copy_guard, confirm, min_retention, target, draft,
                              dtype, quantize, device, data_dir, out, knob_values(knobs),
                              score_options={} if sandbox_mode is None else
                              {"allow_code_execution": True, "sandbox": sandbox_mode})
    if len(sets) > 1:
        raise LoosespecError("calibrate --method specguard takes one --dataset")
    problems = load_dataset(sets[0], limit, data_dir)
    kw = knob_values(knobs)
    cfg = DecodeConfig.create("specguard", kw.pop("drafter", None), has_draft_model=True, **kw)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    engine = Engine.load(target, draft, dtype=dtype, device=device, quantize=quantize,
                         torch_draft=True)  # SpecGuard reads the draft's attentions
    from loosespec.eval.calibrate import calibrate_specguard, format_analysis

    steps_file = None if out is None else out.with_name(out.stem + ".steps.jsonl")
    try:
        report = calibrate_specguard(engine, problems, cfg, accept_rate, steps_file=steps_file, margin=margin)
    except ValueError as e:  # no scored steps
        raise LoosespecError(str(e)) from None
    report["command"] = " ".join(["loosespec"] + sys.argv[1:])
    if out is not None:
        from loosespec.fileio import atomic_write_text

        atomic_write_text(out, json.dumps(report, indent=1) + "\n")  # replaced whole: never a torn report
        atomic_write_text(out.with_suffix(".md"), format_analysis(report) + "\n")
    print(format_analysis(report))


def _calibrate_fly(sets, limit, theta, window, k, copy_guard, confirm, min_retention, target, draft, dtype, quantize,
                   device, data_dir, out, kw, score_options) -> None:
    """``calibrate --method fly`` (loosespec.eval.calibrate_fly)."""
    from loosespec.decode.engine import Engine
    from loosespec.decode.text import encode_prompt
    from loosespec.eval import datasets as D
    from loosespec.eval.calibrate_fly import calibrate_fly, format_report, grid

    unused = sorted(n for n in kw if n not in ("max_new_tokens",) and kw[n] != knob_default(n))
    if unused:
        raise LoosespecError(f"calibrate --method fly does not use {', '.join('--' + n.replace('_', '-') for n in unused)}")
    if confirm < 0:
        raise LoosespecError(f"--confirm must be >= 0, got {confirm}")
    if not 0.0 < min_retention <= 1.5:
        raise LoosespecError(f"--min-retention must be in (0, 1.5], got {min_retention}")
    settings = grid(_csv_numbers(theta, float, "--theta"), _csv_numbers(window, int, "--window"),
                    _csv_numbers(k, int, "--k"), _csv_numbers(copy_guard, int, "--copy-guard"))
    for s in settings:  # every setting checked by the configuration's own rules before anything loads
        DecodeConfig.create("fly", "mla", has_draft_model=True, **s.knobs())
    if not settings:
        raise LoosespecError("the grid is empty: every --window must be smaller than some --k")
    if draft in (None, "", "none"):
        raise LoosespecError("calibrate --method fly drafts with MLA: it needs --draft")
    problems, set_of = [], {}
    for name in sets:
        for p in D.load_dataset(name, limit, data_dir):
            problems.append(p)
            set_of[p.id] = name
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    engine = Engine.load(target, draft, dtype=dtype, device=device, quantize=quantize)
    runs = None if out is None else out.with_name(out.stem + ".runs.jsonl")
    report = calibrate_fly(engine, problems, settings, max_new_tokens=kw.get("max_new_tokens", 256),
                           encode=lambda p: encode_prompt(engine.tokenizer, p.prompt),
                           scorer=lambda p, text: D.score(set_of[p.id], p, text,
                                                          **(score_options if D.executes_code(set_of[p.id]) else {})),
                           confirm=confirm,
                           min_retention=min_retention, runs_file=runs, log=tqdm_write)
    from loosespec.eval.run import hardware
    from loosespec.eval.stats import machine_label

    report.update(command=" ".join(["loosespec"] + sys.argv[1:]), datasets=sets, limit=limit,
                  target=target, draft=draft, precision=engine.precision, hardware=machine_label(hardware()))
    text = format_report(report)
    if out is not None:
        from loosespec.fileio import atomic_write_text

        atomic_write_text(out, json.dumps(report, indent=1) + "\n")  # replaced whole: never a torn report
        atomic_write_text(out.with_suffix(".md"), text + "\n")
    print(text)


def _csv_numbers(text: Optional[str], kind: type, flag: str) -> Optional[tuple]:
    if text is None:
        return None
    try:
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise LoosespecError(f"{flag} takes comma-separated numbers, got '{text}'") from None


BENCH_KNOBS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "sg_tau", "adaptive_draft_length")


@app.command()
@knob_options(*BENCH_KNOBS, defaults={"sg_tau": None})  # no tau: the library's, kept out of the run's config
def bench(
    dataset: str = typer.Option(..., help="gsm8k | mgsm | math500 | humaneval | specbench | mtbench | niah"),
    out: Path = typer.Option(..., help="Results directory (results.jsonl, summary.json, plots); rerun to resume."),
    limit: Optional[int] = typer.Option(None, help="First N problems (per language for mgsm, per category for specbench)."),
    methods: str = typer.Option(",".join(BENCH_DEFAULT_METHODS),
                                help="Comma list of <method>-<drafter> (ar, exact-ngram, exact-model, exact-mla, "
                                     "rejection-*, fly-ngram, fly-mla [LOSSY], specguard, specguard-regenerate, "
                                     "specguard-fly [LOSSY]), the transformers peers hf-ar, hf-pld, hf-assist, "
                                     "llama.cpp (make peers) llamacpp-ar, llamacpp-pld, llamacpp-spec (its server's "
                                     "speculative decoding with the draft model), and vLLM (make vllm) vllm-ar, "
                                     "vllm-ngram, vllm-draft, vllm-fly, vllm-fly-ngram [LOSSY]. ar is always run: it is the baseline (vllm-ar for "
                                     "the vllm-* methods when listed). A loosespec method with knobs set is "
                                     "<method>@<knob>=<value>, e.g. fly-ngram@fly_entropy_threshold=0.6."),
    target: str = typer.Option(DEFAULT_TARGET, help="Target model: embedded name, HF id, local dir or .gguf file."),
    draft: str = typer.Option("auto", help=f"Draft model or 'none'; 'auto': {DEFAULT_DRAFT} for the default target."),
    revision: Optional[str] = _revision_option(),
    draft_revision: Optional[str] = _draft_revision_option(),
    dtype: str = typer.Option("auto", help=_DTYPE_HELP),
    quantize: str = typer.Option("auto", help=_QUANTIZE_HELP),
    draft_quantize: str = _draft_quantize_option(),
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N | mps"),
    cache_implementation: str = typer.Option("dynamic", help=_CACHE_HELP),
    compile: bool = typer.Option(False, "--compile/--no-compile", help=_COMPILE_HELP),
    max_cache_len: int = typer.Option(8192, min=1, help=_MAX_CACHE_HELP),
    lang: Optional[str] = typer.Option(None, help="mgsm: language code(s), comma-separated (e.g. en,de)."),
    category: Optional[str] = typer.Option(None, help="specbench: one task type (mt_bench, translation, "
                                           "summarization, qa, math_reasoning, rag); default all six."),
    context_lengths: Optional[str] = typer.Option(None, help="niah: context lengths in target tokens, e.g. 1024,2048."),
    depths: Optional[str] = typer.Option(None, help="niah: needle depths in [0, 1], e.g. 0,0.5,1."),
    data_dir: Optional[str] = typer.Option(None, help=_DATA_DIR_HELP),
    sweep: Optional[str] = typer.Option(None, help="<knob>=<v1>,<v2>,...: run each loosespec method but ar once per "
                                        "value (as <method>@<knob>=<value>, a name --methods also takes) and plot "
                                        "speedup (and accuracy) against the knob, e.g. num_draft_tokens=5,10,15 "
                                        "or fly_entropy_threshold=0.1,0.3,0.6."),
    plots: bool = typer.Option(True, help="Draw DIR/*.png at the end."),
    vllm_num_speculative_tokens: Optional[int] = typer.Option(
        None, help="vllm-* methods: speculative_config's num_speculative_tokens (default: 5; FLy's K, 15, for "
        "vllm-fly*: FLy defers a mismatch only if its window fits in the draft)."),
    vllm_concurrency: int = typer.Option(1, help="vllm-* methods: requests in flight (1: batch of one; N: blocks "
                                         "of N concurrent requests, throughput in the summary)."),
    vllm_max_num_batched_tokens: Optional[int] = typer.Option(
        None, help="vllm-* methods: vLLM's --max-num-batched-tokens (default: vLLM's). vLLM profiles a forward of "
        "this many tokens at every start: small values start much faster on a CPU."),
    allow_code_execution: bool = typer.Option(False, "--allow-code-execution", help=_ALLOW_CODE_HELP),
    sandbox: Optional[str] = typer.Option(None, help=_SANDBOX_HELP),
    **knobs,
):
    """Benchmark methods side by side: speedup over ar and accuracy retention, resumable.

    Appends one line per (prompt, method) to OUT/results.jsonl as it finishes; rerunning the same
    command skips finished pairs. fly-* and specguard* are LOSSY: their accuracy is measured
    against ar on the same prompts (recovery, paired counts, identical outputs).
    """
    from loosespec.eval import bench_methods as M
    from loosespec.eval import harness as B
    from loosespec.eval import report as RP
    from loosespec.eval import results as R
    from loosespec.eval import datasets as D

    max_new_tokens, temperature, top_p, top_k, seed, sg_tau, adaptive_draft_length = (knobs[n] for n in BENCH_KNOBS)
    if limit is not None and limit < 1:
        raise LoosespecError(f"--limit must be a positive integer, got {limit}")
    if max_new_tokens < 1:
        raise LoosespecError(f"--max-new-tokens must be positive, got {max_new_tokens}")
    method_list = M.parse_methods(methods)
    sandbox_mode = D.check_code_execution([dataset], allow_code_execution, sandbox)  # before anything loads
    if sandbox_mode is not None:
        print(f"# model-written code is scored in the sandbox, mode {sandbox_mode}", file=sys.stderr)
    score_options = {} if sandbox_mode is None else {"allow_code_execution": True, "sandbox": sandbox_mode}
    if sweep is not None:
        knob, eq, values = sweep.partition("=")
        values = [v.strip() for v in values.split(",") if v.strip()]
        if not eq or not values:
            raise LoosespecError(f"--sweep takes <knob>=<v1>,<v2>,..., e.g. num_draft_tokens=5,10,15; got '{sweep}'")
        method_list = M.parse_methods(M.sweep_methods(method_list, knob.strip(), values))
    if vllm_concurrency < 1:
        raise LoosespecError(f"--vllm-concurrency must be >= 1, got {vllm_concurrency}")
    if vllm_num_speculative_tokens is not None and vllm_num_speculative_tokens < 1:
        raise LoosespecError(f"--vllm-num-speculative-tokens must be >= 1, got {vllm_num_speculative_tokens}")
    if vllm_max_num_batched_tokens is not None and vllm_max_num_batched_tokens < 1:
        raise LoosespecError(f"--vllm-max-num-batched-tokens must be >= 1, got {vllm_max_num_batched_tokens}")
    draft_spec = resolve_draft(draft, target)
    missing = [m for m in method_list if M.needs_draft_model(m)]
    vllm_draft = [m for m in method_list if m in ("vllm-draft", "vllm-fly")]
    if (missing or vllm_draft) and draft_spec is None:
        raise LoosespecError(f"method(s) {', '.join(missing + vllm_draft)} need a draft model: pass --draft")
    from loosespec.models import check_revision

    check_revision(target, revision)  # Hub ids only; before anything is loaded
    if draft_spec is not None:
        check_revision(draft_spec, draft_revision, "--draft-revision")
    if (revision or draft_revision) and any(m.startswith("vllm-") for m in method_list):
        raise LoosespecError("--revision/--draft-revision are not passed to vLLM: run the vllm-* methods in a bench "
                             "of their own without them, or on a local copy of the revision")
    # the config names the draft whether or not these methods load it, so that a later run adding
    # draft-model methods to the same directory matches
    load_draft = draft_spec if missing else None
    settings = {"adaptive_draft_length": adaptive_draft_length,
                "max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                "seed": seed, "sg_tau": sg_tau}
    for m in method_list:  # fail on bad settings before loading anything
        M.method_config(m, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, top_p=top_p,
                        top_k=top_k, has_draft=load_draft is not None, sg_tau=sg_tau)
    options = {k: v for k, v in {"lang": lang, "category": category,
                                 "context_lengths": _csv_numbers(context_lengths, int, "--context-lengths"),
                                 "depths": _csv_numbers(depths, float, "--depths")}.items() if v is not None}
    problems = D.load_dataset(dataset, limit, data_dir, **options)  # validates name and options early
    from loosespec.models import pick_device

    resolved = str(pick_device(device))
    from loosespec.decode.engine import draft_quantize_for, draft_role
    from loosespec.hardware import resolve_precision
    from loosespec.models import has_gguf

    # SpecGuard reads the draft's attentions and hf-assist runs it in transformers: no llama.cpp draft for them
    torch_draft = any(m == "hf-assist" or M.bench_method(m).method == "specguard" for m in method_list)

    precision = resolve_precision(dtype, quantize, pick_device(device), gguf=has_gguf(target))
    draft_precision = None if draft_spec is None else resolve_precision(
        dtype, draft_quantize_for(quantize, draft_quantize), pick_device(device), gguf=has_gguf(draft_spec),
        role=draft_role(torch_draft)).name
    config = R.run_config(target=target, draft=draft_spec, dtype=precision.name, device=resolved, dataset=dataset,
                          draft_dtype=draft_precision,
                          adaptive_draft_length=adaptive_draft_length,
                          options={k: list(v) if isinstance(v, tuple) else v for k, v in options.items()},
                          max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                          seed=seed, sg_tau=sg_tau, scorer=D.SCORERS_DOC.get(dataset, "none"))
    if vllm_concurrency > 1:  # a different measurement: it gets its own directory
        config["vllm_concurrency"] = vllm_concurrency
    # the Hub revisions asked for, recorded when given (the runs before them stay resumable): a folder resumed with
    # another revision is refused like any other setting; the commit each resolved to is in the run's provenance
    if revision is not None:
        config["target_revision"] = revision
    if draft_revision is not None and draft_spec is not None:
        config["draft_revision"] = draft_revision
    from loosespec.decode.engine import check_cache_options

    check_cache_options(cache_implementation, compile)
    if cache_implementation != "dynamic":  # recorded when not the default: the runs before it stay resumable
        if any(m.startswith("specguard") for m in method_list):
            raise LoosespecError("specguard methods need --cache-implementation dynamic")
        config.update(cache_implementation=cache_implementation, compile=compile)
    out.mkdir(parents=True, exist_ok=True)
    # the folder's lock for the whole run (one line naming the holder's pid if another run holds it), the config
    # checked and this run's provenance recorded in config.json, a torn last line repaired
    run = R.open_run(out, config, data_dir=data_dir, sandbox=sandbox_mode)
    scorer = lambda p, text: D.judge(dataset, p, text, **score_options)  # noqa: E731
    # rows whose scoring failed (no answer) are scored again from their stored outputs
    rows = B.rescore_errors(out, problems, method_list, scorer=scorer, log=tqdm_write)
    done = {(r["question_id"], r["method"]) for r in rows}
    if B.pending_pairs(problems, method_list, done):
        from loosespec.decode.engine import Engine
        from loosespec.decode.text import encode_prompt

        engine = Engine.load(target, load_draft, dtype=dtype, device=resolved, quantize=quantize,
                             cache_implementation=cache_implementation, compile=compile, max_cache_len=max_cache_len,
                             draft_quantize=draft_quantize, torch_draft=torch_draft, revision=revision,
                             draft_revision=draft_revision)
        if dataset == "niah":  # sized in the target's tokens
            problems = D.load_dataset(dataset, limit, data_dir, **options,
                                      count_tokens=lambda t: len(engine.tokenizer(t).input_ids))
        todo = B.pending_pairs(problems, method_list, done)
        print(f"# {len(problems)} problems x {len(method_list)} methods: {len(todo)} runs to do, "
              f"{len(done)} already in {out / R.RESULTS}", file=sys.stderr)
        vllm = None
        if any(m.startswith("vllm-") for m in method_list):
            from loosespec.models import resolve
            from loosespec.eval.peers.vllm import VllmSettings

            if precision.name not in ("bfloat16", "float32", "int8") or (resolved != "cpu"
                                                                         and not resolved.startswith("cuda")):
                raise LoosespecError(f"vllm-* methods run on cpu or cuda in bfloat16/float32, not {resolved} {dtype}")
            vllm = VllmSettings(target=str(resolve(target).path), draft=str(resolve(draft_spec).path)
                                if draft_spec else None, dtype=_vllm_dtype(dtype),
                                num_speculative_tokens=vllm_num_speculative_tokens, concurrency=vllm_concurrency,
                                max_num_batched_tokens=vllm_max_num_batched_tokens)
        B.run_bench(engine, problems, method_list, out, dataset=dataset, settings=settings, vllm=vllm,
                    encode=lambda p: encode_prompt(engine.tokenizer, p.prompt),
                    scorer=scorer, model_id=target,
                    log=lambda line: tqdm_write(line))
    else:
        print(f"# nothing to do: all {len(problems) * len(method_list)} runs are in {out / R.RESULTS}", file=sys.stderr)
    summary, table = RP.report(out, method_list, config, draw=plots)
    run.release()
    print(f"\n{dataset}: {target} <- {draft_spec}, {precision.name}, {resolved}, {max_new_tokens} new tokens, "
          f"{'greedy' if temperature == 0 else f'temperature {temperature}'}\n")
    print(table)
    print(f"\nsummary: {out / R.SUMMARY}" + (", plots: " + str(out / "*.png") if plots else ""))


def tqdm_write(line: str) -> None:
    from tqdm.auto import tqdm

    tqdm.write(line, file=sys.stderr)


@app.command()
def report(
    out: Path = typer.Argument(..., help="A results directory written by `loosespec bench`."),
    methods: Optional[str] = typer.Option(None, help="Only these methods, in this order (default: all)."),
    plots: bool = typer.Option(True, help="Redraw OUT/*.png."),
    spec_bench: Optional[Path] = typer.Option(None, help="Also write one <method>.jsonl per method here in "
                                              "Spec-Bench's answer-file layout (ar.jsonl is the baseline)."),
    failures: bool = typer.Option(False, "--failures", help="Also print, for scored sets, whether each lossy "
                                  "method keeps >= 99% of ar's accuracy (recovery with a 95% interval from "
                                  "the paired right/wrong table, McNemar's p) and every answer ar got right "
                                  "and a lossy method wrong, classified (repetition loop, truncated at the "
                                  "budget, deferred mismatch, accepted draft step, other), with how often "
                                  "each method's answers open by restating the question."),
    pool: Optional[List[Path]] = typer.Option(None, "--pool", help="With --failures: also read OUT and these "
                                              "results directories (the same set and settings under other "
                                              "--seed values) as one pooled run: the retention verdict gains a "
                                              "pooled line and the lost answers are read across all of them; at "
                                              "T > 0 one seed is one draw. Repeatable."),
):
    """Re-print the table and redraw the plots of a bench directory from its results.jsonl."""
    from loosespec.eval import bench_methods as M
    from loosespec.eval import report as RP
    from loosespec.eval import results as R

    if pool and not failures:
        raise LoosespecError("--pool pools the --failures tables across seeds: give --failures with it")
    method_list = M.parse_methods(methods) if methods else None
    summary, table = RP.report(out, method_list, draw=plots)
    if failures:  # read before anything is printed: a pool that cannot be read fails here
        from loosespec.eval.failures import failure_table, retention_table

        verdicts = retention_table([out] + ([[out, *pool]] if pool else []))
        lost = failure_table([[out, *pool]] if pool else [out])
    if spec_bench is not None:
        written = R.export_spec_bench(R.ResultsFile(out / R.RESULTS).read(), spec_bench)
        print(f"Spec-Bench answer files: {', '.join(str(p) for p in written)}", file=sys.stderr)
    cfg = summary.get("config", {})
    print(f"{cfg.get('dataset', '?')}: {cfg.get('target', '?')} <- {cfg.get('draft')}, {cfg.get('dtype', '?')}, "
          f"{cfg.get('device', '?')}, {cfg.get('max_new_tokens', '?')} new tokens\n")
    print(table)
    if failures:
        print("\nDoes each lossy method keep ar's accuracy?\n\n" + verdicts)
        print("\nAnswers ar got right and a lossy method wrong:\n\n" + lost)


@app.command()
@knob_options(exclude=("max_new_tokens", "stop"))  # requests send max_tokens and stop (OpenAI's fields)
def serve(
    target: str = typer.Option(DEFAULT_TARGET, help="Target model: embedded name, HF id, local dir or .gguf file."),
    draft: str = typer.Option("auto", help=f"Draft model (same forms as --target), or 'none'. 'auto': {DEFAULT_DRAFT} "
                              f"for the default target, none for other targets."),
    revision: Optional[str] = _revision_option(),
    draft_revision: Optional[str] = _draft_revision_option(),
    dtype: str = typer.Option("auto", help=_DTYPE_HELP),
    quantize: str = typer.Option("auto", help=_QUANTIZE_HELP),
    draft_quantize: str = _draft_quantize_option(),
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N | mps"),
    host: str = typer.Option("127.0.0.1", help="Address to bind; the default answers this machine only. "
                             "0.0.0.0 exposes the server to the network (use --api-key)."),
    port: int = typer.Option(8000, help="TCP port."),
    api_key: Optional[str] = typer.Option(None, envvar="LOOSESPEC_API_KEY", help="Require 'Authorization: Bearer KEY' "
                                          "on /v1/* (/health and /metrics stay open). Also read from $LOOSESPEC_API_KEY."),
    max_queue: int = typer.Option(64, help="Requests allowed to wait behind the running one; more get 429."),
    max_tokens_default: int = typer.Option(256, help="max_tokens when a request sends none (capped by the context)."),
    allow_origin: Optional[List[str]] = typer.Option(
        None, "--allow-origin", metavar="ORIGIN", help="Origins (http://localhost:3000) or host names (gpu-box.lan) also accepted, "
        "repeatable or comma-separated; '*' accepts any. By default (a guard against DNS rebinding) requests must be "
        "addressed (Host) to localhost, 127.0.0.1, ::1 or --host with this port, and a browser's Origin must be the "
        "server's own: a web page cannot drive a server on loopback. The Host is not checked on 0.0.0.0 / ::. A "
        "listed origin also gets CORS headers."),
    stall_timeout: float = typer.Option(300.0, help="Seconds a generation may go without progress (a new token) "
                                        "before GET /health answers 503 'stalled'; 0 never does."),
    shutdown_timeout: float = typer.Option(20.0, help="On shutdown (SIGTERM, Ctrl-C), seconds the running and "
                                           "waiting requests get to finish; then they are answered 503 and the "
                                           "process exits."),
    served_model_name: Optional[str] = typer.Option(None, help="Model name clients send and /v1/models lists "
                                                    "(default: --target); the target spec is accepted too."),
    log_level: str = typer.Option("info", help="uvicorn log level: critical | error | warning | info | debug"),
    engine_name: str = typer.Option("transformers", "--engine", help="transformers (this process) | vllm: run "
                                    "`vllm serve` from vLLM's environment (make vllm) with the loosespec plugin; "
                                    "ar, exact or fly (LOSSY) with --drafter model or ngram, server-wide."),
    vllm_bin: str = typer.Option(None, help="--engine vllm: the vllm executable (default: .venv-vllm/bin/vllm or "
                                 "$LOOSESPEC_VLLM_BIN)."),
    **knobs,
):
    """Serve the models over an OpenAI-compatible HTTP API (needs pip install 'loosespec[server]').

    Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (stream: true for
    server-sent events), GET /health, GET /metrics (Prometheus). The decoding options are
    defaults; each request may choose its own method, drafter, num_draft_tokens, seed and fly_* /
    sg_* parameters (same names as here, e.g. openai's extra_body={"method": "fly"}). Methods ar,
    exact and rejection are lossless. fly and specguard are LOSSY: their output differs from the
    target's own, and their responses say "lossy": true in metrics.

    Requests must be addressed to this server (Host: localhost, 127.0.0.1, ::1 or --host) and web
    pages may call it only from origins named by --allow-origin: a guard against DNS rebinding.
    """
    try:
        from loosespec.serve.protocol import ServerSettings
        from loosespec.serve.app import serve as run_server
    except ImportError as e:
        raise LoosespecError(f"the server needs its optional dependencies ({e.name or e}): "
                             "pip install 'loosespec[server]'") from e
    from loosespec.decode.engine import Engine

    if max_queue < 1:
        raise LoosespecError(f"--max-queue must be >= 1, got {max_queue}")
    if max_tokens_default < 1:
        raise LoosespecError(f"--max-tokens-default must be positive, got {max_tokens_default}")
    if not (0 < port < 65536):
        raise LoosespecError(f"--port must be in 1..65535, got {port}")
    if api_key is not None and not api_key.strip():
        raise LoosespecError("--api-key must not be empty")
    import math

    from loosespec.serve.access import parse_allow_origins

    try:
        allow_origins = parse_allow_origins(allow_origin)
    except ValueError as e:
        raise LoosespecError(str(e)) from None
    if not (stall_timeout >= 0 and math.isfinite(stall_timeout)):
        raise LoosespecError(f"--stall-timeout must be >= 0 seconds (0: never stalled), got {stall_timeout}")
    if not (shutdown_timeout >= 0 and math.isfinite(shutdown_timeout)):
        raise LoosespecError(f"--shutdown-timeout must be >= 0 seconds, got {shutdown_timeout}")
    if engine_name == "vllm" and allow_origins:
        raise LoosespecError("--allow-origin is not passed to vLLM (vllm serve checks no Host header): use "
                             "--engine transformers, or vllm's own --allowed-origins")
    draft_spec = resolve_draft(draft, target)
    defaults = knob_values(knobs)
    method = defaults["method"]
    if engine_name == "vllm":
        if revision or draft_revision:
            raise LoosespecError("--revision/--draft-revision are not passed to vLLM: serve a local copy of the "
                                 "revision, or use --engine transformers")
        return _serve_vllm(target, draft_spec, method, defaults.get("drafter"), defaults.get("num_draft_tokens"),
                           dtype, {n: defaults.get(n) for n in VLLM_KNOBS}, host, port, api_key,
                           served_model_name or target, vllm_bin)
    if engine_name != "transformers":
        raise LoosespecError(f"--engine must be transformers or vllm, got {engine_name!r}")
    # fail on bad defaults before loading anything
    cfg = DecodeConfig.create(**defaults, has_draft_model=draft_spec is not None)
    if draft_spec is None and (cfg.drafter in ("model", "mla") or cfg.method == "specguard"):
        raise LoosespecError(f"default method '{cfg.method}' with drafter '{cfg.drafter}' needs a draft model: "
                             "pass --draft")
    engine = Engine.load(target, draft_spec, dtype=dtype, device=device, quantize=quantize,
                         draft_quantize=draft_quantize, torch_draft=cfg.method == "specguard", revision=revision,
                         draft_revision=draft_revision)
    name = served_model_name or target
    settings = ServerSettings(served_model_name=name, aliases=(target,), defaults=defaults, api_key=api_key,
                              max_queue=max_queue, max_tokens_default=max_tokens_default, host=host,
                              allow_origins=allow_origins, stall_timeout_s=stall_timeout,
                              shutdown_timeout_s=shutdown_timeout)
    label = method if cfg.drafter is None else f"{method}-{cfg.drafter}"
    print(f"loosespec: serving {name} (draft: {draft_spec or 'none'}; default method {label}"
          f"{', LOSSY' if cfg.lossy else ''}) on http://{host}:{port}/v1"
          f"{' (API key required)' if api_key else ''}", file=sys.stderr)
    run_server(engine, settings, host=host, port=port, log_level=log_level)


def _vllm_dtype(dtype: str) -> str:
    """vLLM's dtype for ours: vLLM has no int8 path of loosespec's, and its own "auto" would read the
    float32 the embedded models are stored in, so auto means bfloat16 there (what vLLM serves them in)."""
    return "bfloat16" if dtype == "auto" else dtype


def _serve_vllm(target, draft_spec, method, drafter, num_draft_tokens, dtype, fly: dict, host, port, api_key,
                served_model_name, vllm_bin) -> None:
    """Replace this process by ``vllm serve`` with the loosespec plugin configured (the same OpenAI API)."""
    import os

    from loosespec.models import resolve
    from loosespec.eval.peers.vllm import DEFAULT_VLLM, VllmSettings, method_for, server_command

    if drafter is None and method != "ar":  # vLLM's proposers: a draft model, else prompt lookup (no MLA)
        drafter = "model" if draft_spec is not None else "ngram"
    cfg = DecodeConfig.create(method, drafter, num_draft_tokens, has_draft_model=draft_spec is not None, **fly)
    vm = method_for(cfg.method, cfg.drafter)
    if vm in ("vllm-draft", "vllm-fly") and draft_spec is None:
        raise LoosespecError(f"method {cfg.method} with drafter model needs a draft model: pass --draft")
    exe = vllm_bin or DEFAULT_VLLM
    if not os.path.exists(exe):
        raise LoosespecError(f"vLLM not found at {exe}: run `make vllm` or pass --vllm-bin")
    settings = VllmSettings(target=str(resolve(target).path), draft=str(resolve(draft_spec).path) if vm in (
        "vllm-draft", "vllm-fly") else None, dtype=_vllm_dtype(dtype), num_speculative_tokens=num_draft_tokens,  # None: k's default
        vllm_bin=exe, fly=fly)
    argv, env = server_command(vm, settings, port, host=host, served_model_name=served_model_name, api_key=api_key)
    print(f"loosespec: {vm}{' (LOSSY)' if cfg.lossy else ''} via {' '.join(argv[:3])} ...", file=sys.stderr)
    os.execve(argv[0], argv, {**os.environ, **env})


@models_app.callback()
def models_list(ctx: typer.Context):
    """List the embedded models with their state (missing / downloaded / ready), size and path."""
    if ctx.invoked_subcommand is not None:
        return
    from loosespec.models import cache_root, list_models

    print(f"cache: {cache_root()}  (set LOOSESPEC_CACHE to move it)")
    print(f"{'name':30} {'state':11} {'size':>9}  path")
    for m in list_models():
        size = f"{m.size_bytes / 1e9:.2f} GB" if m.size_bytes else "-"
        print(f"{m.name:30} {m.state:11} {size:>9}  {m.path}")


@models_app.command("pull")
def models_pull(name: str = typer.Argument(..., help=f"One of: {', '.join(EMBEDDED)}, or 'all'.")):
    """Download, verify (sha256) and convert an embedded model once, with a progress bar."""
    from loosespec.models import pull

    for n in (list(EMBEDDED) if name == "all" else [name]):
        print(pull(n, progress=True))


@models_app.command("cost")
def models_cost(
    name: str = typer.Argument(..., help="Model: embedded name, HF id, local dir or .gguf file."),
    max_n: int = typer.Option(16, help="Measure forwards over 1..MAX_N new tokens (K + 1 for a draft length K)."),
    dtype: str = typer.Option("auto", help=_DTYPE_HELP),
    quantize: str = typer.Option("auto", help=_QUANTIZE_HELP),
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N | mps"),
    refresh: bool = typer.Option(False, "--refresh", help="Measure again even if this machine's curve is cached."),
    json_out: bool = typer.Option(False, "--json", help="Print the curve as JSON."),
):
    """Cost of one forward over n new tokens, c(n), as the cost-aware draft length uses it.

    Measured once per model, precision, device and CPU (a few seconds, after 128 cached tokens)
    and cached in $LOOSESPEC_CACHE/costs. Speculation pays where c(k+1)/c(1) stays small.
    """
    from loosespec.cost import cost_curve, format_curve
    from loosespec.decode.gguf import GgufLM, is_gguf
    from loosespec.decode.kv import CachedLM
    from loosespec.models import load

    if max_n < 1:
        raise LoosespecError(f"--max-n must be >= 1, got {max_n}")
    loaded = load(name, dtype, device, progress=not json_out, quantize=quantize)
    lm = GgufLM(loaded.model) if is_gguf(loaded.model) else CachedLM(loaded.model)
    curve = cost_curve(loaded, lm, max_n, refresh=refresh,
                       progress=None if json_out else (lambda m: print(m, file=sys.stderr)))
    if json_out:
        print(json.dumps(curve.to_dict()))
        return
    meta = curve.meta
    print(f"{name}: {meta.get('precision')} on {meta.get('device')} ({meta.get('cpu')}; "
          f"{' '.join(meta.get('cpu_flags', [])) or 'no flags of note'}; {meta.get('threads')} threads), "
          f"measured {meta.get('measured', '?')}, after {meta.get('context', '?')} cached tokens")
    print(format_curve(curve, [n for n in curve.ns if n <= max_n]))


def main() -> None:
    try:
        app()
    except ConfigError as e:  # a knob's bad value, named as the user typed it (--num-draft-tokens)
        print(f"loosespec: error: {e.render('cli')}", file=sys.stderr)
        sys.exit(2)
    except LoosespecError as e:
        print(f"loosespec: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("loosespec: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
