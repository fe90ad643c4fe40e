"""Where transformers' ``generate`` leaves loosespec's ``ar`` on the same model (issue 20).

In a low precision (int8 on CPUs without bf16 arithmetic) two splits of the same computation can round
differently, and a near-tie then picks another token. This script takes one GSM8K problem of a committed
evidence run and shows, on the precision ``--dtype auto`` picks here:

1. ``ar`` against ``hf-ar`` (transformers' greedy ``generate``): the first new token where they differ, and
   loosespec's cache fed as ``generate`` feeds it (the whole prompt in one forward, then one token at a time):
   the largest logit difference to ``generate``'s over every step before it, and the token each picks there.
   ``ar`` (every loosespec method) prefills the prompt without its last token and feeds that token with the
   first drafts (``loosespec.decode.loop.decode``; ``loosespec.quant``'s row-wise attention), so all its
   methods compute every position alike.
2. ``hf-assist`` (transformers' assisted generation) against ``hf-ar``: the first differing token, the
   target's attention calls by number of queries and whether their mask is the plain causal one, and, for every
   new token up to the first difference, the target forward of hf-assist that scored it (how many queries it
   had) and the largest difference of its logits to ``generate``'s one-token-at-a-time logits.
3. Why they differ from the first token: hf-assist's first target forward is the prompt together with the
   first candidates. The script prefills the prompt alone and the prompt with those candidates, and prints the
   largest difference of the last prompt row's logits, with transformers' SDPA for the long forward (as
   ``generate`` runs it) and with the row-wise attention for every query count.

    python benchmarks/hf_divergence.py [--problem 0] [--tokens 40] [--results results/bench/evidence/gsm8k]
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problem", type=int, default=0, help="GSM8K test row")
    ap.add_argument("--tokens", type=int, default=40, help="new tokens to generate")
    ap.add_argument(
        "--results",
        type=Path,
        default=Path("results/bench/evidence/gsm8k"),
        help="a bench directory with ar's row for the problem",
    )
    args = ap.parse_args(argv)

    import torch
    from transformers import AttentionInterface

    from loosespec import quant
    from loosespec.decode.engine import Engine
    from loosespec.decode.kv import CachedLM
    from loosespec.decode.text import encode_prompt
    from loosespec.eval.datasets import load_dataset
    from loosespec.eval.failures import first_divergence
    from loosespec.eval.results import RESULTS, ResultsFile

    qid = f"gsm8k/{args.problem}"
    ar = next(r for r in ResultsFile(args.results / RESULTS).read() if r["method"] == "ar" and r["question_id"] == qid)
    engine = Engine.load(progress=False)
    model = engine.target.model
    ids = encode_prompt(engine.tokenizer, load_dataset("gsm8k", limit=args.problem + 1)[args.problem].prompt)
    inp = ids.unsqueeze(0)
    eos = sorted(engine.stop_ids)
    kw = dict(
        attention_mask=torch.ones_like(inp),
        max_new_tokens=args.tokens,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        eos_token_id=eos,
        pad_token_id=eos[0],
        return_dict_in_generate=True,
        output_logits=True,
    )
    print(
        f"{qid}: the default pair, precision "
        f"{getattr(engine, 'precision', '?')}, attention {model.config._attn_implementation}, prompt {len(ids)} tokens"
    )

    calls = collections.Counter()
    rowwise = quant.rowwise_attention

    def spy(module, query, key, value, attention_mask, **kwargs):
        n = query.shape[2]
        plain = quant.plain_causal(attention_mask, n, key.shape[2])
        calls[(n if n <= quant.ROWWISE_MAX_QUERIES else "prefill", "causal" if plain else "other mask")] += 1
        return rowwise(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(quant.ROWWISE_ATTENTION, spy)
    scored = {}  # new token index -> (queries of the target forward that scored it, its logits there)
    past = []

    def before(module, args, kwargs):
        cache = kwargs.get("past_key_values")
        past.append(cache.get_seq_length() if cache is not None else 0)

    def after(module, args, kwargs, output):
        start = past.pop()
        queries = (kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]).shape[-1]
        rows = output.logits[0].float()
        first = start + queries - rows.shape[0]  # the position of the first row kept (logits_to_keep)
        for r in range(rows.shape[0]):
            j = first + r + 1 - len(ids)  # the row at position p scores the token at p + 1
            if j >= 0:
                scored[j] = (queries, rows[r].clone())

    with torch.inference_mode():
        hf = model.generate(inp, **kw)
        hf_calls = dict(calls)
        calls.clear()
        hooks = [
            model.register_forward_pre_hook(before, with_kwargs=True),
            model.register_forward_hook(after, with_kwargs=True),
        ]
        try:
            assist = model.generate(inp, assistant_model=engine.draft.model, tokenizer=engine.tokenizer, **kw)
        finally:
            for h in hooks:
                h.remove()
    hf_ids = hf.sequences[0, inp.shape[1] :].tolist()
    assist_ids = assist.sequences[0, inp.shape[1] :].tolist()

    k = first_divergence(ar["token_ids"], hf_ids)
    print(
        f"\n1. ar and hf-ar part at new token {k}: ar {ar['token_ids'][k] if k is not None else '-'}, "
        f"hf-ar {hf_ids[k] if k is not None else '-'}"
    )
    if k is not None:
        cache = CachedLM(model)
        seq = torch.cat([ids, torch.tensor(hf_ids[:k])])
        worst, last = 0.0, None
        with torch.inference_mode():
            for j, n in enumerate(range(len(ids), len(seq) + 1)):
                last = cache.logits(seq[:n], 1)[0]
                worst = max(worst, float((last - hf.logits[j][0].float()).abs().max()))
        top = torch.topk(last, 2)
        print(
            f"   loosespec's cache fed as generate feeds it: largest logit difference to generate's over steps 0..{k}: "
            f"{worst:g}; it picks {int(last.argmax())} (top two {top.indices.tolist()}, logits "
            f"{[round(v, 3) for v in top.values.tolist()]})"
        )
    j = first_divergence(hf_ids, assist_ids)
    print(
        f"\n2. hf-assist and hf-ar part at new token {j}: hf-ar {hf_ids[j] if j is not None else '-'}, "
        f"hf-assist {assist_ids[j] if j is not None else '-'}"
    )
    print(f"   attention calls (queries, mask) in hf-ar: {hf_calls}")
    print(f"   in hf-assist (target and draft): {dict(calls)}")
    # scored[j] is the last forward that scored token j; up to the first difference the two runs share the text
    shared = j if j is not None else min(len(hf_ids), len(assist_ids)) - 1  # to the first difference
    print(
        "   hf-assist's target logits against hf-ar's, new token: (queries of the forward that scored it) "
        "largest difference"
    )
    for t in range(shared + 1):
        if t not in scored or t >= len(hf.logits):
            continue
        queries, row = scored[t]
        ref = hf.logits[t][0].float()
        top = torch.topk(row, 2)
        print(
            f"   {t}: ({queries} queries) {float((row - ref).abs().max()):g}; picks {int(row.argmax())} "
            f"(hf-ar {int(ref.argmax())}), top two logits {[round(v, 3) for v in top.values.tolist()]}"
        )

    first = min(scored.get(0, (0,))[0], len(ids) + len(assist_ids)) - len(ids)  # candidates riding with the prompt
    if first > 0:
        from transformers import DynamicCache

        def last_prompt_row(tokens):
            with torch.inference_mode():
                out = model(
                    input_ids=tokens.unsqueeze(0), past_key_values=DynamicCache(config=model.config), use_cache=True
                )
            return out.logits[0, len(ids) - 1].float()

        longer = torch.cat([ids, torch.tensor(assist_ids[:first])])
        sdpa = float((last_prompt_row(ids) - last_prompt_row(longer)).abs().max())
        limit, quant.ROWWISE_MAX_QUERIES = quant.ROWWISE_MAX_QUERIES, len(longer)
        try:
            rowwise_diff = float((last_prompt_row(ids) - last_prompt_row(longer)).abs().max())
        finally:
            quant.ROWWISE_MAX_QUERIES = limit
        print(
            f"\n3. the prompt ({len(ids)} tokens) prefilled alone and with hf-assist's first {first} candidates: "
            f"the last prompt row's logits differ by {sdpa:g} with SDPA for the long forward, by {rowwise_diff:g} "
            f"with the row-wise attention for every query count"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
