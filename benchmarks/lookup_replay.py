"""Which prompt-lookup search drafts best: replayed on committed ``ar`` outputs, no model forward.

Greedy exact verification is lossless, so an ``exact-ngram`` run emits ``ar``'s tokens whatever the
lookup proposes; only how many rounds it takes differs. This replays that loop offline on the ``ar``
rows of committed result directories: at each round the lookup proposes up to K tokens from prompt +
output so far, the round keeps the proposal's prefix that equals ``ar``'s next tokens, plus one. Per
search (:data:`loosespec.drafters.ngram.SEARCHES`) it reports tokens per round and the modelled tokens/s
of the target's cost curve (``sum(tokens) / sum(c(len(draft) + 1))``; lookup itself is free), so the
searches compare on the same outputs with no timing noise. What it leaves out: the cost-aware draft
length (K is fixed here) and MLA, whose lookup proposes the draft model's tokens, not the target's.

    .venv/bin/python benchmarks/lookup_replay.py results/bench/evidence/specbench \\
        results/bench/evidence/humaneval results/bench/evidence/gsm8k --out results/lookup_replay.txt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loosespec.cost import CostCurve  # noqa: E402
from loosespec.drafters.ngram import SEARCHES, ngram_lookup  # noqa: E402
from loosespec.fileio import atomic_write_text  # noqa: E402


def replay(
    prompt: torch.Tensor, out: list[int], search: str, max_ngram: int, k: int, cost: CostCurve
) -> tuple[int, int, float]:
    """(tokens, rounds, modelled seconds) of exact verification with this lookup on ``ar``'s output ``out``."""
    seq = torch.cat([prompt, torch.tensor(out, dtype=torch.long)])
    p, t, rounds, seconds = len(prompt), 0, 0, 0.0
    while t < len(out):
        want = min(k, len(out) - t - 1)
        draft = ngram_lookup(seq[: p + t], max_ngram, want, search=search).tolist() if want > 0 else []
        n = 0
        while n < len(draft) and draft[n] == out[t + n]:
            n += 1
        t += n + 1
        rounds += 1
        seconds += cost(len(draft) + 1)
    return len(out), rounds, seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="bench result directories with ar rows")
    ap.add_argument(
        "--cost",
        type=Path,
        default=ROOT / "results/bench/cpu/cost_target.json",
        help="the target's cost curve (JSON as loosespec models cost writes it)",
    )
    ap.add_argument("--k", type=int, default=10, help="draft tokens per round (PLD's and loosespec's ngram default)")
    ap.add_argument("--max-ngram", type=int, default=3, help="longest suffix n-gram tried (prompt_lookup_max)")
    ap.add_argument("--out", type=Path, help="also write the markdown table here")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from loosespec.decode.text import encode_prompt
    from loosespec.eval.datasets import load_dataset
    from loosespec.models import resolve

    cost = CostCurve.from_dict(json.loads(args.cost.read_text()))
    lines = [
        f"Prompt-lookup searches replayed on committed `ar` outputs: exact verification, K = {args.k}, "
        f"max n-gram {args.max_ngram}; modelled with the cost curve {args.cost.relative_to(ROOT)} "
        f"({cost.meta.get('cpu', '?')}, {cost.meta.get('precision', '?')}). Command: "
        f"`.venv/bin/python benchmarks/lookup_replay.py {' '.join(str(d) for d in args.dirs)}`.",
        "",
        "| set | prompts | search | tokens per round | modelled tok/s | vs fly |",
        "| --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for d in args.dirs:
        config = json.loads((d / "config.json").read_text())
        tok = AutoTokenizer.from_pretrained(str(resolve(config["target"]).path))
        problems = {p.id: p for p in load_dataset(config["dataset"], None, None, **config.get("dataset_options", {}))}
        rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines() if x.strip()]
        ar = [r for r in rows if r["method"] == "ar" and r["question_id"] in problems]
        totals = {}
        for s in SEARCHES:
            tokens = rounds = 0
            seconds = 0.0
            for r in ar:
                prompt = encode_prompt(tok, problems[r["question_id"]].prompt)
                a, b, c = replay(prompt, r["token_ids"], s, args.max_ngram, args.k, cost)
                tokens, rounds, seconds = tokens + a, rounds + b, seconds + c
            totals[s] = (tokens / rounds, tokens / seconds)
        for s in SEARCHES:
            tpr, tps = totals[s]
            lines.append(
                f"| {config['dataset']} | {len(ar)} | {s} | {tpr:.3f} | {tps:.2f} | {tps / totals['fly'][1]:.3f} |"
            )
    text = "\n".join(lines)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
