"""The one exception type users see: a clear, one-line reason a request cannot be served."""


class LoosespecError(Exception):
    """Bad input or an unmet precondition (unknown model, mismatched tokenizers, bad config).

    The CLI prints its message on one line and exits non-zero; the library raises it instead of
    letting a deep traceback from torch or transformers reach the user.
    """


class NonFiniteLogits(LoosespecError):
    """A model produced NaN or infinite logits (float16 overflow, broken weights): sampling would fail and greedy
    choices would mean nothing, so generation stops with this instead."""
