"""Side-by-side speed of loosespec's lossless methods and transformers' own speculative decoding.

Same process, same loaded models, same chat-formatted prompt ids, greedy, interleaved per prompt
(so machine drift hits every method alike), one warm-up per method excluded from timing.

    python benchmarks/speed_vs_hf.py --limit 5 --max-new-tokens 128            # issue #2 check
    python benchmarks/speed_vs_hf.py --limit 2 --methods ar,exact-ngram,hf-pld  # quicker

Methods: ``ar``, ``exact-ngram``, ``exact-model``, ``exact-mla`` (loosespec), and the peers
``hf-ar`` (``generate()``), ``hf-pld`` (``generate(prompt_lookup_num_tokens=10)``) and
``hf-assist`` (``generate(assistant_model=draft)``, transformers' defaults: 20 tokens, confidence
threshold 0.4). Speedup = total ``ar`` wall time / total method wall time over the same prompts.
Every method's output is compared with ``ar``'s: greedy lossless methods should agree (bf16
matmuls of different shapes can flip a near-tie, so the agreement count is printed, not assumed).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from loosespec import DecodeConfig, Engine
from loosespec.engine import sync
from loosespec.text import encode_prompt

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "humaneval.jsonl"
ALL = ["ar", "exact-ngram", "exact-model", "exact-mla", "hf-ar", "hf-pld", "hf-assist"]


def humaneval_prompts(path: Path, limit: int) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()[:limit]]
    return [(r["task_id"], "Complete the following Python function.\n\n```python\n" + r["prompt"] + "```")
            for r in rows]


def hf_generate(engine: Engine, ids: torch.Tensor, max_new: int, **kw) -> tuple[list[int], float]:
    from transformers import GenerationConfig

    model = engine.target.model
    gc = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=sorted(engine.stop_ids),
                          pad_token_id=engine.tokenizer.pad_token_id or sorted(engine.stop_ids)[0])
    inp = ids.unsqueeze(0).to(engine.device)
    sync(engine.device)
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(inp, attention_mask=torch.ones_like(inp), generation_config=gc, **kw)
    sync(engine.device)
    return out[0, inp.shape[1]:].tolist(), time.perf_counter() - t


def run_one(engine: Engine, method: str, ids: torch.Tensor, max_new: int) -> dict:
    if method.startswith("hf-"):
        kw = {"hf-ar": {}, "hf-pld": {"prompt_lookup_num_tokens": 10},
              "hf-assist": {"assistant_model": engine.draft.model if engine.draft else None}}[method]
        if method == "hf-assist":
            kw["tokenizer"] = engine.tokenizer
        tokens, wall = hf_generate(engine, ids, max_new, **kw)
        return {"token_ids": tokens, "wall_s": wall, "mean_accepted_length": None}
    name, _, drafter = method.partition("-")
    cfg = DecodeConfig.create(name, drafter or None, max_new_tokens=max_new, has_draft_model=engine.draft is not None)
    r = engine.generate(ids, cfg)
    return {"token_ids": r.token_ids, "wall_s": r.stats.wall_s, "mean_accepted_length": r.stats.mean_accepted_length,
            "acceptance_rate": r.stats.acceptance_rate, "target_forwards": r.stats.target_forwards,
            "draft_forwards": r.stats.draft_forwards}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--methods", default=",".join(ALL))
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, help="write per-prompt results and the summary as JSON")
    args = ap.parse_args(argv)
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in ALL]
    if unknown:
        ap.error(f"unknown methods {unknown}; choose from {ALL}")
    if "ar" not in methods:
        methods.insert(0, "ar")

    engine = Engine.load(args.target, args.draft, dtype=args.dtype, device=args.device)
    prompts = [(tid, encode_prompt(engine.tokenizer, text)) for tid, text in humaneval_prompts(args.data, args.limit)]
    print(f"# {args.target} <- {args.draft}, {args.dtype} on {engine.device} ({platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads), {len(prompts)} HumanEval prompts, {args.max_new_tokens} new tokens, greedy",
          file=sys.stderr)
    for m in methods:  # warm-up, not timed
        run_one(engine, m, prompts[0][1], 8)

    rows = []
    for tid, ids in prompts:
        for m in methods:
            r = run_one(engine, m, ids, args.max_new_tokens)
            rows.append({"task_id": tid, "method": m, **r})
            print(f"{tid:14} {m:12} {len(r['token_ids']):4d} tok {r['wall_s']:7.2f} s", file=sys.stderr)

    ar = {r["task_id"]: r for r in rows if r["method"] == "ar"}
    ar_total = sum(r["wall_s"] for r in ar.values())
    summary = {}
    print(f"\n{'method':12} {'wall s':>8} {'tok/s':>7} {'speedup':>8} {'tau':>6} {'same as ar':>10}")
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        wall = sum(r["wall_s"] for r in mine)
        toks = sum(len(r["token_ids"]) for r in mine)
        same = sum(r["token_ids"] == ar[r["task_id"]]["token_ids"] for r in mine)
        taus = [r["mean_accepted_length"] for r in mine if r["mean_accepted_length"]]
        tau = sum(taus) / len(taus) if taus else float("nan")
        summary[m] = {"wall_s": round(wall, 3), "tokens": toks, "tokens_per_s": round(toks / wall, 3),
                      "speedup": round(ar_total / wall, 3), "mean_accepted_length": round(tau, 3),
                      "identical_to_ar": f"{same}/{len(mine)}"}
        print(f"{m:12} {wall:8.2f} {toks / wall:7.2f} {ar_total / wall:7.2f}x {tau:6.2f} {same:>6}/{len(mine)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"config": vars(args) | {"data": str(args.data), "out": str(args.out)},
                                        "summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
