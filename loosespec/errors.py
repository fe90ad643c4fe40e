"""The one exception type users see: a clear, one-line reason a request cannot be served."""


class LoosespecError(Exception):
    """Bad input or an unmet precondition (unknown model, mismatched tokenizers, bad config).

    The CLI prints its message on one line and exits non-zero; the library raises it instead of
    letting a deep traceback from torch or transformers reach the user.
    """


class NonFiniteLogits(LoosespecError):
    """A model produced NaN or infinite logits (float16 overflow, broken weights): sampling would fail and greedy
    choices would mean nothing, so generation stops with this instead."""


def describe_validation_error(errors: list[dict], value) -> str:
    """pydantic's first error of a value, as the end of a sentence that names the field ("must be >= 1, got 0")."""
    e = errors[0]
    ctx = e.get("ctx") or {}
    kind = e["type"]
    words = {
        "greater_than_equal": "must be >= {ge}",
        "greater_than": "must be > {gt}",
        "less_than_equal": "must be <= {le}",
        "less_than": "must be < {lt}",
        "string_too_short": "must be at least {min_length} character(s) long",
        "string_too_long": "must be at most {max_length} characters long",
        "literal_error": "must be one of: {expected}",
        "int_type": "must be an integer",
        "int_from_float": "must be an integer",
        "bool_type": "must be true or false",
        "float_type": "must be a number",
        "string_type": "must be a string",
        "finite_number": "must be a finite number",
    }
    if kind in words:
        try:
            text = words[kind].format(**ctx)
        except (KeyError, IndexError):
            text = e["msg"]
    else:
        text = e["msg"][0].lower() + e["msg"][1:]
    return f"{text}, got {value!r}"
