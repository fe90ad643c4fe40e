"""The one exception type users see: a clear, one-line reason a request cannot be served."""


class LoosespecError(Exception):
    """Bad input or an unmet precondition (unknown model, mismatched tokenizers, bad config).

    The CLI prints its message on one line and exits non-zero; the library raises it instead of
    letting a deep traceback from torch or transformers reach the user.
    """
