"""llama.cpp peer methods: names, GGUF resolution and clear errors (llama-cpp-python itself is optional)."""

import sys

import pytest

from loosespec.errors import LoosespecError
from loosespec.eval import bench_methods as bench
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


FAKE_SERVER = r'''#!{python}
"""A stand-in for llama-server: the flags it was given, /health, and a greedy /completion that echoes the prompt."""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
if "--fail" in open({flagfile!r}).read():
    print("error: unknown argument --spec-type", flush=True)
    sys.exit(1)
port = int(args[args.index("--port") + 1])
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply({{"status": "ok"}})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["temperature"] == 0 and body["cache_prompt"] is False and body["return_tokens"] is True
        toks = (body["prompt"] * 10)[: body["n_predict"]]
        self.reply({{"tokens": toks, "content": "", "timings": {{"draft_n": 6, "draft_n_accepted": 4, "args": args}}}})
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def fake_server(tmp_path, monkeypatch):
    flag = tmp_path / "flag"
    flag.write_text("")
    exe = tmp_path / "llama-server"
    exe.write_text(FAKE_SERVER.format(python=sys.executable, flagfile=str(flag)))
    exe.chmod(0o755)
    monkeypatch.setenv("LOOSESPEC_LLAMA_SERVER", str(exe))
    for name in ("t.gguf", "d.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    return tmp_path, flag


def test_llamacpp_spec_runs_llama_server_with_the_draft(fake_server):
    from loosespec.eval.peers.llamacpp import LlamaServerPeer

    d, _ = fake_server
    assert bench.needs_draft_model("llamacpp-spec") and not bench.is_lossy("llamacpp-spec")
    peer = LlamaServerPeer(str(d / "t.gguf"), str(d / "d.gguf"), threads=2)
    try:
        new, wall, timings = peer.generate([5, 6, 7], 8, stop_ids={7})
        assert new == [5, 6, 7] and wall > 0  # cut after our end token, which llama.cpp may not know
        args = timings["args"]
        assert args[args.index("-md") + 1] == str(d / "d.gguf") and args[args.index("-m") + 1] == str(d / "t.gguf")
        assert args[args.index("--spec-type") + 1] == "draft-simple" and args[args.index("-t") + 1] == "2"
        assert (timings["draft_n"], timings["draft_n_accepted"]) == (6, 4)
    finally:
        peer.close()
    assert peer.proc is None


def test_a_server_that_dies_is_a_clear_error(fake_server):
    from loosespec.eval.peers.llamacpp import LlamaServerPeer

    d, flag = fake_server
    flag.write_text("--fail")
    with pytest.raises(LoosespecError, match="llama-server exited with code 1: error: unknown argument"):
        LlamaServerPeer(str(d / "t.gguf"), str(d / "d.gguf"), threads=2).generate([1], 4, stop_ids=set())


def test_no_llama_server_is_a_clear_error(tmp_path, monkeypatch):
    import shutil

    from loosespec.eval.peers import llamacpp

    monkeypatch.setenv("LOOSESPEC_LLAMA_SERVER", str(tmp_path / "nothing"))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(LoosespecError, match="make peers"):
        llamacpp.server_binary()
