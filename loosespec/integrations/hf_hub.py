"""loosespec's transformers ``custom_generate`` in the Hub repository layout (``make hf-custom-generate``):
``custom_generate/generate.py`` (which imports :mod:`loosespec.integrations.hf`), its ``requirements.txt`` and a
``README.md`` (the method card: what is lossy, every argument, an example).

``python -m loosespec.integrations.hf_hub OUT`` writes it; ``model.generate(custom_generate=OUT, trust_remote_code=True,
...)`` loads it.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from loosespec.config import KNOBS, knob_help
from loosespec.integrations.hf import KNOB_KWARGS
from loosespec.methods import METHODS

GENERATE_PY = '''"""loosespec's speculative decoding as a transformers custom_generate method.

FLy (loose verification) and SpecGuard (step-level verification) are LOSSY: their output differs from what the
model alone would write. ar, exact and rejection are lossless. See README.md next to this folder.

The decode loop is loosespec's own, which must be installed (custom_generate/requirements.txt).
"""

from loosespec.integrations.hf import generate  # noqa: F401
'''


def hub_readme() -> str:
    """The Hub repository's README: what the method is, which methods are lossy, its arguments, usage."""
    from loosespec import __version__

    methods = "\n".join(
        f"| `{m.name}` | {'**LOSSY**' if m.lossy else 'lossless'} | {m.summary} |" for m in METHODS.values()
    )

    def cell(text) -> str:
        return str(text).replace("\n", "\\n").replace("|", "\\|")

    knobs = "\n".join(f"| `{n}` | `{cell(_default(n))}` | {cell(knob_help(n))} |" for n in KNOB_KWARGS)
    return f"""---
library_name: transformers
tags:
- custom_generate
- speculative-decoding
---

# loosespec: loose speculative decoding (FLy, SpecGuard) for `model.generate`

## Description

Speculative decoding with loosespec's decode loop on your own transformers models: a draft
(`assistant_model`, or n-gram prompt lookup without one) proposes tokens, the model verifies them in
one forward. Besides the lossless rules it has two loose ones that accept more of the draft:

| method | label | what it does |
| --- | --- | --- |
{methods}

**`fly` and `specguard` are LOSSY**: they keep draft tokens (or whole steps) the model would not
have chosen, so their output differs from the model's own. Measure accuracy on your task before relying
on their speedup. `exact` returns exactly what `model.generate(do_sample=False)` returns.

## Installation

This folder holds only the entry point; the decode loop is loosespec's (version {__version__}):

```sh
pip install loosespec        # or, in a checkout of its repository: pip install -e .
```

`custom_generate/requirements.txt` lists it; transformers checks it when loading this folder.

## Base model and compatibility

Any causal (decoder-only) language model of transformers 5.2x, on any device. A draft with another
tokenizer works too (loosespec carries the proposal as text); loosespec loads each model's tokenizer
from its `name_or_path`, or takes `tokenizer=` and `assistant_tokenizer=` here.

## Additional arguments

Every loosespec knob, under its own name (`method` defaults to `rejection` with `do_sample=True`; `drafter`
to `mla` with an `assistant_model`, `ngram` without):

| argument | default | meaning |
| --- | --- | --- |
{knobs}

From the generation config: `max_new_tokens`, `do_sample`, `temperature`, `top_p`, `top_k`,
`eos_token_id`, `pad_token_id`, `streamer`, `return_dict_in_generate`. Refused with an error naming the
argument: a batch of several prompts, beams, `num_return_sequences` > 1, logits processors
(`repetition_penalty`, ...), `output_scores`, `stop_strings`.

## Output type

A tensor of prompt and new tokens, as `generate` returns; with `return_dict_in_generate=True` a
`GenerateDecoderOnlyOutput` whose extra fields `stats` (rounds, drafted and accepted tokens, mean
accepted length, forwards, wall time, the method's counters), `decode_config` (every knob, `lossy`
among them) and `finish_reason` describe the run.

## Example usage

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tok = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-Coder-1.5B-Instruct")
model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-Coder-1.5B-Instruct")
draft = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-Coder-0.5B-Instruct")
inputs = tok.apply_chat_template([{{"role": "user", "content": "Write quicksort in Python."}}],
                                 add_generation_prompt=True, return_tensors="pt", return_dict=True)
out = model.generate(**inputs, custom_generate="<this folder or Hub repository>", trust_remote_code=True,
                     assistant_model=draft, method="fly", max_new_tokens=128,   # fly is LOSSY
                     return_dict_in_generate=True)
print(tok.decode(out.sequences[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
print(out.stats)
```
"""


def _default(name: str):
    f = KNOBS[name]
    if name == "method":
        return "exact"
    if f.metadata["knob"].auto:
        return "auto"
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def write_hub_layout(out: str | Path) -> Path:
    """Write the Hub repository layout into ``out``: ``custom_generate/generate.py``, its ``requirements.txt``,
    and ``README.md``. ``model.generate(custom_generate=str(out), trust_remote_code=True, ...)`` loads it."""
    from loosespec import __version__

    out = Path(out)
    (out / "custom_generate").mkdir(parents=True, exist_ok=True)
    (out / "custom_generate" / "generate.py").write_text(GENERATE_PY, encoding="utf-8")
    (out / "custom_generate" / "requirements.txt").write_text(f"loosespec>={__version__}\n", encoding="utf-8")
    (out / "README.md").write_text(hub_readme(), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m loosespec.integrations.hf_hub",
        description="Write loosespec's transformers custom_generate in the Hub layout.",
    )
    p.add_argument("out", help="directory to write (custom_generate/generate.py, requirements.txt, README.md)")
    out = write_hub_layout(p.parse_args(argv).out)
    print(f"wrote {out}: model.generate(..., custom_generate={str(out)!r}, trust_remote_code=True)")


if __name__ == "__main__":
    main()
