"""Why a lossless method can differ from ``ar`` in bfloat16: the first token's log-probs by forward shape.

Prints the target's top-3 log-probs for the first new token of a GSM8K problem after a
prompt-only forward (what ``ar`` computes) and after a forward that also carries K more tokens
(the shape of a verify forward), in bfloat16 and float32. Where two tokens tie in bfloat16 the
pick can depend on the shape; in float32 it does not.

    python benchmarks/near_tie.py --problem 0 --extra 4
"""

from __future__ import annotations

import argparse

import torch

from loosespec.decode.text import encode_prompt
from loosespec.eval.loaders import gsm8k
from loosespec.models import load


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--problem", type=int, default=0, help="GSM8K test problem index")
    ap.add_argument("--extra", type=int, default=4, help="tokens riding along in the second forward")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args(argv)
    for dtype in args.dtypes.split(","):
        m = load(args.target, dtype, "cpu", progress=False)
        ids = encode_prompt(m.tokenizer, gsm8k(args.problem + 1)[args.problem].prompt)
        extra = m.tokenizer(" The ducks lay eggs every day.", return_tensors="pt").input_ids[0, : args.extra]
        with torch.inference_mode():
            alone = m.model(input_ids=ids.unsqueeze(0)).logits[0, -1]
            along = m.model(input_ids=torch.cat([ids, extra]).unsqueeze(0)).logits[0, ids.shape[0] - 1]
        for name, logits in ((f"prompt only ({ids.shape[0]} tokens)", alone), (f"prompt + {len(extra)} tokens", along)):
            top = torch.topk(torch.log_softmax(logits.float(), dim=-1), 3)
            shown = ", ".join(
                f"{m.tokenizer.decode([int(i)])!r} {float(v):.4f}" for v, i in zip(top.values, top.indices)
            )
            print(f"{dtype:9} {name:26} {shown}")
        del m
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
