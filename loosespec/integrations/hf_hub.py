"""loosespec's transformers ``custom_generate`` in the Hub repository layout (``make hf-custom-generate``):
``custom_generate/generate.py`` (which imports :mod:`loosespec.integrations.hf`), its ``requirements.txt`` and a
``README.md`` (the method card: what is lossy, every argument, an example), and loosespec's own wheel.

loosespec is on no package index, so the layout carries the wheel ``make dist`` built (``--wheel-dir``): the README
says to ``pip install`` that file, and ``requirements.txt``, which transformers checks against the installed
distributions when it loads the folder, names exactly its version (``loosespec==X``), with comment lines saying where
it comes from. Without a wheel, the README says how to build one from a checkout.

``python -m loosespec.integrations.hf_hub OUT [--wheel-dir DIST]`` writes it; ``model.generate(custom_generate=OUT,
trust_remote_code=True, ...)`` loads it.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

from loosespec.config import KNOBS, knob_help
from loosespec.errors import LoosespecError
from loosespec.integrations.hf import KNOB_KWARGS
from loosespec.methods import METHODS

GENERATE_PY = '''"""loosespec's speculative decoding as a transformers custom_generate method.

FLy (loose verification) and SpecGuard (step-level verification) are LOSSY: their output differs from what the
model alone would write. ar, exact and rejection are lossless. See README.md next to this folder.

The decode loop is loosespec's own, which must be installed (custom_generate/requirements.txt).
"""

from loosespec.integrations.hf import generate  # noqa: F401
'''


def hub_readme(wheel: str | None = None) -> str:
    """The Hub repository's README: what the method is, which methods are lossy, its arguments, usage. ``wheel``: the
    file name of the loosespec wheel the layout carries (None: it carries none)."""
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

This folder holds only the entry point; the decode loop is loosespec's (version {__version__}), which is on no
package index{_install(wheel, __version__)}

`custom_generate/requirements.txt` names `loosespec=={__version__}`: transformers checks that it is installed when
it loads this folder (it installs nothing itself).

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


def _install(wheel: str | None, version: str) -> str:
    """The README's installation instructions, after "which is on no package index"."""
    if wheel is not None:
        return f""": install the wheel this repository carries, `{wheel}`, beside this README (its
dependencies, torch and transformers among them, come from your package index):

```sh
pip install ./{wheel}                                                    # in a clone of this repository
pip install https://huggingface.co/<this repository>/resolve/main/{wheel}   # without one
```"""
    return f""". Build its wheel in a checkout of loosespec's repository and install that:

```sh
make dist                                            # dist/loosespec-{version}-py3-none-any.whl
pip install dist/loosespec-{version}-py3-none-any.whl   # or, in the checkout: pip install -e .
```"""


def wheel_in(directory: str | Path) -> Path:
    """The wheel of this loosespec's version in ``directory`` (what ``make dist`` leaves in ``dist/``); a
    :class:`~loosespec.errors.LoosespecError` naming what is there when there is none."""
    from loosespec import __version__

    directory = Path(directory)
    found = sorted(directory.glob(f"loosespec-{__version__}-*.whl"))
    if len(found) != 1:
        there = ", ".join(p.name for p in sorted(directory.glob("*.whl"))) or "no wheel"
        raise LoosespecError(
            f"expected one loosespec-{__version__}-*.whl in {directory} (make dist builds it), found: {there}"
        )
    return found[0]


def write_hub_layout(out: str | Path, wheel: str | Path | None = None) -> Path:
    """Write the Hub repository layout into ``out``: ``custom_generate/generate.py``, its ``requirements.txt``,
    and ``README.md``; with ``wheel`` (loosespec's, of this version: :func:`wheel_in`), a copy of it beside the
    README, which says to install it (any other loosespec wheel there is removed).
    ``model.generate(custom_generate=str(out), trust_remote_code=True, ...)`` loads it."""
    from loosespec import __version__

    out = Path(out)
    (out / "custom_generate").mkdir(parents=True, exist_ok=True)
    name = None
    if wheel is not None:
        wheel = Path(wheel)
        if not wheel.name.startswith(f"loosespec-{__version__}-") or wheel.suffix != ".whl":
            raise LoosespecError(f"{wheel} is not a wheel of loosespec {__version__}")
        name = wheel.name
        for old in out.glob("loosespec-*.whl"):
            if old.name != name:
                old.unlink()
        shutil.copyfile(wheel, out / name)
    (out / "custom_generate" / "generate.py").write_text(GENERATE_PY, encoding="utf-8")
    where = f"the wheel beside README.md ({name})" if name else "a wheel built from its repository (make dist)"
    (out / "custom_generate" / "requirements.txt").write_text(
        f"# loosespec is on no package index: pip install {where}.\n"
        "# transformers checks the line below against the installed distributions when it loads this folder.\n"
        f"loosespec=={__version__}\n",
        encoding="utf-8",
    )
    (out / "README.md").write_text(hub_readme(name), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m loosespec.integrations.hf_hub",
        description="Write loosespec's transformers custom_generate in the Hub layout.",
    )
    p.add_argument("out", help="directory to write (custom_generate/generate.py, requirements.txt, README.md)")
    p.add_argument(
        "--wheel-dir", help="a folder holding loosespec's wheel of this version (make dist: dist), copied in"
    )
    args = p.parse_args(argv)
    try:
        out = write_hub_layout(args.out, wheel_in(args.wheel_dir) if args.wheel_dir else None)
    except LoosespecError as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    print(f"wrote {out}: model.generate(..., custom_generate={str(out)!r}, trust_remote_code=True)")


if __name__ == "__main__":
    main()
