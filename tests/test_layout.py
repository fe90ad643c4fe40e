"""The package layout's one rule: the core (decode/, verify/, drafters/ and the modules they build on) imports
nothing from the front ends (serve/, eval/, integrations/, the CLI)."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "loosespec"
CORE = ["decode", "verify", "drafters", "config.py", "methods.py", "models.py", "cost.py", "quant.py", "hardware.py",
        "errors.py"]
FRONT = ("loosespec.serve", "loosespec.eval", "loosespec.integrations", "loosespec.cli")


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_core_imports_no_front_end():
    files = [p for c in CORE for p in ((PKG / c).rglob("*.py") if (PKG / c).is_dir() else [PKG / c])]
    assert len(files) > 15
    bad = {str(p.relative_to(PKG)): sorted(m for m in imports(p) if m.startswith(FRONT)) for p in files}
    assert not {k: v for k, v in bad.items() if v}


def test_no_relative_imports_left():
    """Absolute imports, so that a module can move between packages with one rename."""
    for p in PKG.rglob("*.py"):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level], p


def test_the_library_entry_points_resolve():
    """`from loosespec import Engine` (README's first library line) goes through a lazy table of module names."""
    import loosespec

    for name in loosespec.__all__:
        assert getattr(loosespec, name) is not None, name
