"""The method registry (loosespec.methods): a method is one object, and adding one is one entry plus its rule."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loosespec.config import DecodeConfig
from loosespec.methods import METHODS, needs_draft_model
from loosespec.verify.rules import FlyRule, GreedyRule, RejectionRule
from loosespec.verify.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
ANCHOR = "METHODS: dict[str, Method] = {\n    m.name: m\n    for m in ("

# The toy: a rule that keeps every draft token (LOSSY on purpose, so that its acceptance shows it ran) and its entry
TOY_RULE = """
class _KeepAll:
    def __call__(self, draft, logits):
        import torch

        from loosespec.verify import Verdict

        bonus = logits[len(draft)].argmax(-1, keepdim=True).to(draft.tokens.device)
        return Verdict(len(draft), torch.cat([draft.tokens, bonus]))


def keep_all_rule(cfg, sampling, generator, prompt_ids=None):
    return _KeepAll()


"""
TOY_ENTRY = """
    Method("toy", "keeps every draft token (a test's toy). LOSSY", lossy=True, rule=keep_all_rule),"""

TOY_PROBE = r"""
import contextlib, io, json, sys
from loosespec import cli
out = {}
target, draft = sys.argv[1], sys.argv[2]
buf = io.StringIO()
sys.argv = ["loosespec", "generate", "--target", target, "--draft", draft, "--dtype", "float32", "--method", "toy",
            "--drafter", "model", "--fixed-draft-length", "--max-new-tokens", "24", "--raw", "--json", "Once upon a time"]
with contextlib.redirect_stdout(buf):
    try:
        cli.main()
    except SystemExit as e:
        out["cli_exit"] = e.code
r = json.loads(buf.getvalue())
out["cli"] = {"method": r["config"]["method"], "lossy": r["config"]["lossy"], "drafted": r["stats"]["drafted_tokens"],
              "acceptance": r["stats"]["acceptance_rate"]}

from loosespec.eval import bench_methods as M
b = M.bench_method("toy-mla")
out["bench"] = {"methods": M.parse_methods("toy-ngram,toy-mla"), "method": b.method.name, "lossy": b.lossy,
                "needs_draft": b.needs_draft, "config": M.method_config("toy-ngram", max_new_tokens=8, temperature=0.0,
                                                                        seed=0, has_draft=False).method}

from fastapi.testclient import TestClient
from loosespec.decode.engine import Engine
from loosespec.serve.app import create_app
from loosespec.serve.protocol import ServerSettings
engine = Engine.load(target, draft, dtype="float32", device="cpu", progress=False)
app = create_app(engine, ServerSettings(served_model_name="tiny", defaults={"method": "exact"}, max_tokens_default=8,
                                        allow_origins=("*",)))  # the test client's Host: testserver
with TestClient(app) as c:
    ok = c.post("/v1/completions", json={"model": "tiny", "prompt": "Once upon a time", "max_tokens": 12,
                                         "method": "toy", "drafter": "model", "adaptive_draft_length": False})
    bad = c.post("/v1/completions", json={"model": "tiny", "prompt": "Once", "max_tokens": 4, "method": "toy2"})
out["server"] = {"status": ok.status_code, "body": ok.json(), "unknown_status": bad.status_code,
                 "bad_body": bad.json()}
print(json.dumps(out))
"""


def test_adding_a_method_is_one_entry_and_its_rule(tmp_path, tiny_dir):
    """The experiment the registry exists for: in a copy of the package, one Method entry in methods.py plus its
    rule, and the method runs from the CLI (generate), the bench's method table and the server, nothing else
    edited. Its rule keeps every draft token, so an acceptance of 1.0 shows it is the rule that ran."""
    pkg = tmp_path / "loosespec"
    shutil.copytree(ROOT / "loosespec", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    methods = pkg / "methods.py"
    text = methods.read_text()
    assert text.count(ANCHOR) == 1
    methods.write_text(text.replace(ANCHOR, TOY_RULE + ANCHOR + TOY_ENTRY))
    r = subprocess.run(
        [sys.executable, "-c", TOY_PROBE, str(tiny_dir / "target"), str(tiny_dir / "draft")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "cli_exit" not in out or out["cli_exit"] in (0, None), out
    assert out["cli"]["method"] == "toy" and out["cli"]["lossy"] is True
    assert out["cli"]["drafted"] > 0 and out["cli"]["acceptance"] == 1.0  # the toy rule verified the rounds
    assert out["bench"] == {
        "methods": ["ar", "toy-ngram", "toy-mla"],
        "method": "toy",
        "lossy": True,
        "needs_draft": True,
        "config": "toy",
    }
    assert out["server"]["status"] == 200, out["server"]
    spec = out["server"]["body"]["metrics"]["speculative_decoding"]
    assert spec["method"] == "toy" and spec["lossy"] is True and spec["num_draft_tokens"] > 0
    assert spec["num_accepted_tokens"] == spec["num_draft_tokens"]  # the toy rule verified the server's rounds too
    assert out["server"]["unknown_status"] == 400, out["server"]  # and it still refuses a method the registry lacks


def test_every_method_names_itself_and_its_rule():
    for name, m in METHODS.items():
        assert m.name == name and m.summary and callable(m.rule)


@pytest.mark.parametrize(
    "method, drafter, temperature, rule",
    [
        ("ar", None, 0.0, GreedyRule),
        ("exact", "ngram", 0.0, GreedyRule),
        ("rejection", "ngram", 0.7, RejectionRule),
        ("fly", "ngram", 0.0, FlyRule),
        ("specguard", "ngram", 0.0, GreedyRule),
    ],
)
def test_each_method_builds_its_rule(method, drafter, temperature, rule):
    cfg = DecodeConfig.create(method, drafter, temperature=temperature)
    sampling = SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k)
    assert isinstance(METHODS[method].make_rule(cfg, sampling, torch.Generator()), rule)


def test_specguard_verifies_its_target_steps_with_the_rule_sg_verify_names():
    g = torch.Generator()
    assisted = DecodeConfig.create("specguard", "ngram", sg_verify="fly")
    assert isinstance(METHODS["specguard"].make_rule(assisted, SamplingParams(0.0), g), FlyRule)
    regenerate = DecodeConfig.create("specguard", "ngram", sg_verify="fly", sg_on_reject="regenerate")
    assert isinstance(METHODS["specguard"].make_rule(regenerate, SamplingParams(0.0), g), GreedyRule)


def test_what_needs_a_draft_model():
    assert needs_draft_model("specguard", "ngram") and needs_draft_model("exact", "mla")
    assert needs_draft_model("fly", "model") and not needs_draft_model("exact", "ngram")
    assert not needs_draft_model("ar", None) and not needs_draft_model("magic", None)


def test_what_reads_the_draft_probabilities():
    sampled, greedy = SamplingParams(0.7), SamplingParams(0.0)
    fly = DecodeConfig.create("fly", "ngram", temperature=0.7)
    fly_rejection = DecodeConfig.create("fly", "ngram", temperature=0.7, fly_sampling="rejection")
    reads = {name: m.needs_draft_probs for name, m in METHODS.items()}
    assert reads["rejection"](fly, sampled) and not reads["rejection"](fly, greedy)
    assert not reads["fly"](fly, sampled) and reads["fly"](fly_rejection, sampled)
    assert not reads["exact"](fly, sampled) and not reads["specguard"](fly, sampled)
    assert METHODS["fly"].draft_sampling(fly, sampled).greedy  # two-sample drafts greedily, as the official code
    assert not METHODS["fly"].draft_sampling(fly_rejection, sampled).greedy
