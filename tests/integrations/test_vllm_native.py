"""Native FLy detection (loosespec.integrations.vllm.native) and the plugin's refusal to patch a vLLM that has FLy
itself, without vLLM: stand-in SpeculativeConfig classes, stand-in vLLM environments (tests/fakes/fake_vllm.py)
and stand-in vLLM modules."""

from __future__ import annotations

import dataclasses
import logging
import sys
import types
from typing import Literal, Optional

import pytest
import torch
from fakes.fake_vllm import write_env

from loosespec.integrations.vllm import native as N


@dataclasses.dataclass
class Older:  # vLLM 0.32: rejection_sample_method exists, FLy does not
    num_speculative_tokens: Optional[int] = None
    rejection_sample_method: Literal["standard", "synthetic", "block"] = "standard"


@dataclasses.dataclass
class WithFly(Older):  # vLLM 0.33+
    rejection_sample_method: Literal["standard", "synthetic", "block", "fly"] = "standard"
    fly_window_size: Optional[int] = None
    fly_entropy_threshold: float = 0.3
    fly_entropy_top_k: int = 3


@dataclasses.dataclass
class FieldsWithoutTheMethod(Older):  # fields, but "fly" not among the methods: not native
    fly_window_size: Optional[int] = None
    fly_entropy_threshold: float = 0.3
    fly_entropy_top_k: int = 3


def test_the_fields_decide():
    for cls, native in ((Older, False), (WithFly, True), (FieldsWithoutTheMethod, False)):
        fields, methods = N.config_fields(cls), N.rejection_sample_methods(cls)
        assert N.fly_is_native(fields, methods) is native, cls
    assert N.rejection_sample_methods(WithFly) == ["standard", "synthetic", "block", "fly"]
    # a pydantic model (vLLM's config is a pydantic dataclass, which dataclasses.fields reads) works the same
    pydantic = pytest.importorskip("pydantic")

    class Model(pydantic.BaseModel):
        rejection_sample_method: Literal["standard", "fly"] = "standard"
        fly_window_size: Optional[int] = None
        fly_entropy_threshold: float = 0.3
        fly_entropy_top_k: int = 3

    assert N.fly_is_native(N.config_fields(Model), N.rejection_sample_methods(Model))

    @pydantic.dataclasses.dataclass
    class PydanticDataclass:
        rejection_sample_method: Literal["standard", "synthetic", "block", "fly"] = "standard"
        fly_window_size: Optional[int] = None
        fly_entropy_threshold: float = 0.3
        fly_entropy_top_k: int = 3

    assert N.fly_is_native(N.config_fields(PydanticDataclass), N.rejection_sample_methods(PydanticDataclass))
    # fields without a readable annotation still count (the three names are FLy's alone)
    assert N.fly_is_native({"fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k"}, None)
    assert not N.fly_is_native({"fly_window_size", "fly_entropy_threshold"}, None)


@pytest.mark.parametrize("style", ["dataclass", "model"])
def test_probe_asks_another_environment(tmp_path, style):
    """The probe runs in the environment of the vLLM it is given (here stand-ins: a `vllm` console script with a
    `python` beside it), reading fields, never the version: a 9.9.9 without the fields is not native, a 0.0.1
    with them is."""
    if style == "model":
        pytest.importorskip("pydantic")
    found = N.probe(write_env(tmp_path / "a", native=True, style=style, version="0.0.1"))
    assert found.native and found.usable and found.version == "0.0.1" and "fly_entropy_top_k" in found.reason
    assert "'fly'" in found.reason
    found = N.probe(write_env(tmp_path / "b", native=False, style=style, version="9.9.9"))
    assert not found.native and "none of fly_window_size" in found.reason
    python = str(tmp_path / "a" / "bin" / "python")
    assert N.probe(python).native  # the Python itself may be given (.venv-vllm/bin/python)
    cpu = N.probe(write_env(tmp_path / "c", native=True, cpu=True))
    assert cpu.native and cpu.cpu and not cpu.usable


def test_probe_of_something_that_is_not_vllm(tmp_path):
    assert not N.probe(str(tmp_path / "absent" / "vllm")).native
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    found = N.probe(str(exe))
    assert not found.native and "no Python found" in found.reason
    other = tmp_path / "bin2" / "vllm"  # (probe answers once per path and process)
    other.parent.mkdir()
    other.write_text("#!/bin/sh\nexit 0\n")
    (other.parent / "python").write_text(f'#!/bin/sh\nexec {sys.executable} -I "$@"\n')  # a Python without vLLM
    (other.parent / "python").chmod(0o755)
    found = N.probe(str(other))
    assert not found.native and "cannot import" in found.reason
    with pytest.raises(ValueError, match="LOOSESPEC_VLLM_FLY_PATH"):
        N.requested_path("sometimes")
    assert N.requested_path(None, {"LOOSESPEC_VLLM_FLY_PATH": "Plugin"}) == "plugin"
    assert N.requested_path(None, {}) == "auto"


def test_vllm_python_reads_the_console_scripts_interpreter(tmp_path):
    exe = tmp_path / "vllm"
    exe.write_text(f"#!{sys.executable}\nimport sys\n")
    assert N.vllm_python(str(exe)) == sys.executable
    exe.write_text("#!/usr/bin/env python3\n")
    assert N.vllm_python(str(exe)) is not None


@pytest.fixture
def stand_in_vllm(monkeypatch):
    """vllm.v1.sample.rejection_sampler as the plugin touches it, and a vllm.config.speculative whose
    SpeculativeConfig the test chooses (``set_config``)."""
    rs = types.ModuleType("vllm.v1.sample.rejection_sampler")
    rs.GREEDY_TEMPERATURE = 0
    rs.rejection_sample = lambda *a, **k: "vllm's own"
    rs.apply_sampling_constraints = lambda logits, cu, md: logits
    rs.generate_uniform_probs = lambda n, num, gens, device: torch.full((n,), 0.5)
    for name in ("vllm", "vllm.v1", "vllm.v1.sample", "vllm.config"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.sample.rejection_sampler", rs)
    spec = types.ModuleType("vllm.config.speculative")
    monkeypatch.setitem(sys.modules, "vllm.config.speculative", spec)

    def set_config(cls):
        spec.SpeculativeConfig = cls

    rs.set_config = set_config
    return rs


def test_plugin_refuses_to_patch_a_vllm_with_native_fly(stand_in_vllm, monkeypatch, caplog):
    from loosespec.integrations.vllm import plugin

    monkeypatch.setenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", "fly")
    monkeypatch.setenv("LOOSESPEC_FLY_WINDOW_SIZE", "5")
    monkeypatch.delenv("LOOSESPEC_VLLM_FLY_PATH", raising=False)
    stand_in_vllm.set_config(WithFly)
    with caplog.at_level(logging.WARNING, logger="loosespec.integrations.vllm"):
        plugin.register()
    assert stand_in_vllm.rejection_sample() == "vllm's own"  # not patched
    line = " ".join(r.getMessage() for r in caplog.records)
    assert "has FLy natively" in line and '"rejection_sample_method": "fly"' in line
    assert '"fly_window_size": 5' in line and "LOOSESPEC_VLLM_FLY_PATH=plugin" in line


def test_plugin_patches_where_vllm_has_no_fly_or_when_insisted_on(stand_in_vllm, monkeypatch):
    from loosespec.integrations.vllm import plugin

    monkeypatch.setenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", "fly")
    monkeypatch.delenv("LOOSESPEC_VLLM_FLY_PATH", raising=False)
    stand_in_vllm.set_config(Older)
    plugin.register()
    assert getattr(stand_in_vllm.rejection_sample, "_loosespec", False)  # today's path, unchanged
    stand_in_vllm.rejection_sample = lambda *a, **k: "vllm's own"
    stand_in_vllm.set_config(WithFly)
    monkeypatch.setenv("LOOSESPEC_VLLM_FLY_PATH", "plugin")
    plugin.register()
    assert getattr(stand_in_vllm.rejection_sample, "_loosespec", False)


def test_plugin_without_fly_asked_for_says_nothing(stand_in_vllm, monkeypatch, caplog):
    from loosespec.integrations.vllm import plugin

    monkeypatch.delenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", raising=False)
    stand_in_vllm.set_config(WithFly)
    with caplog.at_level(logging.INFO, logger="loosespec.integrations.vllm"):
        plugin.register()
    assert stand_in_vllm.rejection_sample() == "vllm's own" and not caplog.records


def test_native_fly_config_reads_back_through_the_one_table():
    """What native_fly_config asks of vLLM is what vLLM's spelling reads back as (loosespec.speculative_config)."""
    from loosespec.speculative_config import from_vllm

    values = {"fly_window_size": 4, "fly_entropy_threshold": 0.6, "fly_entropy_top_k": 2}
    cfg = N.native_fly_config({**values, "fly_boundary": "window", "fly_sampling": "rejection"}, 8)
    assert from_vllm({**cfg, "num_speculative_tokens": 8}).knobs == {"method": "fly", "num_draft_tokens": 8, **values}
    assert from_vllm(N.native_fly_config({}, 8)).knobs == {"method": "fly"}
