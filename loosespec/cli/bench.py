"""``loosespec bench`` (methods side by side, resumable) and ``loosespec report`` (its tables and plots again)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List, Optional

import typer

from loosespec.cli.options import (
    ALLOW_CODE_HELP,
    DATA_DIR_HELP,
    SANDBOX_HELP,
    apply_speculative_config,
    csv_numbers,
    knob_options,
    load_options,
    speculative_config_option,
    tqdm_write,
)
from loosespec.cli.root import app
from loosespec.errors import LoosespecError
from loosespec.loading import LoadConfig

log = logging.getLogger(__name__)

BENCH_DEFAULT_METHODS = ("ar", "exact-ngram", "exact-mla", "fly-ngram", "fly-mla", "hf-pld", "hf-assist")
BENCH_KNOBS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "sg_tau", "adaptive_draft_length")


@app.command()
@knob_options(*BENCH_KNOBS, defaults={"sg_tau": None})  # no tau: the library's, kept out of the run's config
@load_options()
def bench(
    ctx: typer.Context,
    dataset: str = typer.Option(..., help="gsm8k | mgsm | math500 | humaneval | specbench | mtbench | niah"),
    out: Path = typer.Option(..., help="Results directory (results.jsonl, summary.json, plots); rerun to resume."),
    limit: Optional[int] = typer.Option(
        None, help="First N problems (per language for mgsm, per category for specbench)."
    ),
    methods: str = typer.Option(
        ",".join(BENCH_DEFAULT_METHODS),
        help="Comma list of <method>-<drafter> (ar, exact-ngram, exact-model, exact-mla, "
        "rejection-*, fly-ngram, fly-mla [LOSSY], specguard, specguard-regenerate, "
        "specguard-fly [LOSSY]), the transformers peers hf-ar, hf-pld, hf-assist, "
        "llama.cpp (make peers) llamacpp-ar, llamacpp-pld, llamacpp-spec (its server's "
        "speculative decoding with the draft model), and vLLM (make vllm) vllm-ar, "
        "vllm-ngram, vllm-draft, vllm-fly, vllm-fly-ngram [LOSSY]. ar is always run: it is the baseline (vllm-ar for "
        "the vllm-* methods when listed). A loosespec method with knobs set is "
        "<method>@<knob>=<value>, e.g. fly-ngram@fly_entropy_threshold=0.6.",
    ),
    load: LoadConfig = None,  # --target, --draft, --dtype, ..., --max-cache-len (loosespec.loading)
    lang: Optional[str] = typer.Option(None, help="mgsm: language code(s), comma-separated (e.g. en,de)."),
    category: Optional[str] = typer.Option(
        None,
        help="specbench: one task type (mt_bench, translation, "
        "summarization, qa, math_reasoning, rag); default all six.",
    ),
    context_lengths: Optional[str] = typer.Option(None, help="niah: context lengths in target tokens, e.g. 1024,2048."),
    depths: Optional[str] = typer.Option(None, help="niah: needle depths in [0, 1], e.g. 0,0.5,1."),
    data_dir: Optional[str] = typer.Option(None, help=DATA_DIR_HELP),
    sweep: Optional[str] = typer.Option(
        None,
        help="<knob>=<v1>,<v2>,...: run each loosespec method but ar once per "
        "value (as <method>@<knob>=<value>, a name --methods also takes) and plot "
        "speedup (and accuracy) against the knob, e.g. num_draft_tokens=5,10,15 "
        "or fly_entropy_threshold=0.1,0.3,0.6.",
    ),
    plots: bool = typer.Option(True, help="Draw DIR/*.png at the end."),
    vllm_num_speculative_tokens: Optional[int] = typer.Option(
        None,
        help="vllm-* methods: speculative_config's num_speculative_tokens (default: 5; FLy's K, 15, for "
        "vllm-fly*: FLy defers a mismatch only if its window fits in the draft).",
    ),
    vllm_concurrency: int = typer.Option(
        1,
        help="vllm-* methods: requests in flight (1: batch of one; N: blocks "
        "of N concurrent requests, throughput in the summary).",
    ),
    vllm_max_num_batched_tokens: Optional[int] = typer.Option(
        None,
        help="vllm-* methods: vLLM's --max-num-batched-tokens (default: vLLM's). vLLM profiles a forward of "
        "this many tokens at every start: small values start much faster on a CPU.",
    ),
    allow_code_execution: bool = typer.Option(False, "--allow-code-execution", help=ALLOW_CODE_HELP),
    sandbox: Optional[str] = typer.Option(None, help=SANDBOX_HELP),
    speculative_config: Optional[str] = speculative_config_option(),
    reproduce_ar: int = typer.Option(
        0,
        "--reproduce-ar",
        metavar="N",
        help="Run ar again on the first N problems whose ar row comes from an earlier sitting (process start), "
        "into OUT/reruns.jsonl: checks ar's outputs reproduce token for token across sittings (the report's "
        "ar_reproduced). ar also runs again, unasked, where a problem's other methods run in a later sitting than "
        "its ar row: speedups pair rows timed in one sitting only.",
    ),
    **knobs,
):
    """Benchmark methods side by side: speedup over ar and accuracy retention, resumable.

    Appends one line per (prompt, method) to OUT/results.jsonl as it finishes; rerunning the same
    command skips finished pairs. fly-* and specguard* are LOSSY: their accuracy is measured
    against ar on the same prompts (recovery, paired counts, identical outputs).
    """
    from loosespec.cli.serve import vllm_dtype
    from loosespec.eval import bench_methods as M
    from loosespec.eval import datasets as D
    from loosespec.eval import harness as B
    from loosespec.eval import report as RP
    from loosespec.eval import results as R
    from loosespec.extras import BENCH, require

    require(BENCH, "loosespec bench")  # its plots, statistics and scoring: before anything is loaded or run
    target, dtype = load.target, load.dtype
    max_new_tokens, temperature, top_p, top_k, seed, sg_tau, adaptive_draft_length = (knobs[n] for n in BENCH_KNOBS)
    if limit is not None and limit < 1:
        raise LoosespecError(f"--limit must be a positive integer, got {limit}")
    if max_new_tokens < 1:
        raise LoosespecError(f"--max-new-tokens must be positive, got {max_new_tokens}")
    if reproduce_ar < 0:
        raise LoosespecError(f"--reproduce-ar must be 0 or more, got {reproduce_ar}")
    method_list = M.parse_methods(methods)
    if speculative_config is not None:  # vLLM's spelling: one more loosespec method, named as --methods names it
        name, load = _speculative_method(ctx, speculative_config, load, temperature)
        method_list += [] if name in method_list else [name]
    sandbox_mode = D.check_code_execution([dataset], allow_code_execution, sandbox)  # before anything loads
    if sandbox_mode is not None:
        log.info(f"# model-written code is scored in the sandbox, mode {sandbox_mode}")
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
    draft_spec = load.draft_model
    missing = [m for m in method_list if M.needs_draft_model(m)]
    from loosespec.eval.peers.vllm import is_vllm_method, needs_draft

    vllm_draft = [m for m in method_list if is_vllm_method(m) and needs_draft(m)]
    if (missing or vllm_draft) and draft_spec is None:
        raise LoosespecError(f"method(s) {', '.join(missing + vllm_draft)} need a draft model: pass --draft")
    from loosespec.models import check_revision

    check_revision(target, load.revision)  # Hub ids only; before anything is loaded
    if draft_spec is not None:
        check_revision(draft_spec, load.draft_revision, "--draft-revision")
    if (load.revision or load.draft_revision) and any(m.startswith("vllm-") for m in method_list):
        raise LoosespecError(
            "--revision/--draft-revision are not passed to vLLM: run the vllm-* methods in a bench "
            "of their own without them, or on a local copy of the revision"
        )
    # the config names the draft whether or not these methods load it, so that a later run adding
    # draft-model methods to the same directory matches
    load_draft = draft_spec if missing else None
    settings = {
        "adaptive_draft_length": adaptive_draft_length,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "seed": seed,
        "sg_tau": sg_tau,
    }
    for m in method_list:  # fail on bad settings before loading anything
        M.method_config(
            m,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            top_p=top_p,
            top_k=top_k,
            has_draft=load_draft is not None,
            sg_tau=sg_tau,
        )
    options = {
        k: v
        for k, v in {
            "lang": lang,
            "category": category,
            "context_lengths": csv_numbers(context_lengths, int, "--context-lengths"),
            "depths": csv_numbers(depths, float, "--depths"),
        }.items()
        if v is not None
    }
    problems = D.load_dataset(dataset, limit, data_dir, **options)  # validates name and options early
    from loosespec.models import pick_device

    resolved = str(pick_device(load.device))
    from loosespec.decode.engine import draft_quantize_for, draft_role, target_role
    from loosespec.hardware import resolve_precision
    from loosespec.models import has_gguf

    # SpecGuard reads the draft's attentions and hf-assist runs it in transformers: no llama.cpp draft for them;
    # SpecGuard and transformers' generate peers (hf-*) need the target in transformers too
    torch_draft = any(M.bench_method(m).torch_draft for m in method_list)
    torch_target = torch_draft or any(M.bench_method(m).kind == "hf" for m in method_list)

    precision = resolve_precision(
        dtype, load.quantize, pick_device(load.device), gguf=has_gguf(target), role=target_role(torch_target)
    )
    draft_precision = (
        None
        if draft_spec is None
        else resolve_precision(
            dtype,
            draft_quantize_for(load.quantize, load.draft_quantize),
            pick_device(load.device),
            gguf=has_gguf(draft_spec),
            role=draft_role(torch_draft),
        ).name
    )
    config = R.run_config(
        target=target,
        draft=draft_spec,
        dtype=precision.name,
        device=resolved,
        dataset=dataset,
        draft_dtype=draft_precision,
        adaptive_draft_length=adaptive_draft_length,
        options={k: list(v) if isinstance(v, tuple) else v for k, v in options.items()},
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        sg_tau=sg_tau,
        scorer=D.SCORERS_DOC.get(dataset, "none"),
    )
    if vllm_concurrency > 1:  # a different measurement: it gets its own directory
        config["vllm_concurrency"] = vllm_concurrency
    if "int4" in (precision.name, draft_precision):  # llama.cpp's settings decide int4's rounding and speed
        from loosespec.decode import gguf

        config["llamacpp_forward"] = gguf.settings()
    # the Hub revisions asked for, recorded when given (the runs before them stay resumable): a folder resumed with
    # another revision is refused like any other setting; the commit each resolved to is in the run's provenance
    if load.revision is not None:
        config["target_revision"] = load.revision
    if load.draft_revision is not None and draft_spec is not None:
        config["draft_revision"] = load.draft_revision
    from loosespec.decode.engine import check_cache_options

    check_cache_options(load.cache_implementation, load.compile)
    if load.cache_implementation != "dynamic":  # recorded when not the default: the runs before it stay resumable
        if any(M.bench_method(m).step_level for m in method_list):
            raise LoosespecError("specguard methods need --cache-implementation dynamic")
        config.update(cache_implementation=load.cache_implementation, compile=load.compile)
    out.mkdir(parents=True, exist_ok=True)
    # the folder's lock for the whole run (one line naming the holder's pid if another run holds it), the config
    # checked and this run's provenance recorded in config.json, a torn last line repaired
    run = R.open_run(out, config, data_dir=data_dir, sandbox=sandbox_mode)
    scorer = lambda p, text: D.judge(dataset, p, text, **score_options)  # noqa: E731
    # rows whose scoring failed (no answer) are scored again from their stored outputs
    rows = B.rescore_errors(out, problems, method_list, scorer=scorer, log=tqdm_write)
    done = {(r["question_id"], r["method"]) for r in rows}
    again = B.ar_reruns(problems, B.pending_pairs(problems, method_list, done), rows, R.read_reruns(out), reproduce_ar)
    if B.pending_pairs(problems, method_list, done) or again:
        from loosespec.decode.engine import Engine
        from loosespec.decode.text import encode_prompt

        engine = Engine.load_from(
            load.replace(draft=load_draft, device=resolved), torch_draft=torch_draft, torch_target=torch_target
        )
        if dataset == "niah":  # sized in the target's tokens
            problems = D.load_dataset(
                dataset, limit, data_dir, **options, count_tokens=lambda t: len(engine.tokenizer(t).input_ids)
            )
        todo = B.pending_pairs(problems, method_list, done)
        log.info(
            f"# {len(problems)} problems x {len(method_list)} methods: {len(todo)} runs to do, "
            f"{len(done)} already in {out / R.RESULTS}"
            + (f"; ar again on {len(again)} (into {R.RERUNS})" if again else "")
        )
        vllm = None
        if any(m.startswith("vllm-") for m in method_list):
            from loosespec.eval.peers.vllm import VllmSettings
            from loosespec.models import resolve

            if precision.name not in ("bfloat16", "float32", "int8") or (
                resolved != "cpu" and not resolved.startswith("cuda")
            ):
                raise LoosespecError(f"vllm-* methods run on cpu or cuda in bfloat16/float32, not {resolved} {dtype}")
            vllm = VllmSettings(
                target=str(resolve(target).path),
                draft=str(resolve(draft_spec).path) if draft_spec else None,
                dtype=vllm_dtype(dtype),
                num_speculative_tokens=vllm_num_speculative_tokens,
                concurrency=vllm_concurrency,
                max_num_batched_tokens=vllm_max_num_batched_tokens,
            )
        B.run_bench(
            engine,
            problems,
            method_list,
            out,
            dataset=dataset,
            settings=settings,
            vllm=vllm,
            encode=lambda p: encode_prompt(engine.tokenizer, p.prompt),
            scorer=scorer,
            model_id=target,
            log=lambda line: tqdm_write(line),
            reproduce_ar=reproduce_ar,
        )
    else:
        log.info(f"# nothing to do: all {len(problems) * len(method_list)} runs are in {out / R.RESULTS}")
    summary, table = RP.report(out, method_list, config, draw=plots)
    run.release()
    print(
        f"\n{dataset}: {target} <- {draft_spec}, {precision.name}, {resolved}, {max_new_tokens} new tokens, "
        f"{'greedy' if temperature == 0 else f'temperature {temperature}'}\n"
    )
    print(table)
    print(f"\nsummary: {out / R.SUMMARY}" + (", plots: " + str(out / "*.png") if plots else ""))


def _speculative_method(ctx: typer.Context, text: str, load: LoadConfig, temperature: float) -> tuple[str, LoadConfig]:
    """``--speculative-config`` as a bench method, ``<method>-<drafter>@<knob>=<value>...`` (its ``model`` is
    ``--draft``); the method and drafter it leaves out are the ones ``generate`` would choose."""
    from loosespec.config import DecodeConfig
    from loosespec.eval.bench_methods import VARIANT_SEP, bench_method

    kw, load = apply_speculative_config(ctx, text, {}, load)
    cfg = DecodeConfig.create(**kw, temperature=temperature, has_draft_model=load.draft_model is not None)
    variants = "".join(f"{VARIANT_SEP}{k}={v}" for k, v in kw.items() if k not in ("method", "drafter"))
    return bench_method(f"{cfg.method}-{cfg.drafter}{variants}").name, load


@app.command()
def report(
    out: Path = typer.Argument(..., help="A results directory written by `loosespec bench`."),
    methods: Optional[str] = typer.Option(None, help="Only these methods, in this order (default: all)."),
    plots: bool = typer.Option(True, help="Redraw OUT/*.png."),
    spec_bench: Optional[Path] = typer.Option(
        None,
        help="Also write one <method>.jsonl per method here in "
        "Spec-Bench's answer-file layout (ar.jsonl is the baseline).",
    ),
    failures: bool = typer.Option(
        False,
        "--failures",
        help="Also print, for scored sets, whether each lossy "
        "method keeps >= 99% of ar's accuracy (recovery with a 95% interval from "
        "the paired right/wrong table, McNemar's p) and every answer ar got right "
        "and a lossy method wrong, classified (repetition loop, truncated at the "
        "budget, deferred mismatch, accepted draft step, other), with how often "
        "each method's answers open by restating the question.",
    ),
    pool: Optional[List[Path]] = typer.Option(
        None,
        "--pool",
        help="With --failures: also read OUT and these "
        "results directories (the same set and settings under other "
        "--seed values) as one pooled run: the retention verdict gains a "
        "pooled line and the lost answers are read across all of them; at "
        "T > 0 one seed is one draw. Repeatable.",
    ),
):
    """Re-print the table and redraw the plots of a bench directory from its results.jsonl."""
    from loosespec.eval import bench_methods as M
    from loosespec.eval import report as RP
    from loosespec.eval import results as R
    from loosespec.extras import BENCH, require

    require(BENCH, "loosespec bench report")

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
        log.info(f"Spec-Bench answer files: {', '.join(str(p) for p in written)}")
    cfg = summary.get("config", {})
    print(
        f"{cfg.get('dataset', '?')}: {cfg.get('target', '?')} <- {cfg.get('draft')}, {cfg.get('dtype', '?')}, "
        f"{cfg.get('device', '?')}, {cfg.get('max_new_tokens', '?')} new tokens\n"
    )
    print(table)
    if failures:
        print("\nDoes each lossy method keep ar's accuracy?\n\n" + verdicts)
        print("\nAnswers ar got right and a lossy method wrong:\n\n" + lost)
