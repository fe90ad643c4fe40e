"""What forwards and acceptance rules cost on this machine.

Times the target's prefill, a 1-token forward and a verify forward over K + 1 tokens (after a
prompt in the cache), and each rule on logits of that shape, on the same device. The ratio of the
verify forward to the 1-token forward decides how much speculative decoding can gain here:

    python benchmarks/rule_cost.py                       # default target, precision by hardware, K = 15
    python benchmarks/rule_cost.py --target smollm2-135m-instruct --dtype float32 --quantize none

The forward costs come from the same measurement the cost-aware draft length uses
(:func:`loosespec.cost.measure`, printed per n by ``loosespec models cost``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from loosespec.cost import measure
from loosespec.decode.kv import CachedLM
from loosespec.hardware import sync
from loosespec.models import load
from loosespec.verify import SamplingParams, greedy_verify, logits_to_probs, rejection_verify
from loosespec.verify.fly import fly_verify_greedy, fly_verify_rejection


def timed(fn, device, repeat: int) -> float:
    """Median seconds of ``fn()`` over ``repeat`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--quantize", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("-k", "--num-draft-tokens", type=int, default=15)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the numbers (and the cost curve) to this JSON file")
    args = ap.parse_args(argv)

    m = load(args.target, args.dtype, args.device, quantize=args.quantize)
    lm = CachedLM(m.model)
    g = torch.Generator().manual_seed(0)
    vocab = len(m.tokenizer)
    prompt = torch.randint(0, vocab, (args.prompt_tokens,), generator=g)
    draft = torch.randint(0, vocab, (args.num_draft_tokens,), generator=g)
    seq = torch.cat([prompt, draft])
    prefill = timed(lambda: (lm.reset(), lm.logits(prompt, rows=1)), lm.device, 1)  # leaves the prompt cached

    logits = lm.logits(seq, rows=args.num_draft_tokens + 1)
    draft_dev = draft.to(lm.device)
    gen = torch.Generator(device=lm.device).manual_seed(0)
    sampling = SamplingParams(0.7)
    rules = {
        "exact": lambda: greedy_verify(draft_dev, logits),
        "fly (greedy)": lambda: fly_verify_greedy(draft_dev, logits),
        "rejection (T=0.7, probs included)": lambda: rejection_verify(
            draft_dev, None, logits_to_probs(logits, sampling), gen
        ),
        "fly rejection (T=0.7, probs included)": lambda: fly_verify_rejection(
            draft_dev, None, logits, logits_to_probs(logits, sampling), gen
        ),
    }
    curve = measure(
        lm, args.num_draft_tokens + 1, context=args.prompt_tokens, repeats=args.repeat, sync=lambda: sync(lm.device)
    )
    one, fwd = curve(1), curve(args.num_draft_tokens + 1)
    print(f"{args.target} ({m.precision.name}, {lm.device}), medians of {args.repeat}:")
    print(f"  prefill of {args.prompt_tokens} tokens: {prefill * 1e3:.0f} ms")
    print(f"  1-token forward after {args.prompt_tokens} cached: {one * 1e3:.1f} ms")
    print(
        f"  verify forward over {args.num_draft_tokens + 1} tokens after {args.prompt_tokens} cached: "
        f"{fwd * 1e3:.1f} ms ({fwd / one:.1f}x the 1-token forward)"
    )
    print("| rule | ms | share of the verify forward |")
    print("| --- | ---: | ---: |")
    rule_ms = {}
    for name, fn in rules.items():
        t = timed(fn, lm.device, 50)
        rule_ms[name] = round(t * 1e3, 4)
        print(f"| {name} | {t * 1e3:.3f} | {100 * t / fwd:.2f}% |")
    if args.json:
        import json

        from loosespec.fileio import atomic_write_text

        data = {
            "model": args.target,
            "precision": m.precision.name,
            "device": str(lm.device),
            "prompt_tokens": args.prompt_tokens,
            "k": args.num_draft_tokens,
            "prefill_ms": round(prefill * 1e3, 3),
            "one_token_ms": round(one * 1e3, 4),
            "verify_ms": round(fwd * 1e3, 4),
            "verify_over_one": round(fwd / one, 3),
            "curve_ms": {n: round(curve(n) * 1e3, 4) for n in range(1, args.num_draft_tokens + 2)},
            "rule_ms": rule_ms,
        }
        atomic_write_text(args.json, json.dumps(data, indent=1))  # replaced whole: never a torn file
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
