"""loosespec: loose speculative decoding (FLy, SpecGuard) with lossless baselines, measured.

Library entry points::

    from loosespec import DecodeConfig, Engine

    engine = Engine.load()  # default Qwen2.5-Coder 1.5B target, 0.5B draft
    result = engine.generate("Write quicksort in Python.")  # exact when greedy; drafter and K from the models loaded
    print(result.text, result.stats.to_dict())
    results = engine.generate(["Sum a list.", "Reverse a string."], DecodeConfig(temperature=0.7))  # rejection
"""

__version__ = "0.1.0"

from loosespec.log import configure_on_import as _configure_logging

# the loosespec.* loggers: plain messages on stderr at $LOOSESPEC_LOGGING_LEVEL (INFO); loosespec/log.py
_configure_logging()

__all__ = ["Engine", "DecodeConfig", "GenerationResult", "LoosespecError", "__version__"]

# Imported on first use (PEP 562): the acceptance rules (loosespec.verify) and the vLLM plugin
# (loosespec.integrations.vllm) need only torch, and run inside vLLM's environment, whose transformers is older than
# the engine's.
_LAZY = {
    "DecodeConfig": "loosespec.config",
    "Engine": "loosespec.decode.engine",
    "GenerationResult": "loosespec.decode.engine",
    "LoosespecError": "loosespec.errors",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
