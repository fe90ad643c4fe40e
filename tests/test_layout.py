"""The package layout's one rule: the core (decode/, verify/, drafters/ and the modules they build on) imports
nothing from the front ends (serve/, eval/, integrations/, the CLI)."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "loosespec"
CORE = [
    "decode",
    "verify",
    "drafters",
    "weights",
    "config.py",
    "methods.py",
    "models.py",
    "loading.py",
    "cost.py",
    "quant.py",
    "hardware.py",
    "log.py",
    "errors.py",
    "extras.py",
    "speculative_config.py",
]
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


# --- method and drafter names: compared in their two registries only -------------------------------------------

# the registries: the methods (loosespec.methods) and the drafter table (loosespec/drafters/__init__.py)
NAME_TABLES = ("methods.py", "drafters/__init__.py")
# comparisons whose other side is a name of another namespace that happens to share a word, and why: (file, the
# other side's source) or ("*", a word the other side's source contains)
OTHER_NAMESPACES = {
    ("drafters/ngram.py", "search"): "prompt lookup's searches (fly | transformers | pld), named for the code each "
    "follows, not the method",
    ("integrations/vllm/rule.py", "method"): "the vLLM plugin's LOOSESPEC_REJECTION_SAMPLE_METHOD (fly | standard), "
    "vLLM's rejection sampler setting",
    ("integrations/vllm/native.py", "methods"): "the values of vLLM's own SpeculativeConfig.rejection_sample_method",
    ("*", "fly_sampling"): "FLy's sampling variants (two-sample | rejection), the fly_sampling knob's choices",
}


def _other_namespace(rel: str, source: str) -> bool:
    return (rel, source) in OTHER_NAMESPACES or any(f == "*" and word in source for f, word in OTHER_NAMESPACES)


def _registered_names() -> set[str]:
    from loosespec.drafters import DRAFTERS
    from loosespec.methods import METHODS

    return set(METHODS) | set(DRAFTERS)


def _namey(value, names: set[str]) -> bool:
    """A method or drafter name, or a bench name built of one (``fly-mla``, ``vllm-fly``, ``specguard-fly``)."""
    if not isinstance(value, str):
        return False
    parts = value.replace("@", "-").split("-")
    return value in names or (len(parts) > 1 and any(p in names for p in parts))


def _literals(node) -> list:
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    return []


def name_comparisons(pkg: Path, names: set[str]) -> list[str]:
    """Every comparison of a method or drafter name outside the two registries: ``==``/``!=``/``in``/``not in``
    with a name literal (or a tuple of them), ``startswith``/``endswith`` of one, a ``case`` on one."""
    found = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        if rel in NAME_TABLES:
            continue
        src = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                named = [s for s in sides if any(_namey(v, names) for v in _literals(s))]
                others = {ast.get_source_segment(src, s) for s in sides if s not in named}
                if named and not all(_other_namespace(rel, o) for o in others):
                    found.append(f"{rel}:{node.lineno}: {ast.get_source_segment(src, node)}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("startswith", "endswith")
            ):
                if any(_namey(v.rstrip("-"), names) for a in node.args for v in _literals(a) if isinstance(v, str)):
                    found.append(f"{rel}:{node.lineno}: {ast.get_source_segment(src, node)}")
            elif isinstance(node, ast.MatchValue) and any(_namey(v, names) for v in _literals(node.value)):
                found.append(f"{rel}:{node.lineno}: case {ast.get_source_segment(src, node)}")
    return found


def test_no_method_or_drafter_name_is_compared_outside_the_registries():
    """What a method or drafter needs is asked of its object (loosespec.methods.Method, the drafter table's
    DrafterEntry), as vLLM's SpeculativeConfig.use_eagle() or SGLang's SpeculativeAlgorithm: a name compared
    anywhere else is a place a new method would have to be added by hand."""
    found = name_comparisons(PKG, _registered_names())
    assert not found, "compare the Method / DrafterEntry, not the name:\n" + "\n".join(found)


def test_the_name_scan_finds_what_it_looks_for(tmp_path):
    """The scan above is not vacuous: each shape of name comparison the front ends used is found."""
    (tmp_path / "drafters").mkdir()
    (tmp_path / "bad.py").write_text(
        'if cfg.method == "specguard": pass\n'
        'if cfg.drafter in ("model", "mla"): pass\n'
        'if name.startswith("vllm-fly"): pass\n'
        'if m != "ar": pass\n'
        'match cfg.method:\n    case "fly": pass\n'
    )
    (tmp_path / "fine.py").write_text('if mode == "none": pass\nif kind == "llamacpp": pass\nx = {"fly": 1}["fly"]\n')
    (tmp_path / "methods.py").write_text('if name == "fly": pass\n')  # the registry may
    (tmp_path / "drafters" / "ngram.py").write_text('if search == "fly": pass\n')  # another namespace
    (tmp_path / "variant.py").write_text('if cfg.fly_sampling == "rejection": pass\n')  # FLy's variant, not the method
    found = name_comparisons(tmp_path, _registered_names())
    assert sorted((f.split(":")[0], int(f.split(":")[1])) for f in found) == [("bad.py", i) for i in (1, 2, 3, 4, 6)]


MAX_LINES = 600  # issue 44: a module past this has grown two concerns; split it by concern, not by line count


def test_no_module_over_the_line_limit():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
