"""loosespec inside other engines."""
