"""loosespec as transformers' ``custom_generate`` (loosespec.integrations.hf): the callable and the Hub layout give
what ``model.generate`` gives for the lossless methods, honour the generation config, and refuse what they cannot
honour with one line naming the argument."""

from __future__ import annotations

import inspect
import math
import re
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, TextStreamer
from transformers.generation.utils import GenerateDecoderOnlyOutput

from loosespec.config import KNOBS
from loosespec.integrations import hf
from loosespec.integrations.hf import FROM_GENERATION_CONFIG, KNOB_KWARGS, GenerateArgumentError
from loosespec.integrations.hf import generate as loosespec_generate
from loosespec.integrations.hf_hub import hub_readme, write_hub_layout

ROOT = Path(__file__).resolve().parents[2]
CLOSED = math.log(3) + 0.01  # above the largest top-3 entropy: FLy never defers a mismatch (its gate is closed)
FIXED = dict(adaptive_draft_length=False)  # K every round: the draft is used whatever the cost curves say
PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    """The tiny random target, its noisy copy as the draft, loaded as a user would (tokenizer in the directory)."""
    load = lambda name: AutoModelForCausalLM.from_pretrained(tiny_dir / name, dtype=torch.float32).eval()  # noqa: E731
    tok = AutoTokenizer.from_pretrained(tiny_dir / "target")
    return load("target"), load("draft"), tok, tok(PROMPT, return_tensors="pt")


class Collect(TextStreamer):
    """A TextStreamer that keeps the text it would print."""

    def __init__(self, tok):
        super().__init__(tok, skip_prompt=True, skip_special_tokens=True)
        self.text = ""

    def on_finalized_text(self, text, stream_end=False):
        self.text += text


def new_tokens(out, inputs) -> list[int]:
    seq = out.sequences if isinstance(out, GenerateDecoderOnlyOutput) else out
    return seq[0, inputs["input_ids"].shape[1] :].tolist()


# ---------------------------------------------------------------------------------------------
# tiny random model
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter,assist", [(None, False), ("ngram", False), (None, True), ("model", True)])
def test_exact_equals_generate_tiny(tiny, drafter, assist):
    model, draft, _, inputs = tiny
    ref = model.generate(**inputs, do_sample=False, max_new_tokens=40)
    kw = dict(assistant_model=draft) if assist else {}
    if drafter:
        kw["drafter"] = drafter
    out = model.generate(
        **inputs,
        custom_generate=loosespec_generate,
        method="exact",
        max_new_tokens=40,
        return_dict_in_generate=True,
        **FIXED,
        **kw,
    )
    assert torch.equal(out.sequences, ref)
    assert out.decode_config["drafter"] == (drafter or ("mla" if assist else "ngram"))
    assert out.stats["drafted_tokens"] > 0 and out.stats["new_tokens"] == 40
    if assist:  # the assistant reached the loop: transformers does not pass it, loosespec reads it from generate
        assert out.stats["draft_forwards"] > 0


def test_default_settings_equal_generate_tiny(tiny):
    """No method, no knob: exact with the cost-aware draft length, as loosespec's own default."""
    model, draft, _, inputs = tiny
    ref = model.generate(**inputs, do_sample=False, max_new_tokens=24)
    out = model.generate(
        **inputs,
        custom_generate=loosespec_generate,
        assistant_model=draft,
        max_new_tokens=24,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, ref)
    assert out.decode_config["method"] == "exact" and out.decode_config["adaptive_draft_length"] is True


@pytest.mark.parametrize("assist", [False, True])
def test_fly_closed_gate_equals_exact_tiny(tiny, assist):
    model, draft, _, inputs = tiny
    kw = dict(assistant_model=draft) if assist else {}
    exact = model.generate(
        **inputs,
        custom_generate=loosespec_generate,
        method="exact",
        num_draft_tokens=15,
        max_new_tokens=40,
        **FIXED,
        **kw,
    )
    fly = model.generate(
        **inputs,
        custom_generate=loosespec_generate,
        method="fly",
        fly_entropy_threshold=CLOSED,
        max_new_tokens=40,
        return_dict_in_generate=True,
        **FIXED,
        **kw,
    )
    assert torch.equal(fly.sequences, exact)
    assert fly.stats["fly_deferred"] == 0 and fly.stats["fly_hard_rejects"] > 0
    assert fly.decode_config["lossy"] is True and fly.decode_config["method"] == "fly"


def test_open_gate_is_lossy_and_accepts_more_tiny(tiny):
    model, draft, _, inputs = tiny
    kw = dict(assistant_model=draft, drafter="model", max_new_tokens=60, return_dict_in_generate=True, **FIXED)
    exact = model.generate(
        **inputs,
        custom_generate=loosespec_generate,
        method="exact",
        num_draft_tokens=15,
        draft_confidence_threshold=0.0,
        **kw,
    )
    fly = model.generate(**inputs, custom_generate=loosespec_generate, method="fly", fly_window_size=2, **kw)
    assert fly.stats["fly_deferred"] > 0
    assert fly.stats["mean_accepted_length"] > exact.stats["mean_accepted_length"]
    assert fly.decode_config["fly_window_size"] == 2 and fly.decode_config["lossy"] is True
    assert exact.decode_config["lossy"] is False


@pytest.mark.parametrize("assist", [False, True])
def test_streamer_receives_the_text_generate_streams_tiny(tiny, assist):
    model, draft, tok, inputs = tiny
    theirs, ours = Collect(tok), Collect(tok)
    model.generate(**inputs, do_sample=False, max_new_tokens=30, streamer=theirs)
    kw = dict(assistant_model=draft) if assist else {}
    out = model.generate(**inputs, custom_generate=loosespec_generate, max_new_tokens=30, streamer=ours, **FIXED, **kw)
    assert ours.text == theirs.text != ""
    assert ours.text == tok.decode(new_tokens(out, inputs), skip_special_tokens=True)


def test_return_dict_carries_the_statistics_tiny(tiny):
    model, draft, _, inputs = tiny
    out = model.generate(
        **inputs,
        custom_generate=loosespec_generate,
        assistant_model=draft,
        max_new_tokens=20,
        return_dict_in_generate=True,
        **FIXED,
    )
    assert isinstance(out, GenerateDecoderOnlyOutput) and out.sequences.shape == (1, inputs["input_ids"].shape[1] + 20)
    for key in (
        "new_tokens",
        "rounds",
        "target_forwards",
        "draft_forwards",
        "drafted_tokens",
        "accepted_tokens",
        "mean_accepted_length",
        "acceptance_rate",
        "wall_s",
    ):
        assert key in out.stats, key
    assert out.stats["new_tokens"] == 20 and out.stats["rounds"] < 20
    assert out.finish_reason == "length" and out.decode_config["num_draft_tokens"] == 15
    assert out["stats"] is out.stats  # a ModelOutput field, like sequences
    plain = model.generate(
        **inputs, custom_generate=loosespec_generate, assistant_model=draft, max_new_tokens=20, **FIXED
    )
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, out.sequences)


def test_eos_token_id_ends_where_generate_ends_tiny(tiny):
    model, _, _, inputs = tiny
    free = new_tokens(model.generate(**inputs, do_sample=False, max_new_tokens=30), inputs)
    eos = free[7]  # a token generate emits: with it as the end token, generation stops there
    ref = model.generate(**inputs, do_sample=False, max_new_tokens=30, eos_token_id=eos)
    out = model.generate(
        **inputs, custom_generate=loosespec_generate, max_new_tokens=30, eos_token_id=eos, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, ref) and out.sequences[0, -1].item() == eos
    assert out.finish_reason == "stop" and out.stats["new_tokens"] == free.index(eos) + 1


def test_max_length_and_generation_config_object_tiny(tiny):
    model, _, _, inputs = tiny
    n = inputs["input_ids"].shape[1]
    gc = GenerationConfig(max_length=n + 9, do_sample=False, eos_token_id=None)
    ref = model.generate(**inputs, generation_config=gc)
    out = model.generate(**inputs, generation_config=gc, custom_generate=loosespec_generate)
    assert torch.equal(out, ref) and out.shape[1] == n + 9


def test_left_padding_kept_like_generate_tiny(tiny):
    model, _, tok, inputs = tiny
    pad = tok.pad_token_id
    ids = torch.cat([torch.full((1, 3), pad), inputs["input_ids"]], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), inputs["attention_mask"]], dim=1)
    plain = model.generate(**inputs, custom_generate=loosespec_generate, max_new_tokens=16)
    out = model.generate(
        input_ids=ids, attention_mask=mask, custom_generate=loosespec_generate, max_new_tokens=16, pad_token_id=pad
    )
    assert out[0, :3].tolist() == [pad] * 3
    assert torch.equal(out[:, 3:], plain)


def test_sampling_honours_the_seed_and_torch_manual_seed_tiny(tiny):
    model, draft, _, inputs = tiny
    kw = dict(
        custom_generate=loosespec_generate,
        assistant_model=draft,
        do_sample=True,
        temperature=0.9,
        max_new_tokens=24,
        return_dict_in_generate=True,
    )
    a = model.generate(**inputs, seed=5, **kw)
    b = model.generate(**inputs, seed=5, **kw)
    assert torch.equal(a.sequences, b.sequences)
    assert a.decode_config["method"] == "rejection" and a.decode_config["temperature"] == 0.9
    assert a.decode_config["top_k"] == 50  # transformers' default top-k when sampling
    torch.manual_seed(11)
    c = model.generate(**inputs, **kw)
    torch.manual_seed(11)
    d = model.generate(**inputs, **kw)
    assert torch.equal(c.sequences, d.sequences) and c.decode_config["seed"] == d.decode_config["seed"]


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(num_beams=2), "num_beams=2"),
        (dict(num_return_sequences=2, do_sample=True, method="rejection"), "num_return_sequences=2"),
        (dict(batch=2), "batch size 2"),
        (dict(repetition_penalty=1.3), "repetition_penalty=1.3"),
        (dict(no_repeat_ngram_size=3), "no_repeat_ngram_size=3"),
        (dict(output_scores=True, return_dict_in_generate=True), "output_scores=True"),
        (dict(stop_strings=["\n"]), "stop.strings"),  # transformers refuses it first without a tokenizer
        (dict(assistant_confidence_threshold=0.2), "assistant_confidence_threshold=0.2 is not supported.*0.4"),
        (dict(num_assistant_tokens=5), "num_assistant_tokens=5 drafts with assistant_model: pass assistant_model="),
        (dict(prompt_lookup_num_tokens=10, num_draft_tokens=6), "prompt_lookup_num_tokens=10 and num_draft_tokens=6"),
        (dict(prompt_lookup_num_tokens=10, drafter="mla"), "prompt_lookup_num_tokens=10 drafts by n-gram .*'mla'"),
        (dict(max_matching_ngram_size=100), "max_matching_ngram_size=100: as loosespec's prompt_lookup_max must be"),
        (dict(method="fly", fly_window_size=-1), "fly_window_size must be >= 0, got -1"),
        (dict(method="fly", fly_window_size=15), "need fly_window_size < num_draft_tokens"),
        (dict(method="fly", fly_entropy_threshold=0.005), "fly_entropy_threshold"),
        (dict(method="nope"), "method must be one of"),
        (dict(drafter="mla"), "drafter='mla' drafts with a draft model: pass assistant_model="),
        (dict(method="specguard"), "method='specguard'"),
        (dict(do_sample=True, method="exact"), "do_sample=True with method='exact'"),
        (dict(num_draft_tokens="many"), "num_draft_tokens .*integer"),
        (dict(fly_windowsize=3), "fly_windowsize"),  # a typo: transformers' own check names it
        (dict(max_new_tokens=0), "max_new_tokens"),
    ],
)
def test_bad_arguments_fail_before_decoding_with_one_line(tiny, kw, needle):
    model, _, _, inputs = tiny
    kw = dict(kw)
    args = dict(inputs)
    if kw.pop("batch", None):
        args = {k: v.repeat(2, 1) for k, v in inputs.items()}
    kw.setdefault("max_new_tokens", 8)
    with pytest.raises(ValueError) as e:
        model.generate(**args, custom_generate=loosespec_generate, **kw)
    msg = str(e.value)
    assert re.search(needle, msg) and "\n" not in msg, msg
    files = [f.filename for f in traceback.extract_tb(e.value.__traceback__)]
    assert not any("/loosespec/decode/" in f or "/loosespec/verify/" in f for f in files), files


def test_transformers_assisted_fields_set_the_knobs_tiny(tiny):
    """transformers' names for the draft length and the lookup's n-gram size set loosespec's knobs (and the drafter
    they draft with); left at transformers' defaults they change nothing."""
    model, draft, _, inputs = tiny

    def config(**kw):
        kw = {"max_new_tokens": 12, "return_dict_in_generate": True, **FIXED, **kw}
        return model.generate(**inputs, custom_generate=loosespec_generate, **kw).decode_config

    c = config(prompt_lookup_num_tokens=4, max_matching_ngram_size=2)
    assert (c["drafter"], c["num_draft_tokens"], c["prompt_lookup_max"]) == ("ngram", 4, 2)
    c = config(assistant_model=draft, prompt_lookup_num_tokens=4)  # prompt lookup, as transformers, with an assistant
    assert (c["drafter"], c["num_draft_tokens"]) == ("ngram", 4)
    c = config(assistant_model=draft, num_assistant_tokens=6)
    assert (c["drafter"], c["num_draft_tokens"]) == ("mla", 6)
    c = config(assistant_model=draft, num_assistant_tokens=6, drafter="model", num_draft_tokens=6)
    assert (c["drafter"], c["num_draft_tokens"]) == ("model", 6)
    default = config(assistant_model=draft)
    same = config(assistant_model=draft, num_assistant_tokens=20, assistant_confidence_threshold=0.4)
    assert same == default  # transformers' defaults: not the caller's choice
    with pytest.raises(GenerateArgumentError, match="num_assistant_tokens=6 drafts with the assistant_model, "):
        config(assistant_model=draft, prompt_lookup_num_tokens=4, num_assistant_tokens=6)


def test_user_logits_processor_refused_by_name(tiny):
    from transformers import LogitsProcessorList, MinLengthLogitsProcessor

    model, _, _, inputs = tiny
    lp = LogitsProcessorList([MinLengthLogitsProcessor(5, eos_token_id=1)])
    with pytest.raises(GenerateArgumentError, match="logits_processor.*MinLengthLogitsProcessor"):
        model.generate(**inputs, custom_generate=loosespec_generate, logits_processor=lp, max_new_tokens=8)


def test_the_knobs_are_keyword_arguments_by_their_schema_names():
    """transformers forwards only declared keyword arguments: every knob not carried by the generation config is
    declared, under its schema name, and none shadows a GenerationConfig field (it would be taken from it)."""
    params = inspect.signature(loosespec_generate).parameters
    assert set(KNOB_KWARGS) <= set(params) and set(KNOB_KWARGS) | set(FROM_GENERATION_CONFIG) == set(KNOBS)
    assert {"method", "drafter", "fly_window_size", "fly_entropy_threshold", "seed", "sg_tau"} <= set(KNOB_KWARGS)
    fields = set(GenerationConfig().to_dict()) | set(vars(GenerationConfig()))
    assert not set(KNOB_KWARGS) & fields


def test_module_says_fly_and_specguard_are_lossy():
    doc = hf.__doc__ + hf.generate.__doc__ + hub_readme()
    assert "LOSSY" in hf.__doc__ and "``fly``" in hf.__doc__ and "``specguard``" in hf.__doc__
    assert "| `fly` | **LOSSY** |" in doc and "| `specguard` | **LOSSY** |" in doc and "| `exact` | lossless |" in doc


# ---------------------------------------------------------------------------------------------
# the Hub layout
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory):
    """What `make hf-custom-generate` writes (the command it runs), into a fresh directory."""
    out = tmp_path_factory.mktemp("hub") / "hf_custom_generate"
    p = subprocess.run(
        [sys.executable, "-m", "loosespec.integrations.hf_hub", str(out)],  # the interpreter under test
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    return out


def test_make_target_writes_the_hub_layout():
    p = subprocess.run(
        ["make", "-n", "hf-custom-generate", "HF_CUSTOM_GENERATE_DIR=/x/y"], capture_output=True, text=True, cwd=ROOT
    )
    assert p.returncode == 0, p.stderr
    assert ".venv/bin/python -m loosespec.integrations.hf_hub /x/y" in p.stdout
    phony = next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith(".PHONY:"))
    assert "hf-custom-generate" in phony.split()


def test_hub_layout_files(hub_dir):
    assert sorted(str(p.relative_to(hub_dir)) for p in hub_dir.rglob("*") if p.is_file()) == [
        "README.md",
        "custom_generate/generate.py",
        "custom_generate/requirements.txt",
    ]
    readme = (hub_dir / "README.md").read_text()
    assert "custom_generate" in readme.split("---")[1]  # the Hub's tag for custom generation methods
    assert "**`fly` and `specguard` are LOSSY**" in readme and "pip install" in readme
    assert "fly_window_size" in readme and "LOSSY" in (hub_dir / "custom_generate/generate.py").read_text()
    from loosespec import __version__

    # no index serves loosespec: the requirement is this version exactly, the comments say to build its wheel
    requirements = (hub_dir / "custom_generate/requirements.txt").read_text()
    assert requirements.endswith(f"\nloosespec=={__version__}\n") and "make dist" in requirements
    assert "make dist" in readme and "pip install loosespec " not in readme


@pytest.mark.parametrize("method", ["exact", "fly"])
def test_hub_layout_loads_and_equals_the_callable(tiny, hub_dir, method):
    model, draft, tok, inputs = tiny
    kw = dict(assistant_model=draft, method=method, max_new_tokens=30, return_dict_in_generate=True, **FIXED)
    ours = model.generate(**inputs, custom_generate=loosespec_generate, **kw)
    streamer = Collect(tok)
    loaded = model.generate(
        **inputs, custom_generate=str(hub_dir), trust_remote_code=True, streamer=streamer, tokenizer=tok, **kw
    )
    assert torch.equal(loaded.sequences, ours.sequences)
    assert loaded.stats["draft_forwards"] > 0 and loaded.decode_config["lossy"] is (method == "fly")
    assert streamer.text == tok.decode(new_tokens(loaded, inputs), skip_special_tokens=True)
    if method == "exact":
        assert torch.equal(loaded.sequences, model.generate(**inputs, do_sample=False, max_new_tokens=30))


def test_hub_layout_needs_trust_remote_code(tiny, hub_dir):
    model, _, _, inputs = tiny
    with pytest.raises(ValueError, match="trust_remote_code"):
        model.generate(**inputs, custom_generate=str(hub_dir), max_new_tokens=4)


def test_hub_layout_refuses_bad_arguments_too(tiny, hub_dir):
    model, _, _, inputs = tiny
    with pytest.raises(GenerateArgumentError, match="num_beams=3"):
        model.generate(**inputs, custom_generate=str(hub_dir), trust_remote_code=True, num_beams=3, max_new_tokens=4)


# ---------------------------------------------------------------------------------------------
# SmolLM2-135M, float32
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol():
    from loosespec.models import resolve

    path = resolve("smollm2-135m-instruct", progress=False).path
    load = lambda: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # noqa: E731
    tok = AutoTokenizer.from_pretrained(path)
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that reverses a list."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    return load(), load(), tok, inputs


@pytest.mark.real_model
# prompt lookup (no assistant) on SmolLM2: make test-full; make test checks both on the tiny pair (above)
@pytest.mark.parametrize("assist", [pytest.param(False, marks=pytest.mark.slow), True])
def test_exact_and_closed_fly_equal_generate_smollm(smol, assist):
    model, draft, tok, inputs = smol
    theirs = Collect(tok)
    ref = model.generate(**inputs, do_sample=False, max_new_tokens=24, streamer=theirs)
    kw = dict(assistant_model=draft) if assist else {}
    ours = Collect(tok)
    exact = model.generate(
        **inputs,
        custom_generate=loosespec_generate,
        method="exact",
        num_draft_tokens=15,
        max_new_tokens=24,
        streamer=ours,
        return_dict_in_generate=True,
        **FIXED,
        **kw,
    )
    assert torch.equal(exact.sequences, ref)
    assert ours.text == theirs.text != ""
    assert exact.stats["accepted_tokens"] > 0 and (exact.stats["draft_forwards"] > 0) is assist
    fly = model.generate(
        **inputs,
        custom_generate=loosespec_generate,
        method="fly",
        fly_entropy_threshold=CLOSED,
        max_new_tokens=24,
        return_dict_in_generate=True,
        **FIXED,
        **kw,
    )
    assert torch.equal(fly.sequences, ref) and fly.decode_config["lossy"] is True


def readme_snippet() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## From transformers\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run_readme_snippet(tmp_path, monkeypatch, snippet: str, capsys) -> str:
    write_hub_layout(tmp_path / "build" / "hf_custom_generate")  # what `make hf-custom-generate` leaves there
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "README.md", "exec"), {"__name__": "__readme__"})
    return capsys.readouterr().out


@pytest.mark.real_model
def test_readme_snippet_runs_as_written(tmp_path, monkeypatch, capsys):
    snippet = readme_snippet()
    assert 'resolve("smollm2-135m-instruct")' in snippet and "custom_generate=loosespec_generate" in snippet
    assert 'custom_generate="build/hf_custom_generate", trust_remote_code=True' in snippet
    out = run_readme_snippet(tmp_path, monkeypatch, snippet, capsys)
    assert "def " in out and " True\n" in out  # code came out, and the FLy run is labeled lossy


@pytest.mark.default_pair
def test_readme_snippet_on_the_default_pair(tmp_path, monkeypatch, capsys):
    snippet = readme_snippet()
    snippet = snippet.replace(
        'target_dir = resolve("smollm2-135m-instruct")', 'target_dir = resolve("qwen2.5-coder-1.5b-instruct")', 1
    )
    snippet = snippet.replace(
        'draft_dir = resolve("smollm2-135m-instruct")', 'draft_dir = resolve("qwen2.5-coder-0.5b-instruct")', 1
    )
    assert "qwen2.5-coder-1.5b-instruct" in snippet and "qwen2.5-coder-0.5b-instruct" in snippet
    out = run_readme_snippet(tmp_path, monkeypatch, snippet, capsys)
    assert "def " in out and " True\n" in out
