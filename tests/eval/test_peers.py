"""llama.cpp peer methods: names, GGUF resolution and clear errors (llama-cpp-python itself is optional)."""

import sys

import pytest

from loosespec.eval import harness as bench
from loosespec.errors import LoosespecError
from loosespec.eval.peers.llamacpp import LlamaCppPeer, gguf_file


def test_llamacpp_methods_are_bench_methods():
    assert bench.parse_methods("ar,llamacpp-ar,llamacpp-pld") == ["ar", "llamacpp-ar", "llamacpp-pld"]
    assert bench.method_config("llamacpp-pld", max_new_tokens=8, temperature=0.0, seed=0, has_draft=False) is None
    assert not bench.is_lossy("llamacpp-pld") and not bench.needs_draft_model("llamacpp-ar")


def test_gguf_file_needs_a_gguf_target(tmp_path):
    with pytest.raises(LoosespecError, match="neither an embedded model nor a .gguf file"):
        gguf_file("Qwen/Qwen2.5-0.5B")
    with pytest.raises(LoosespecError, match="not found"):
        gguf_file(str(tmp_path / "missing.gguf"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert gguf_file(str(f)) == f


def test_missing_llama_cpp_python_is_a_clear_error(tmp_path, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    with pytest.raises(LoosespecError, match="make peers"):
        LlamaCppPeer(str(f), 2).model("llamacpp-ar", 100)
