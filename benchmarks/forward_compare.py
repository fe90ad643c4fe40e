"""Pairs `make bench-forward`'s directories (one per target/draft precision, same prompts, one sitting) prompt by
prompt: tokens/s of every method against llama.cpp's plain decoding and against int8 ``ar``, and whether each
lossless method stayed identical to ``ar`` of its own precision (issue 42).

    .venv/bin/python benchmarks/forward_compare.py results/bench/forward

Speed ratios are geometric means over prompts of paired tokens/s ratios (new tokens / wall seconds, prefill
included); "vs ar (same dir)" pairs rows timed in the same run, minutes apart at most, and is the ratio to
trust across directories: the machine's speed drifted by more than 15% between them (compare llamacpp-ar, the same
runtime, in each); "identical to ar" compares token ids with the same directory's ``ar``. Each directory's llamacpp-ar
is the same runtime timed again beside that directory's methods; the ratio against it pairs rows timed minutes
apart.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

LOSSLESS_PREFIXES = ("ar", "exact-", "rejection-")
DATASETS = {"specbench": "Spec-Bench", "gsm8k": "GSM8K", "humaneval": "HumanEval"}


def rows_of(d: Path) -> dict:
    out = {}
    for line in (d / "results.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            out[(r["question_id"], r["method"])] = r
    return out


def tps(r: dict) -> float:
    return r["new_tokens"] / r["wall_time"]


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def compare(root: Path) -> str:
    dirs = sorted(p for p in root.iterdir() if (p / "results.jsonl").exists())
    if not dirs:
        raise SystemExit(f"no bench directories under {root}")
    data = {d.name: rows_of(d) for d in dirs}
    configs = {d.name: json.loads((d / "config.json").read_text()) for d in dirs}
    base = data.get("int8", {})
    hw = next(iter(next(iter(data.values())).values()))["hardware"]
    dataset = next(iter(configs.values())).get("dataset", "specbench")
    scored = any(r.get("score") is not None for d in data.values() for r in d.values())  # Spec-Bench is not
    lines = [
        f"# Forward precision compared ({root})",
        "",
        f"{hw.get('cpu')} ({' '.join(hw.get('cpu_flags', []))}), {hw.get('threads')} threads; "
        f"{len({q for d in data.values() for q, _ in d})} {DATASETS.get(dataset, dataset)} prompts.",
        "",
        "| target / draft | method | n | tok/s | vs ar (same dir) | vs llamacpp-ar (same dir) | vs int8 ar | "
        "identical to ar | draft-model rounds (llamacpp-spec: accepted/drafted tokens) |"
        + (" right |" if scored else ""),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if scored else ""),
    ]
    for name, rows in data.items():
        cfg = configs[name]
        label = f"{cfg['dtype']} / {cfg.get('draft_dtype', cfg['dtype'])}"
        methods = sorted({m for _, m in rows}, key=lambda m: (m != "ar", m.startswith("llamacpp"), m))
        for m in methods:
            qs = sorted(q for q, mm in rows if mm == m)
            own = [rows[(q, m)] for q in qs]
            vs_llama = [tps(rows[(q, m)]) / tps(rows[(q, "llamacpp-ar")]) for q in qs if (q, "llamacpp-ar") in rows]
            vs_ar = [tps(rows[(q, m)]) / tps(rows[(q, "ar")]) for q in qs if (q, "ar") in rows]
            vs_ar8 = [tps(rows[(q, m)]) / tps(base[(q, "ar")]) for q in qs if (q, "ar") in base]
            same = [rows[(q, m)]["token_ids"] == rows[(q, "ar")]["token_ids"] for q in qs if (q, "ar") in rows]
            model_rounds = sum(r["stats"].get("rounds_model", 0) for r in own)
            total_rounds = sum(r["stats"].get("rounds", 0) for r in own)
            lossless = m.startswith(LOSSLESS_PREFIXES)
            drafts = f"{model_rounds}/{total_rounds}" if "mla" in m or "model" in m else "-"
            if m == "llamacpp-spec":  # llama.cpp's own counters (its timings' draft_n, draft_n_accepted)
                drafts = f"{sum(r['accepted_tokens'] or 0 for r in own)}/{sum(r['drafted_tokens'] or 0 for r in own)}"
            ratio = lambda xs: f"{geomean(xs):.2f}x" if xs else "-"  # noqa: E731
            lines.append(
                f"| {label} | {m} | {len(qs)} | {sum(map(tps, own)) / len(own):.2f} | {ratio(vs_ar)} | "
                f"{ratio(vs_llama)} | {ratio(vs_ar8)} | "
                f"{f'{sum(same)}/{len(same)}' if lossless and not m.startswith('llamacpp') else '-'} | "
                f"{drafts} |" + (f" {sum(bool(r.get('score')) for r in own)}/{len(own)} |" if scored else "")
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(compare(Path(sys.argv[1] if len(sys.argv) > 1 else "results/bench/forward")))
