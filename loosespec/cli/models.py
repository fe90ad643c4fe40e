"""``loosespec models``: the embedded models listed, prepared (``pull``), removed (``rm``), and a model's forward cost
(``cost``)."""

from __future__ import annotations

import json
import logging

import typer

from loosespec.cli.options import load_options
from loosespec.cli.root import models_app
from loosespec.errors import LoosespecError
from loosespec.loading import LoadConfig
from loosespec.models import EMBEDDED

log = logging.getLogger(__name__)


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

    for n in list(EMBEDDED) if name == "all" else [name]:
        print(pull(n, progress=True))


@models_app.command("rm")
def models_rm(name: str = typer.Argument(..., help=f"One of: {', '.join(EMBEDDED)}.")):
    """Remove a prepared embedded model from the cache (its GGUF, its safetensors conversion, its cached int8
    weights), saying how many bytes that freed; `loosespec models pull` prepares it again."""
    from loosespec.models import remove

    freed = remove(name)
    if freed:
        print(f"removed {name}: {freed / 1e9:.2f} GB freed ({freed} bytes)")
    else:
        print(f"{name} is not prepared: nothing to remove (0 bytes freed)")


@models_app.command("cost")
@load_options("dtype", "quantize", "device")
def models_cost(
    name: str = typer.Argument(..., help="Model: embedded name, HF id, local dir or .gguf file."),
    max_n: int = typer.Option(16, help="Measure forwards over 1..MAX_N new tokens (K + 1 for a draft length K)."),
    load: LoadConfig = None,  # --dtype, --quantize, --device (loosespec.loading)
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
    from loosespec.models import load as load_model

    if max_n < 1:
        raise LoosespecError(f"--max-n must be >= 1, got {max_n}")
    loaded = load_model(name, load.dtype, load.device, progress=not json_out, quantize=load.quantize)
    lm = GgufLM(loaded.model) if is_gguf(loaded.model) else CachedLM(loaded.model)
    curve = cost_curve(loaded, lm, max_n, refresh=refresh, progress=None if json_out else log.info)
    if json_out:
        print(json.dumps(curve.to_dict()))
        return
    meta = curve.meta
    print(
        f"{name}: {meta.get('precision')} on {meta.get('device')} ({meta.get('cpu')}; "
        f"{' '.join(meta.get('cpu_flags', [])) or 'no flags of note'}; {meta.get('threads')} threads), "
        f"measured {meta.get('measured', '?')}, after {meta.get('context', '?')} cached tokens"
    )
    print(format_curve(curve, [n for n in curve.ns if n <= max_n]))
