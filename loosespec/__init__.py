"""loosespec: loose speculative decoding (FLy, SpecGuard) with lossless baselines, measured.

Library entry points::

    from loosespec import Engine, DecodeConfig
    engine = Engine.load()  # default Qwen2.5-Coder 1.5B target, 0.5B draft
    result = engine.generate("Write quicksort in Python.", DecodeConfig.create("exact", has_draft_model=True))
    print(result.text, result.stats.to_dict())
"""

__version__ = "0.1.0"

from .config import DecodeConfig  # noqa: E402
from .engine import Engine, GenerationResult  # noqa: E402
from .errors import LoosespecError  # noqa: E402

__all__ = ["Engine", "DecodeConfig", "GenerationResult", "LoosespecError", "__version__"]
