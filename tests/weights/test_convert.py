"""GGUF -> safetensors conversion: what the ready marker records, and the progress bars (a tiny Llama written as a
GGUF here)."""

import hashlib
import json
import re
from pathlib import Path

import pytest
from fakes.fake_weights import FakeConverter

from loosespec import models
from loosespec.weights.convert import READY_MARKER, convert_gguf


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOSESPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def write_tiny_gguf(path: Path, layers: int = 2) -> Path:
    """tests/conftest.py's tiny Llama as a float32 GGUF (as llama.cpp names the tensors), with its byte-level
    tokenizer."""
    import gguf
    from conftest import make_tiny_model, make_tiny_tokenizer

    model, tok = make_tiny_model(0, layers), make_tiny_tokenizer()
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    vocab = tok.get_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_token_list(sorted(vocab, key=vocab.get))
    w.add_token_types([3, 3, 3] + [1] * (len(vocab) - 3))  # <s> </s> <pad> are control tokens
    w.add_token_scores([0.0] * len(vocab))  # no merges: transformers derives them (none) from the scores
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_pad_token_id(2)
    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    per_layer = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(layers):
        names.update({f"model.layers.{i}.{k}": f"blk.{i}.{v}" for k, v in per_layer.items()})
    for name, t in model.state_dict().items():
        if name.endswith(".weight"):
            w.add_tensor(names[name.removesuffix(".weight")] + ".weight", t.detach().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _bar_totals(err: str, desc: str) -> set[int]:
    """The totals (``n/TOTAL``) a tqdm bar named ``desc`` printed on stderr."""
    return {
        int(m) for line in re.split(r"[\r\n]", err) if line.startswith(desc) for m in re.findall(r"\d+/(\d+)", line)
    }


def test_conversion_bars_count_the_tensors_and_show_only_with_progress(tmp_path, capsys):
    from gguf import GGUFReader

    gguf_file = write_tiny_gguf(tmp_path / "tiny.gguf")
    tensors = len(GGUFReader(gguf_file).tensors)
    assert tensors == 2 * 9 + 3  # nine per layer, the embedding, the final norm and the head
    capsys.readouterr()
    quiet = convert_gguf(gguf_file, tmp_path / "quiet", {}, progress=False)
    err = capsys.readouterr().err
    assert not re.search(r"\d+/\d+", err), f"a bar without progress: {err}"
    assert (quiet / READY_MARKER).is_file()

    shown = convert_gguf(gguf_file, tmp_path / "shown", {}, progress=True, name="tiny")
    err = capsys.readouterr().err
    assert _bar_totals(err, "convert tiny: dequantize") == {tensors}, err
    assert _bar_totals(err, "convert tiny: load") == {tensors}, err  # every tensor is one weight of the model
    assert _bar_totals(err, "convert tiny: write") == {1}, err  # one safetensors file
    bars = {line.split(":")[0] for line in re.split(r"[\r\n]", err) if re.search(r"\d+/\d+", line)}
    assert bars == {"convert tiny"}, f"bars that are not loosespec's: {bars}"
    loaded = models.load(str(shown), dtype="float32", device="cpu", progress=False)
    assert sum(1 for _ in loaded.model.named_parameters()) == tensors


def test_a_gguf_file_conversion_records_its_sha256(tmp_path, cache, monkeypatch):
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF" + b"x" * 100)
    FakeConverter(monkeypatch)
    src = models.resolve(str(gguf), progress=False)
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    marker = json.loads((Path(src.path) / READY_MARKER).read_text())
    assert marker["gguf_sha256"] == sha
    assert src.provenance()["gguf_sha256"] == sha
