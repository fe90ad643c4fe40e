"""What one forward costs on this machine, per precision, against what the memory allows (issue 42).

For the target and the draft of the default pair, in each precision given (``int8``: torch's fbgemm kernels on
int8 weights; ``w4a16``: torch's packed int4 kernel on 4-bit weights with bfloat16 activations; ``int4``: llama.cpp
on the GGUF's own 4-bit weights), writes

- the cost curve c(n), n = 1..16 new tokens after 128 cached ones, and c(n)/c(1);
- the prefill of a PREFILL-token prompt (what every method pays once per prompt, before decoding);
- the bytes of weights one token reads (:func:`loosespec.cost.weight_bytes`) and the floor they set,
  bytes / read bandwidth, next to c(1);
- batch invariance: a 16-row verify forward's logits against 16 one-token forwards over the same positions,
  row by row (bit-equal rows, largest difference, same argmax), which decides whether ``exact`` can equal ``ar``
  in that precision (docs/cpu-precision.md);

and the machine's memory bandwidth (streaming copy and read, torch's threads), with the CPU model and flags.

    .venv/bin/python benchmarks/forward_cost.py --precisions int8,int4 --out results/forward

Writes ``<out>/<date>-<cpu>.json`` and ``.md``. Time it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loosespec.cost import format_curve, measure, weight_bytes  # noqa: E402
from loosespec.decode.gguf import N_BATCH, PREFILL_REPACK, ROW_CHUNK, GgufLM, is_gguf  # noqa: E402
from loosespec.decode.kv import CachedLM  # noqa: E402
from loosespec.fileio import atomic_write_text  # noqa: E402
from loosespec.hardware import cpu_info, describe_device, memory_bandwidth  # noqa: E402
from loosespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load  # noqa: E402

CONTEXT = 128
ROWS = 16
PREFILL = 512


def prefill_seconds(lm, vocab: int, n: int = PREFILL, repeats: int = 2) -> float:
    """The least of ``repeats`` forwards over an ``n``-token prompt from an empty cache."""
    seq = torch.randint(100, vocab, (n,), generator=torch.Generator().manual_seed(2))
    best = float("inf")
    for _ in range(repeats):
        lm.reset()
        t = time.perf_counter()
        lm.logits(seq, rows=1)
        best = min(best, time.perf_counter() - t)
    lm.reset()
    return best


def batch_invariance(lm, vocab: int, context: int = CONTEXT) -> dict:
    """A ROWS-row forward against ROWS one-token forwards over the same positions, after ``context`` cached ones
    (prefilled as every method prefills a prompt)."""
    gen = torch.Generator().manual_seed(1)
    seq = torch.randint(100, vocab, (context + ROWS,), generator=gen)
    lm.reset()
    lm.prefill(seq[:context])
    batched = lm.logits(seq, rows=ROWS).clone()
    single = []
    for i in range(ROWS):
        single.append(lm.logits(seq[: context + i + 1], rows=1)[0].clone())
    single = torch.stack(single)
    lm.reset()
    equal = [bool(torch.equal(batched[i], single[i])) for i in range(ROWS)]
    return {
        "rows": ROWS,
        "context": context,
        "bit_equal_rows": sum(equal),
        "max_abs_diff": float((batched - single).abs().max()),
        "same_argmax_rows": int((batched.argmax(-1) == single.argmax(-1)).sum()),
    }


def one(spec: str, precision: str, read_bw: float) -> dict:
    t0 = time.perf_counter()
    loaded = load(spec, quantize=precision, progress=False)
    lm = GgufLM(loaded.model) if is_gguf(loaded.model) else CachedLM(loaded.model)
    load_s = time.perf_counter() - t0
    vocab = int(loaded.model.config.vocab_size)
    curve = measure(lm, ROWS, context=CONTEXT, vocab=vocab)
    inv = batch_invariance(lm, vocab)
    prefill = prefill_seconds(lm, vocab)
    nbytes = weight_bytes(loaded.model)
    floor = nbytes / (read_bw * 1e9)
    row = {
        "model": spec,
        "precision": loaded.precision.name,
        "load_s": round(load_s, 2),
        "curve": curve.to_dict(),
        "c1_ms": round(1000 * curve(1), 1),
        "ratios": {str(n): round(curve.ratio(n), 3) for n in range(1, ROWS + 1)},
        "weight_bytes": nbytes,
        "floor_ms": round(1000 * floor, 1),
        "c1_over_floor": round(curve(1) / floor, 2),
        "batch_invariance": inv,
        "prefill": {"tokens": PREFILL, "seconds": round(prefill, 3)},
    }
    print(
        f"{spec} {row['precision']}: c(1) {row['c1_ms']} ms (floor {row['floor_ms']} ms from "
        f"{nbytes / 1e9:.2f} GB), c(16)/c(1) {curve.ratio(16):.2f}; 16-row forward: "
        f"{inv['bit_equal_rows']}/{ROWS} rows bit-equal to 1-token forwards",
        file=sys.stderr,
    )
    print(format_curve(curve, [1, 2, 4, 8, 16]), file=sys.stderr)
    return row


LONG_CONTEXT = 700  # past 512 cached positions, where flash attention splits a single query's keys (f16/f32 cache)
# (repack, flash attention, KV cache type, positions per forward that asks for logits, the prefill's weight layout
# (None: the decoding context's own)): llama.cpp's defaults, then loosespec's setting (the last row) with one of its
# parts switched back at a time, and the setting before this one (weights as the GGUF stores them, rows in pieces of 7)
VARIANTS = [
    (True, -1, "f16", N_BATCH, None),
    (False, 1, "bf16", N_BATCH, None),
    (True, 1, "bf16", 4, PREFILL_REPACK),
    (True, 0, "f16", ROW_CHUNK, PREFILL_REPACK),
    (True, 1, "f16", ROW_CHUNK, PREFILL_REPACK),
    (False, 1, "bf16", 7, None),
    (True, 1, "bf16", ROW_CHUNK, PREFILL_REPACK),
]


def llamacpp_variants(spec: str) -> list[dict]:
    """The target in int4 under llama.cpp's settings that decide batch invariance: which is batch-invariant, at what
    cost?"""
    loaded = load(spec, quantize="int4", progress=False)
    vocab = int(loaded.model.config.vocab_size)
    out = []
    for repack, fa, cache, chunk, prefill_repack in VARIANTS:
        lm = GgufLM(
            loaded.model, repack=repack, flash_attn=fa, cache_type=cache, row_chunk=chunk, prefill_repack=prefill_repack
        )
        curve = measure(lm, ROWS, context=CONTEXT, vocab=vocab, repeats=3)
        out.append(
            {
                "model": spec,
                **lm.settings,
                "c1_ms": round(1000 * curve(1), 1),
                "c2_over_c1": round(curve.ratio(2), 2),
                "c4_over_c1": round(curve.ratio(4), 2),
                "c16_over_c1": round(curve.ratio(16), 2),
                "prefill": {"tokens": PREFILL, "seconds": round(prefill_seconds(lm, vocab), 3)},
                "batch_invariance": batch_invariance(lm, vocab),
                "batch_invariance_long": batch_invariance(lm, vocab, LONG_CONTEXT),
            }
        )
        print(f"  int4 {lm.settings}: {out[-1]}", file=sys.stderr)
        del lm
    return out


def render(data: dict) -> str:
    m = data["machine"]
    prefill = all("prefill" in r for r in data["rows"])  # runs before the prefill was timed lack it
    lines = [
        f"# Forward cost, {data['date']}",
        "",
        f"{m['cpu']} ({' '.join(m['cpu_flags']) or 'no flags of note'}), {m['threads']} threads. "
        f"Memory bandwidth: copy {data['bandwidth_gbs']['copy']:.1f} GB/s, read "
        f"{data['bandwidth_gbs']['read']:.1f} GB/s.",
        "",
        "| model | precision | load s | GB/token | floor ms | c(1) ms | c(1)/floor | c(2)/c(1) | c(4)/c(1) "
        "| c(8)/c(1) | c(16)/c(1) | 16-row forward: bit-equal rows | same argmax | max abs diff |"
        + (f" prefill {data['rows'][0]['prefill']['tokens']} tokens s |" if prefill else ""),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if prefill else ""),
    ]
    for r in data["rows"]:
        q, inv = r["ratios"], r["batch_invariance"]
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['load_s']} | {r['weight_bytes'] / 1e9:.2f} | "
            f"{r['floor_ms']} | {r['c1_ms']} | {r['c1_over_floor']} | {q['2']:.2f} | {q['4']:.2f} | "
            f"{q['8']:.2f} | {q['16']:.2f} | {inv['bit_equal_rows']}/{inv['rows']} | "
            f"{inv['same_argmax_rows']}/{inv['rows']} | {inv['max_abs_diff']:.3g} |"
            + (f" {r['prefill']['seconds']:.2f} |" if prefill else "")
        )
    by = {(r["model"], r["precision"]): r for r in data["rows"]}
    precisions = sorted({r["precision"] for r in data["rows"]})
    pairs = [
        f"draft {dp} / target {tp} {by[(data['draft'], dp)]['c1_ms'] / by[(data['target'], tp)]['c1_ms']:.2f}"
        for tp in precisions
        for dp in precisions
        if (data["target"], tp) in by and (data["draft"], dp) in by and data["draft"] != data["target"]
    ]
    if pairs:
        lines.append("\nDraft/target c(1): " + ", ".join(pairs) + ".")
    how = {
        "int8": "the float32 weights, then the cached int8 ones",
        "w4a16": "the float32 weights, quantized at load",
        "int4": "llama.cpp maps the GGUF",
    }
    loads = "; ".join(f"{k}: {v}" for k, v in how.items() if k in precisions)
    lines.append(
        "\nfloor = GB/token / read bandwidth; load s: loading the model in that precision"
        + (f" ({loads})." if loads else ".")
    )
    if data.get("llamacpp_variants"):
        new = "cache_type" in data["llamacpp_variants"][0]  # runs before the cache type was varied lack it
        lines += ["", "llama.cpp's settings, target in int4 (3 repeats each):", ""]
        if new:
            layout = "prefill_repack" in data["llamacpp_variants"][0]  # runs before the prefill had its own context
            lines += [
                "| repacked weights | flash attention | KV cache | positions per forward with logits | "
                + ("prefill's weights | " if layout else "")
                + f"c(1) ms | c(2)/c(1) | c(4)/c(1) | c(16)/c(1) | prefill {PREFILL} tokens s | "
                f"bit-equal rows, {CONTEXT} cached | bit-equal rows, {LONG_CONTEXT} cached |",
                "|---|---|---|---:|" + ("---|" if layout else "") + "---:|---:|---:|---:|---:|---:|---:|",
            ]
            fa = {-1: "auto", 0: "off", 1: "on"}
            for v in data["llamacpp_variants"]:
                inv, inv_long = v["batch_invariance"], v["batch_invariance_long"]
                lines.append(
                    f"| {v['repack']} | {fa[v['flash_attn']]} | {v['cache_type']} | {v['row_chunk']} | "
                    + (f"{'repacked' if v['prefill_repack'] else 'as stored'} | " if layout else "")
                    + f"{v['c1_ms']} | {v['c2_over_c1']} | {v['c4_over_c1']} | {v['c16_over_c1']} | "
                    f"{v['prefill']['seconds']:.2f} | "
                    f"{inv['bit_equal_rows']}/{inv['rows']} | {inv_long['bit_equal_rows']}/{inv_long['rows']} |"
                )
            lines.append(
                "\nThe last row is what `--quantize int4` ran when this was measured (loosespec/decode/gguf.py); "
                f"{N_BATCH} positions per forward: the 16 rows in one forward, where llama.cpp's tiled matmul takes 8 "
                "rows or more"
                + (
                    "; prefill's weights: the weight layout of the context that prefills the prompt (its cache is "
                    "then copied into the decoding context where they differ)."
                    if layout
                    else "."
                )
            )
        else:
            lines += [
                "| repacked weights | flash attention | c(1) ms | c(16)/c(1) | bit-equal rows | same argmax |",
                "|---|---|---:|---:|---:|---:|",
            ]
            for v in data["llamacpp_variants"]:
                inv = v["batch_invariance"]
                lines.append(
                    f"| {v['repack']} | {v['flash_attn']} | {v['c1_ms']} | {v['c16_over_c1']} | "
                    f"{inv['bit_equal_rows']}/{inv['rows']} | {inv['same_argmax_rows']}/{inv['rows']} |"
                )
    lines.append(f"\nReproduce: `{data['command']}`")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", default="int8,int4")
    ap.add_argument("--models", default=f"{DEFAULT_TARGET},{DEFAULT_DRAFT}")
    ap.add_argument("--out", default="results/forward")
    ap.add_argument(
        "--llamacpp-variants",
        action="store_true",
        help="Also time the target in int4 with llama.cpp's repacking and flash attention on and off.",
    )
    ap.add_argument("--render", type=Path, help="Only write the .md of an earlier run's .json beside it.")
    args = ap.parse_args()
    if args.render:
        atomic_write_text(args.render.with_suffix(".md"), render(json.loads(args.render.read_text())))
        return
    bandwidth = {k: memory_bandwidth(k) for k in ("copy", "read")}
    print(f"bandwidth: copy {bandwidth['copy']:.1f} GB/s, read {bandwidth['read']:.1f} GB/s", file=sys.stderr)
    models = args.models.split(",")
    rows = [one(m, p, bandwidth["read"]) for p in args.precisions.split(",") for m in models]
    data = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": describe_device(torch.device("cpu")),
        "bandwidth_gbs": bandwidth,
        "target": models[0],
        "draft": models[-1],
        "rows": rows,
        "torch": torch.__version__,
        "llamacpp_variants": llamacpp_variants(models[0]) if args.llamacpp_variants else [],
        "command": "python benchmarks/forward_cost.py " + " ".join(sys.argv[1:]),
    }
    try:
        import llama_cpp

        data["llama_cpp_python"] = llama_cpp.__version__
    except ImportError:
        pass
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", cpu_info().model.lower()).strip("-")
    stem = out / f"{time.strftime('%Y%m%d-%H%M')}-{slug}"
    atomic_write_text(stem.with_suffix(".json"), json.dumps(data, indent=1))
    atomic_write_text(stem.with_suffix(".md"), render(data))
    print(render(data))


if __name__ == "__main__":
    main()
