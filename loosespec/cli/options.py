"""Options that several commands share, derived from their one declaration: the decoding knobs
(:mod:`loosespec.config`, :func:`knob_options`) and the model-loading options (:mod:`loosespec.loading`,
:func:`load_options`); and the helpers the commands share."""

from __future__ import annotations

import inspect
import logging
import sys
import typing
from typing import Optional

import typer

from loosespec.config import KNOBS, knob_default, knob_help, knob_info, knob_type
from loosespec.errors import LoosespecError
from loosespec.loading import LOAD_OPTIONS, LoadConfig, load_option_info

log = logging.getLogger(__name__)

ALLOW_CODE_HELP = (
    "Run model-written code to score humaneval and mbpp-train (pass@1), in loosespec's sandbox "
    "(also: LOOSESPEC_ALLOW_CODE_EXECUTION=1). Without it those sets are refused."
)
SANDBOX_HELP = (
    "auto | full | net | none: the sandbox that model-written code runs in (also: LOOSESPEC_SANDBOX). "
    "auto: the best this machine gives, and never none (no isolation), which must be named; see "
    "docs/bench.md, 'Evaluation', for what each mode protects."
)
DATA_DIR_HELP = (
    "Folder with evaluation set .jsonl files to use instead of the copies shipped with loosespec "
    "(a file missing there comes from $LOOSESPEC_DATA, then the shipped copy); 'hub': the standard "
    "Hugging Face Hub datasets (pip install 'loosespec[hub]')."
)


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
            extra.append(
                inspect.Parameter(
                    n,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=option,
                    annotation=Optional[kind] if option.default is None else kind,
                )
            )

        def command(**kw):
            return fn(**kw)

        command.__name__, command.__qualname__, command.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        command.__module__ = fn.__module__
        command.__signature__ = sig.replace(parameters=own + extra)
        return command

    return deco


def knob_values(knobs: dict) -> dict:
    """Option values -> DecodeConfig keywords: escapes interpreted, stop strings as a tuple, unset auto knobs
    left out (DecodeConfig fills them: the method from the temperature, the drafter from the models loaded)."""
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


def _unescape(text: str) -> str:
    """``\\n`` typed on a command line -> a newline (and the other Python string escapes)."""
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError as e:
        raise LoosespecError(f"bad escape in {text!r}: {e.reason}") from e


# ---------------------------------------------------------------------------------------------
# Model-loading options: derived from their one declaration (loosespec.loading)
# ---------------------------------------------------------------------------------------------


def load_options(
    *names: str, exclude: tuple[str, ...] = (), defaults: Optional[dict] = None, helps: Optional[dict] = None
):
    """Add the model-loading options (every field of :class:`~loosespec.loading.LoadConfig`, or ``names``) to a
    command, declared from their one declaration, where the command has a parameter ``load`` (in that order in
    --help); the command receives them as one ``LoadConfig`` in ``load``. Adding a field to ``LoadConfig`` adds it
    to every command that takes all of them (all but ``exclude``). ``defaults``/``helps``: a command's own default or
    help text for an option (calibrate's --draft)."""
    chosen = [n for n in (names or LOAD_OPTIONS) if n not in exclude]
    defaults, helps = defaults or {}, helps or {}
    unknown = sorted(set(chosen) - set(LOAD_OPTIONS))
    if unknown:
        raise TypeError(f"not loading options: {', '.join(unknown)}")
    hints = typing.get_type_hints(LoadConfig)

    def deco(fn):
        sig = inspect.signature(fn, eval_str=True)
        params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        at = [p.name for p in params].index("load")
        options = []
        for n in chosen:
            info = load_option_info(n)
            default = defaults.get(n, LOAD_OPTIONS[n].default)
            decls = [info.flag] if info.flag else []
            options.append(
                inspect.Parameter(
                    n,
                    params[at].kind,
                    annotation=hints[n],
                    default=typer.Option(default, *decls, help=helps.get(n, info.help), **info.bounds),
                )
            )

        def command(**kw):
            return fn(load=LoadConfig(**{n: kw.pop(n) for n in chosen}), **kw)

        command.__name__, command.__qualname__, command.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        command.__module__ = fn.__module__
        command.__signature__ = sig.replace(parameters=params[:at] + options + params[at + 1 :])
        return command

    return deco


# ---------------------------------------------------------------------------------------------
# vLLM's spelling: --speculative-config JSON (loosespec.speculative_config)
# ---------------------------------------------------------------------------------------------


def speculative_config_option():
    """``--speculative-config JSON``: vLLM's option, with the keys loosespec has (:mod:`loosespec.speculative_config`)."""
    from loosespec.speculative_config import HELP

    return typer.Option(None, "--speculative-config", metavar="JSON", help=HELP)


def given_options(ctx: typer.Context, names) -> set[str]:
    """Which of these options the user gave (command line or environment), not left at their defaults. ``ctx``:
    the command's context (a ``typer.Context`` parameter; typer passes it)."""
    sources = {n: ctx.get_parameter_source(n) for n in names}
    return {n for n, src in sources.items() if src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP")}


def apply_speculative_config(ctx: typer.Context, text: str, knobs: dict, load: LoadConfig) -> tuple[dict, LoadConfig]:
    """``--speculative-config`` merged into the knob options (:func:`knob_values`' keywords) and the loading options
    (its ``model`` is ``--draft``): an option the user also gave with another value is an error naming both."""
    from loosespec.speculative_config import from_vllm, merge, merge_draft

    spec = from_vllm(text)
    knobs = merge(spec, knobs, given_options(ctx, KNOBS) & set(knobs))
    draft = merge_draft(spec, load.draft, bool(given_options(ctx, ["draft"])))
    return knobs, (load if draft == load.draft else load.replace(draft=draft))


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------


def csv_numbers(text: Optional[str], kind: type, flag: str) -> Optional[tuple]:
    if text is None:
        return None
    try:
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise LoosespecError(f"{flag} takes comma-separated numbers, got '{text}'") from None


def tqdm_write(line: str) -> None:
    """A progress line of a run (bench, calibrate) on stderr, between tqdm's bars; an INFO record: --quiet drops it."""
    if not log.isEnabledFor(logging.INFO):
        return
    from tqdm.auto import tqdm

    tqdm.write(line, file=sys.stderr)
