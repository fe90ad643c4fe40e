"""The knob schema: each decoding knob declared once (loosespec.config), everything else derived from it."""

import dataclasses
import re
from pathlib import Path

import pytest

from loosespec.config import KNOBS, ConfigError, DecodeConfig, knob_default, knob_info

ROOT = Path(__file__).resolve().parents[1]


def test_every_knob_has_help_and_its_default_validates():
    for name, f in KNOBS.items():
        k = knob_info(name)
        assert k.help.strip(), name
    DecodeConfig(drafter="ngram")  # the defaults pass their own bounds (the drafter is the method's to choose)


@pytest.mark.parametrize(
    "name, bad",
    [
        ("num_draft_tokens", 0),
        ("top_p", 0.0),
        ("fly_entropy_top_k", 0),
        ("sg_beta", 1.5),
        ("sg_embedder", "nope"),
        ("method", "magic"),
        ("fly_entropy_threshold", float("nan")),
        ("sg_delimiter", ""),
    ],
)
def test_bad_values_name_the_field_for_each_reader(name, bad):
    with pytest.raises(ConfigError) as e:
        DecodeConfig.create(**({"method": bad} if name == "method" else {"method": "fly", name: bad}))
    assert e.value.field == name
    assert str(e.value).startswith(name) and repr(bad)[:6] in str(e.value)
    flag = "--" + name.replace("_", "-")
    assert e.value.render("cli").startswith(flag)


def test_cross_field_errors_name_both_spellings():
    with pytest.raises(ConfigError) as e:
        DecodeConfig.create("exact", temperature=0.5)
    assert e.value.field == "temperature"
    assert "use method rejection" in str(e.value) and "use --method rejection" in e.value.render("cli")


def test_the_no_argument_config_is_valid_and_the_method_follows_the_temperature():
    from loosespec.config import DEFAULT_NUM_DRAFT_TOKENS

    cfg = DecodeConfig()
    assert cfg.method == "exact" and cfg.drafter is None and cfg.num_draft_tokens is None  # the engine's to fill
    assert DecodeConfig(temperature=0.7).method == "rejection"
    assert DecodeConfig.create(temperature=0.7).method == "rejection"
    assert DecodeConfig(method="fly", temperature=0.7).method == "fly"  # a method given is kept
    with pytest.raises(ConfigError) as e:  # exact is greedy: naming it while sampling stays an error
        DecodeConfig(method="exact", temperature=0.7)
    assert e.value.field == "temperature"
    with_draft, without = cfg.resolved(has_draft_model=True), cfg.resolved(has_draft_model=False)
    assert (with_draft.drafter, with_draft.num_draft_tokens) == ("mla", DEFAULT_NUM_DRAFT_TOKENS["mla"])
    assert (without.drafter, without.num_draft_tokens) == ("ngram", DEFAULT_NUM_DRAFT_TOKENS["ngram"])
    assert with_draft == DecodeConfig.create(has_draft_model=True) and without == DecodeConfig.create()
    assert DecodeConfig(method="ar").resolved(True).drafter is None
    assert DecodeConfig(drafter="model", num_draft_tokens=5).resolved(True).drafter == "model"  # given: kept
    assert "rejection when sampling" in knob_info("method").help


@pytest.mark.parametrize("method", ["exact", "rejection", "fly", "specguard"])
@pytest.mark.parametrize("drafter", ["ngram", "model", "mla"])
def test_one_default_k_per_drafter_whichever_way_the_config_is_built(method, drafter):
    """The constructor drafted 10 tokens with every drafter where create() took the drafter table's (mla: 15)."""
    from loosespec.config import DEFAULT_FLY_PRESET, DEFAULT_NUM_DRAFT_TOKENS, FLY_PRESETS
    from loosespec.drafters import DRAFTERS

    want = (
        FLY_PRESETS[DEFAULT_FLY_PRESET]["num_draft_tokens"] if method == "fly" else DRAFTERS[drafter].num_draft_tokens
    )
    assert DecodeConfig(method=method, drafter=drafter).num_draft_tokens == want
    assert DecodeConfig.create(method, drafter).num_draft_tokens == want
    if drafter != "model":  # the default drafters: the engine's filling gives the same K
        has_draft = DRAFTERS[drafter].needs_draft_model
        assert DecodeConfig(method=method).resolved(has_draft).num_draft_tokens == want
    assert DEFAULT_NUM_DRAFT_TOKENS[drafter] == DRAFTERS[drafter].num_draft_tokens
    assert DecodeConfig(method=method, drafter=drafter, num_draft_tokens=7).num_draft_tokens == 7  # a flag's K stays
    if method == "fly":
        assert DecodeConfig(method=method, drafter=drafter, fly_preset="paper").num_draft_tokens == 15


def test_vllm_minus_one_top_k_means_disabled():
    assert DecodeConfig.create("rejection", temperature=1.0, top_k=-1).top_k == 0


def test_no_knob_is_declared_twice():
    """Each knob's default is written in one module: no other module assigns a knob's name a literal default or
    declares it as an option or a request field of its own. The one exception: verify/, which imports nothing above
    it, writes out the defaults it needs on lines marked "(knob default, tests/verify/test_defaults.py)", and that
    test checks each equals the knob's."""
    knob = "|".join(KNOBS)
    declared = re.compile(
        r"\b(%s)\s*:\s*[^=,()]+?=\s*(typer\.Option|Field\(|-?[0-9][0-9.e_]*\b|\"[^\"]*\"|True|False)" % knob
    )
    option = re.compile(r"\b(%s)\s*[:=].*\b(typer\.Option|Field)\(" % knob)
    offenders = []
    for path in (ROOT / "loosespec").rglob("*.py"):
        if path.name == "config.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if "(not a knob)" in line or "(knob default, tests/verify/test_defaults.py)" in line:
                continue
            code = line.split("#")[0]
            if declared.search(code) or option.search(code):
                offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def _options(command: str) -> set[str]:
    """The option strings of a CLI command, as click sees them."""
    import typer

    from loosespec.cli import app

    cmd = typer.main.get_command(app).commands[command]
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}


def test_cli_options_derive_from_the_schema():
    gen, serve = _options("generate"), _options("serve")
    for name in KNOBS:
        k = knob_info(name)
        flags = (k.flag or "--" + name.replace("_", "-")).split("/")
        if k.cli:
            assert set(flags) <= gen, name
            assert set(flags) <= serve or name in ("max_new_tokens", "stop"), name
    import typer

    from loosespec.cli import app

    helps = {p.name: p.help for p in typer.main.get_command(app).commands["generate"].params}
    assert helps["fly_window_size"].startswith("FLy (lossy)") and helps["sg_tau"].startswith("SpecGuard (lossy)")
    assert {"--sg-candidates", "--sg-delimiter", "--drafter"} <= _options("calibrate")
    assert {"--sg-tau", "--temperature", "--adaptive-draft-length", "--fixed-draft-length"} <= _options("bench")


def test_server_request_fields_derive_from_the_schema():
    pydantic = pytest.importorskip("pydantic")
    from loosespec.serve.protocol import CommonFields, SpecFields

    assert set(SpecFields.model_fields) == {n for n in KNOBS if knob_info(n).request}
    for name, bad in (("num_draft_tokens", 0), ("fly_entropy_top_k", 0), ("sg_tau", -1.0), ("method", "magic")):
        with pytest.raises(pydantic.ValidationError) as e:
            CommonFields(**{name: bad})
        assert e.value.errors()[0]["loc"][0] == name
        with pytest.raises(ConfigError):  # the library refuses the same value
            DecodeConfig.create(**({"method": bad} if name == "method" else {"method": "fly", name: bad}))
    assert CommonFields(drafter="none").drafter == "none"  # "none": the method's default drafter


def test_vllm_settings_share_defaults_and_bounds():
    from loosespec.integrations.vllm.rule import FlySettings

    s = FlySettings()
    for f in dataclasses.fields(s):
        assert getattr(s, f.name) == knob_default(f.name)
    with pytest.raises(ValueError, match="fly_entropy_top_k must be >= 1"):
        FlySettings(fly_entropy_top_k=0)


DUMMY_PROBE = r"""
import json, typer, pydantic
from loosespec.cli import app
from loosespec.serve.protocol import CommonFields
from loosespec.integrations.vllm.rule import FlySettings, fly_env
cmd = typer.main.get_command(app)
out = {c: [p.opts for p in cmd.commands[c].params if p.name == "fly_dummy"] for c in ("generate", "serve")}
try:
    CommonFields(fly_dummy=10)
    out["server_refuses_10"] = False  # accepted as an unknown field: the knob is not there
except pydantic.ValidationError as e:
    out["server_refuses_10"] = e.errors()[0]["loc"] == ("fly_dummy",)
out["server_takes_3"] = CommonFields(fly_dummy=3).fly_dummy == 3
out["vllm_default"] = FlySettings().fly_dummy
out["vllm_env"] = FlySettings.from_env({"LOOSESPEC_REJECTION_SAMPLE_METHOD": "fly", "LOOSESPEC_FLY_DUMMY": "2"}).fly_dummy
out["env"] = fly_env({"fly_dummy": 4}).get("LOOSESPEC_FLY_DUMMY")
print(json.dumps(out))
"""


def test_adding_a_knob_is_one_edit(tmp_path):
    """The experiment the schema exists for: one knob() line in a copy of the package, and the knob is a CLI option
    of generate and serve, a validated request field of the server, and a setting of the vLLM plugin."""
    import json
    import shutil
    import subprocess
    import sys

    pkg = tmp_path / "loosespec"
    shutil.copytree(ROOT / "loosespec", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    config = pkg / "config.py"
    text = config.read_text()
    anchor = "    fly_sampling: str = knob("
    assert text.count(anchor) == 1
    config.write_text(
        text.replace(
            anchor, '    fly_dummy: int = knob(7, "a dummy knob.", lossy="FLy", vllm=True, ge=0, le=9)\n' + anchor
        )
    )
    r = subprocess.run(
        [sys.executable, "-c", DUMMY_PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["generate"] == [["--fly-dummy"]] and out["serve"] == [["--fly-dummy"]]
    assert out["server_refuses_10"] and out["server_takes_3"]
    assert out["vllm_default"] == 7 and out["vllm_env"] == 2 and out["env"] == "4"


def test_every_flag_the_makefile_passes_exists():
    """A Makefile target that passes an option its command lacks fails only when someone runs it (the
    calibration target once passed --sg-select, which `calibrate` did not have)."""
    import re
    from pathlib import Path

    import click
    import typer

    from loosespec.cli import app

    text = Path(__file__).resolve().parents[1].joinpath("Makefile").read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^([A-Z_]+)\s*[?:]?=\s*(.*)$", text, flags=re.M))
    root = typer.main.get_command(app)
    checked = 0
    for line in re.findall(r"\$\(BIN\)/loosespec (.*)", text):
        for _ in range(3):  # expand $(VAR) of the Makefile's own variables
            line = re.sub(r"\$\(([A-Z_]+)\)", lambda m: variables.get(m.group(1), ""), line)
        words = re.split(r"\s(?:\|\||&&|&|;|\|)\s|;", line)[0].split()  # this command only
        cmd = root.commands[words[0]]
        if isinstance(cmd, click.Group):
            cmd = cmd.commands[words[1]]
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        for w in words:
            if re.fullmatch(r"--[a-z][a-z0-9-]*", w):
                assert w in known, f"Makefile passes {w} to `loosespec {words[0]}`, which has no such option"
                checked += 1
    assert checked > 30
