"""Side-by-side speed of loosespec's methods and transformers' own speculative decoding.

The resumable, scored harness for whole datasets is ``loosespec bench`` (loosespec/eval/harness.py, whose
method runners this script shares); this script keeps the multi-set prompt lists of issues 2-4.

Same process, same loaded models, same chat-formatted prompt ids, interleaved per prompt (machine
drift hits every method alike), one warm-up per method excluded from timing.

    # issue #2: lossless methods vs transformers on the first 5 HumanEval prompts
    python benchmarks/speed.py --prompts humaneval:5 --max-new-tokens 128 \\
        --methods ar,exact-ngram,exact-model,exact-mla,hf-ar,hf-pld,hf-assist
    # issue #3: FLy vs exact, per category
    python benchmarks/speed.py --prompts humaneval:10,specbench/summarization:10,specbench/math_reasoning:10 \\
        --max-new-tokens 256 --methods ar,exact-ngram,exact-mla,fly-ngram,fly-mla,hf-pld
    # issue #4: SpecGuard on GSM8K, accuracy and speed
    python benchmarks/speed.py --prompts gsm8k:30 --max-new-tokens 384 \\
        --methods ar,exact-mla,fly-mla,specguard,specguard-regenerate

Methods: ``<method>-<drafter>`` for loosespec (``ar``, ``exact-ngram``, ``fly-mla``, ...),
``specguard`` (draft-assisted, exact), ``specguard-regenerate`` (the paper's plain target step) and
``specguard-fly`` (draft-assisted, FLy), all with ``--sg-tau`` (default: the library's), and the
peers ``hf-ar`` (``generate()``), ``hf-pld`` (``generate(prompt_lookup_num_tokens=10)``) and
``hf-assist`` (``generate(assistant_model=draft)``, transformers' defaults: 20 tokens, confidence
threshold 0.4). Greedy throughout. Speedup = total ``ar`` wall time / total method wall time over
the same prompts. Every output is compared with ``ar``'s: lossless methods should agree (bf16
matmuls of different shapes can flip a near-tie, so agreement is counted, not assumed); for the
lossy methods the count of differing outputs and a few side-by-side examples are printed. GSM8K
prompts are also scored (``loosespec.eval.datasets.extract_number``): accuracy, recovery (method
accuracy / ``ar`` accuracy) and the paired counts.
"""

from __future__ import annotations

import argparse
import difflib
import json
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from loosespec import Engine
from loosespec.eval.harness import (HF_GENERATION_KWARGS, WARMUP_TOKENS, is_lossy, method_config,
                                    pooled_mean_accepted_length, run_method)
from loosespec.eval.datasets import data_dir, gsm8k, is_correct
from loosespec.decode.text import encode_prompt


def load_prompts(spec: str, data: Path) -> list[tuple[str, str, str, str | None]]:
    """``humaneval:N``, ``specbench/<category>:N``, ``gsm8k:N`` -> [(category, id, prompt text, gold answer)]."""
    out = []
    for part in spec.split(","):
        name, _, n = part.partition(":")
        limit = int(n) if n else None
        if name == "humaneval":
            rows = [json.loads(x) for x in (data / "humaneval.jsonl").read_text().splitlines()][:limit]
            out += [("humaneval", r["task_id"], "Complete the following Python function.\n\n```python\n"
                     + r["prompt"] + "```", None) for r in rows]
        elif name.startswith("specbench/"):
            cat = name.split("/", 1)[1]
            rows = [json.loads(x) for x in (data / "spec_bench_question.jsonl").read_text().splitlines()]
            rows = [r for r in rows if r["category"] == cat][:limit]
            if not rows:
                raise SystemExit(f"no Spec-Bench prompts in category '{cat}'")
            out += [(cat, str(r["question_id"]), r["turns"][0], None) for r in rows]
        elif name == "gsm8k":
            out += [(p.category, p.id, p.prompt, p.answer) for p in gsm8k(limit, data)]
        else:
            raise SystemExit(f"unknown prompt set '{name}' (humaneval:N, specbench/<category>:N or gsm8k:N)")
    return out


def run_one(engine: Engine, method: str, ids: torch.Tensor, max_new: int, sg_tau: float | None = None) -> dict:
    # fixed K per round: the committed results/speed_*.json were measured so (loosespec bench has both)
    settings = {"max_new_tokens": max_new, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "sg_tau": sg_tau,
                "adaptive_draft_length": False}
    o = run_method(engine, method, ids, settings)
    s = o.stats
    return {"token_ids": o.token_ids, "wall_s": o.wall_s, "lossy": is_lossy(method),
            "mean_accepted_length": s.get("mean_accepted_length") if method not in HF_GENERATION_KWARGS else None,
            "rounds": s.get("rounds") if method not in HF_GENERATION_KWARGS else None,
            "acceptance_rate": s.get("acceptance_rate"), "target_forwards": s.get("target_forwards"),
            "draft_forwards": s.get("draft_forwards"), "steps": s.get("steps"), "accepted_steps": s.get("accepted_steps"),
            "sg_tau": o.config.get("sg_tau") if o.config.get("method") == "specguard" else None,
            "events": {k: v for k, v in s.items() if k.startswith("fly_")}}


def summarize(rows: list[dict], methods: list[str]) -> dict:
    """Per category (and "all"): speedup over ar, tokens/s, mean accepted length, outputs equal to ar."""
    ar = {(r["category"], r["id"]): r for r in rows if r["method"] == "ar"}
    table: dict = defaultdict(dict)
    for cat in sorted({r["category"] for r in rows}) + ["all"]:
        picked = [r for r in rows if cat in ("all", r["category"])]
        ar_wall = sum(r["wall_s"] for r in picked if r["method"] == "ar")
        for m in methods:
            mine = [r for r in picked if r["method"] == m]
            wall = sum(r["wall_s"] for r in mine)
            toks = sum(len(r["token_ids"]) for r in mine)
            counted = [r for r in mine if r.get("rounds")]  # transformers' peers report no rounds
            same = sum(r["token_ids"] == ar[(r["category"], r["id"])]["token_ids"] for r in mine)
            table[cat][m] = {"speedup": round(ar_wall / wall, 3), "wall_s": round(wall, 2),
                             "tokens_per_s": round(toks / wall, 3),
                             "mean_accepted_length": pooled_mean_accepted_length(
                                 [len(r["token_ids"]) for r in counted], [r["rounds"] for r in counted]),
                             "identical_to_ar": same, "prompts": len(mine), "lossy": mine[0]["lossy"]}
            scored = [r for r in mine if r.get("correct") is not None]
            if scored:
                ar_ok = {(r["category"], r["id"]): ar[(r["category"], r["id"])]["correct"] for r in scored}
                acc = sum(r["correct"] for r in scored) / len(scored)
                ar_acc = sum(ar_ok.values()) / len(scored)
                table[cat][m].update({
                    "accuracy": round(acc, 4), "recovery": round(acc / ar_acc, 4) if ar_acc else None,
                    "ar_right_method_wrong": sum(ar_ok[(r["category"], r["id"])] and not r["correct"] for r in scored),
                    "ar_wrong_method_right": sum(not ar_ok[(r["category"], r["id"])] and r["correct"] for r in scored)})
            steps = sum(r.get("steps") or 0 for r in mine)
            if steps:
                table[cat][m]["step_accept_rate"] = round(sum(r["accepted_steps"] for r in mine) / steps, 4)
                table[cat][m]["sg_tau"] = mine[0]["sg_tau"]
    return dict(table)


def print_table(table: dict) -> None:
    for cat, per_method in table.items():
        print(f"\n## {cat}\n")
        scored = any("accuracy" in s for s in per_method.values())
        extra = " accuracy | recovery | ar right, method wrong | ar wrong, method right | step accept rate |"
        print("| method | speedup | tok/s | mean accepted length | outputs identical to ar |" + (extra if scored else ""))
        print("| --- | ---: | ---: | ---: | ---: |" + (" ---: |" * 5 if scored else ""))
        for m, s in per_method.items():
            tau = f"{s['mean_accepted_length']:.2f}" if s["mean_accepted_length"] is not None else "-"
            label = m + (" (lossy)" if s["lossy"] else "")
            line = (f"| {label} | {s['speedup']:.2f}x | {s['tokens_per_s']:.2f} | {tau} | "
                    f"{s['identical_to_ar']}/{s['prompts']} |")
            if scored:
                rec = "-" if s.get("recovery") is None else f"{s['recovery']:.2f}"
                sar = "-" if "step_accept_rate" not in s else f"{s['step_accept_rate']:.2f} (tau {s['sg_tau']})"
                line += (f" {s['accuracy']:.2f} | {rec} | {s['ar_right_method_wrong']} | "
                         f"{s['ar_wrong_method_right']} | {sar} |")
            print(line)


def print_differences(engine: Engine, rows: list[dict], methods: list[str], examples: int) -> None:
    """Side-by-side excerpts where a lossy method's output differs from ar's."""
    ar = {(r["category"], r["id"]): r for r in rows if r["method"] == "ar"}
    shown = 0
    for r in rows:
        if shown >= examples or not r["lossy"] or r["token_ids"] == ar[(r["category"], r["id"])]["token_ids"]:
            continue
        a = engine.tokenizer.decode(ar[(r["category"], r["id"])]["token_ids"], skip_special_tokens=True)
        b = engine.tokenizer.decode(r["token_ids"], skip_special_tokens=True)
        sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
        first = next(op for op in sm.get_opcodes() if op[0] != "equal")
        lo = max(0, first[1] - 60)
        print(f"\n### {r['category']} {r['id']}, {r['method']} vs ar (first difference at char {first[1]})\n")
        print("ar:     " + json.dumps(a[lo:first[2] + 80]))
        print(f"{r['method']}: " + json.dumps(b[max(0, first[3] - 60):first[4] + 80]))
        shown += 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prompts", default="humaneval:5", help="humaneval:N,specbench/<category>:N,...")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--methods", default="ar,exact-ngram,exact-model,exact-mla,hf-ar,hf-pld,hf-assist")
    ap.add_argument("--data", type=Path, default=None, help="evaluation sets (default: $LOOSESPEC_DATA or shared/data)")
    ap.add_argument("--sg-tau", type=float, default=None, help="SpecGuard's tau (default: the library's)")
    ap.add_argument("--examples", type=int, default=3, help="side-by-side differences to print for lossy methods")
    ap.add_argument("--out", type=Path, help="write per-prompt rows and the summary as JSON")
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if "ar" not in methods:
        methods.insert(0, "ar")
    for m in methods:  # fail before loading models
        method_config(m, max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0, has_draft=True, sg_tau=args.sg_tau)

    engine = Engine.load(args.target, args.draft, dtype=args.dtype, device=args.device)
    prompts = [(cat, pid, encode_prompt(engine.tokenizer, text), gold)
               for cat, pid, text, gold in load_prompts(args.prompts, data_dir(args.data))]
    print(f"# {args.target} <- {args.draft}, {args.dtype} on {engine.device} ({platform.machine()}, "
          f"{torch.get_num_threads()} threads), {len(prompts)} prompts ({args.prompts}), "
          f"{args.max_new_tokens} new tokens, greedy", file=sys.stderr)
    for m in methods:  # warm-up, not timed
        run_one(engine, m, prompts[0][2], min(WARMUP_TOKENS, args.max_new_tokens), args.sg_tau)

    rows = []
    for cat, pid, ids, gold in prompts:
        for m in methods:
            r = run_one(engine, m, ids, args.max_new_tokens, args.sg_tau)
            if gold is not None:
                r["correct"] = is_correct(engine.tokenizer.decode(r["token_ids"], skip_special_tokens=True), gold)
            rows.append({"category": cat, "id": pid, "method": m, **r})
            print(f"{cat:14} {pid:14} {m:12} {len(r['token_ids']):4d} tok {r['wall_s']:7.2f} s"
                  + ("" if gold is None else f" {'right' if r['correct'] else 'wrong'}"), file=sys.stderr)

    table = summarize(rows, methods)
    print(f"\n{args.target} <- {args.draft}, {args.dtype}, {engine.device}, {args.prompts}, "
          f"{args.max_new_tokens} new tokens, greedy")
    print_table(table)
    print_differences(engine, rows, methods, args.examples)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        cfg = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.out.write_text(json.dumps({"config": cfg, "summary": table, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
