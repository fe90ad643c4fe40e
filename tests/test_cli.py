"""The CLI as users run it: one-line errors, no tracebacks, JSON output. Most calls run ``cli.main()`` in this
process (conftest.run_cli: the same exit status and output, without 5 s of imports per call); the first
error test and the JSON/stdin test start a real interpreter, as a user's shell does."""

import json
import os
import subprocess
import sys

import pytest
from conftest import run_cli as cli

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def cli_process(*args, stdin=None):
    """A new interpreter: what only a real process shows (nothing printed at import, a real stdin pipe)."""
    return subprocess.run(
        [sys.executable, "-m", "loosespec.cli", *args],
        capture_output=True,
        text=True,
        env=ENV,
        input=stdin,
        timeout=600,
    )


def assert_one_line_error(proc, *needles):
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("loosespec: error:"), err
    for n in needles:
        assert n in lines[0], err


def test_unknown_model(tiny_dir):
    p = cli_process("generate", "--target", "no-such-org/no-such-model", "--draft", "none", "hi")
    assert_one_line_error(p, "no-such-org/no-such-model")


def test_missing_local_path():
    p = cli("generate", "--target", "./does/not/exist", "--draft", "none", "hi")
    assert_one_line_error(p, "not found")


def test_sampling_across_tokenizers_reports_both_units(tiny_dir):
    """Another vocabulary: rejection sampling drafts in the shared vocabulary (TLI); the statistics
    say which counts are in target tokens and which in the draft model's."""
    p = cli(
        "generate",
        "--target",
        "smollm2-135m-instruct",
        "--draft",
        str(tiny_dir / "target"),
        "--dtype",
        "float32",
        "--method",
        "rejection",
        "--drafter",
        "model",
        "--temperature",
        "0.7",
        "--max-new-tokens",
        "8",
        "hi",
    )
    assert p.returncode == 0, p.stderr
    assert "across tokenizers: drafted" in p.stdout + p.stderr and "draft-model tokens proposed" in p.stdout + p.stderr


@pytest.mark.parametrize("n", ["0", "-3"])
def test_bad_max_new_tokens(tiny_dir, n):
    p = cli("generate", "--target", str(tiny_dir / "target"), "--draft", "none", "--max-new-tokens", n, "hi")
    assert_one_line_error(p, "--max-new-tokens must be >= 1")  # the flag as the user typed it


def test_unreadable_prompt_file(tiny_dir, tmp_path):
    p = cli("generate", "--target", str(tiny_dir / "target"), "--prompt-file", str(tmp_path / "nope.txt"))
    assert_one_line_error(p, "cannot read prompt file")


def test_unknown_method_and_drafter(tiny_dir):
    assert_one_line_error(cli("generate", "--target", str(tiny_dir / "target"), "--method", "magic", "hi"), "magic")
    assert_one_line_error(
        cli("generate", "--target", str(tiny_dir / "target"), "--draft", "none", "--drafter", "model", "hi"),
        "needs a draft model",
    )


def test_exact_needs_greedy(tiny_dir):
    p = cli("generate", "--target", str(tiny_dir / "target"), "--method", "exact", "--temperature", "0.7", "hi")
    assert_one_line_error(p, "rejection")


def test_sampling_without_a_method_samples_with_rejection_and_several_prompts_run(tiny_dir):
    """--temperature 0.7 alone failed under the default method exact; now the method follows the temperature."""
    common = ("generate", "--raw", "--dtype", "float32", "--target", str(tiny_dir / "target"), "--max-new-tokens", "6")
    p = cli(*common, "--json", "--temperature", "0.7", "def f(x):\n", "abcabc")
    assert p.returncode == 0, p.stderr
    outs = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(outs) == 2 and all(o["config"]["method"] == "rejection" for o in outs)
    assert all(o["config"]["drafter"] == "ngram" and o["config"]["temperature"] == 0.7 for o in outs)
    p = cli(*common, "first", "second")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("==> prompt 1/2 <==\n") and "\n\n==> prompt 2/2 <==\n" in p.stdout
    assert p.stderr.count("[exact-ngram]") == 2
    import typer

    from loosespec.cli import app

    cmd = typer.main.get_command(app).commands["generate"]  # --help says so, for the command and for --method
    assert "rejection with --temperature" in " ".join(cmd.help.split())
    assert "rejection when sampling" in next(o.help for o in cmd.params if o.name == "method")


def test_json_output_and_stdin(tiny_dir):
    p = cli_process(
        "generate",
        "--json",
        "--raw",
        "--dtype",
        "float32",
        "--target",
        str(tiny_dir / "target"),
        "--draft",
        str(tiny_dir / "draft"),
        "--max-new-tokens",
        "20",
        "-",
        stdin="def f(x):\n",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) >= {"text", "token_ids", "stats", "config"}
    s = out["stats"]
    for key in (
        "new_tokens",
        "rounds",
        "target_forwards",
        "draft_forwards",
        "mean_accepted_length",
        "acceptance_rate",
        "wall_s",
        "tokens_per_s",
    ):
        assert key in s
    assert s["new_tokens"] == len(out["token_ids"]) == 20
    assert out["config"]["method"] == "exact" and out["config"]["drafter"] == "mla"
    assert out["config"]["target"]["spec"] == str(tiny_dir / "target")


def test_streams_text_and_reports_speedup(tiny_dir):
    p = cli(
        "generate",
        "--raw",
        "--target",
        str(tiny_dir / "target"),
        "--draft",
        "none",
        "--max-new-tokens",
        "16",
        "--compare-ar",
        "abcabc",
    )
    assert p.returncode == 0, p.stderr
    assert "[exact-ngram]" in p.stderr and "speedup over autoregressive" in p.stderr


@pytest.mark.real_model
@pytest.mark.slow  # make test checks exact == ar on SmolLM2 in-process (test_real_smollm, and in int8 test_quant)
def test_acceptance_smollm_exact_ngram_equals_ar():
    common = [
        "generate",
        "--json",
        "--dtype",
        "float32",
        "--target",
        "smollm2-135m-instruct",
        "--max-new-tokens",
        "40",
        "Write a Python function that reverses a list.",
    ]
    exact = json.loads(cli(*common, "--method", "exact", "--drafter", "ngram").stdout)
    ar = json.loads(cli(*common, "--method", "ar").stdout)
    assert exact["token_ids"] == ar["token_ids"]
    assert exact["stats"]["rounds"] <= ar["stats"]["rounds"]


def test_models_list_runs():
    p = cli("models")
    assert p.returncode == 0, p.stderr
    for name in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"):
        assert name in p.stdout


def test_models_pull_unknown():
    assert_one_line_error(cli("models", "pull", "gpt-17"), "unknown embedded model")


@pytest.mark.parametrize("flag", ["--vllm-concurrency", "--vllm-max-num-batched-tokens"])
def test_bad_vllm_bench_options(tiny_dir, tmp_path, flag):
    p = cli(
        "bench",
        "--target",
        str(tiny_dir / "target"),
        "--dataset",
        "gsm8k",
        "--methods",
        "vllm-ar",
        "--out",
        str(tmp_path / "out"),
        flag,
        "0",
    )
    assert_one_line_error(p, flag, "got 0")


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--quantize", "int2"], "unknown quantize"),
        (["--quantize", "int4"], "GGUF file"),  # a local directory has no GGUF for llama.cpp to run
        (["--draft-quantize", "fp4"], "unknown quantize"),
        (["--dtype", "bfloat16", "--quantize", "int8"], "float32"),
        (["--dtype", "fp8"], "unknown dtype"),
    ],
)
def test_bad_precision_flags(tiny_dir, flags, words):
    assert_one_line_error(cli("generate", "--target", str(tiny_dir / "target"), "--draft", "none", *flags, "hi"), words)


def test_int8_precision_is_recorded_and_exact_equals_ar(tiny_dir):
    common = [
        "generate",
        "--json",
        "--raw",
        "--quantize",
        "int8",
        "--target",
        str(tiny_dir / "target"),
        "--draft",
        "none",
        "--max-new-tokens",
        "24",
        "def add(a, b):\n    return a + b\n",
    ]
    exact = json.loads(cli(*common, "--method", "exact", "--drafter", "ngram").stdout)
    ar = json.loads(cli(*common, "--method", "ar").stdout)
    assert exact["token_ids"] == ar["token_ids"]
    cfg = exact["config"]
    assert cfg["precision"]["name"] == "int8" and cfg["precision"]["reason"]
    assert cfg["hardware"]["cpu"] and "cpu_flags" in cfg["hardware"]
    assert exact["stats"]["precision"] == "int8"
    assert sum(exact["stats"]["draft_length_histogram"].values()) == exact["stats"]["rounds"]


def test_models_cost_measures_once_then_reads_the_cache(tiny_dir, tmp_path):
    env = {"LOOSESPEC_CACHE": str(tmp_path)}
    args = ["models", "cost", str(tiny_dir / "target"), "--max-n", "4", "--dtype", "float32", "--quantize", "none"]
    first = cli(*args, "--json", env=env)
    assert first.returncode == 0, first.stderr
    curve = json.loads(first.stdout)
    assert curve["ns"] == [1, 2, 3, 4] and all(t > 0 for t in curve["seconds"])
    assert curve["meta"]["precision"] == "float32" and curve["meta"]["cpu"]
    assert list((tmp_path / "costs").iterdir())  # on disk, where the next process reads it
    table = cli(*args, env=env)
    assert table.returncode == 0 and "measuring" not in table.stderr  # served from the cache
    assert "| 4 |" in table.stdout and "c(n)/c(1)" in table.stdout
    assert_one_line_error(cli(*args[:-6], "--max-n", "0", env=env), "--max-n")


STATIC_CLI = ["generate", "--json", "--raw", "--dtype", "float32", "--max-new-tokens", "24", "def f(x):\n"]


@pytest.mark.slow  # make test checks the static cache's output in-process (tests/decode/test_static_cache.py)
def test_static_cache_from_the_cli_generates_what_the_dynamic_cache_does(tiny_dir):
    common = STATIC_CLI + ["--target", str(tiny_dir / "target"), "--draft", str(tiny_dir / "draft")]
    dynamic, static = cli(*common), cli(*common, "--cache-implementation", "static", "--max-cache-len", "256")
    assert dynamic.returncode == 0 and static.returncode == 0, static.stderr
    d, s = json.loads(dynamic.stdout), json.loads(static.stdout)
    assert s["token_ids"] == d["token_ids"] and s["config"]["cache_implementation"] == "static"


def test_static_cache_options_refuse_what_they_cannot_do(tiny_dir, tmp_path):
    common = STATIC_CLI + ["--target", str(tiny_dir / "target"), "--draft", str(tiny_dir / "draft")]
    assert_one_line_error(cli(*common, "--compile"), "compile needs cache_implementation 'static'")
    assert_one_line_error(cli(*common, "--cache-implementation", "paged"), "'dynamic' or 'static'")
    p = cli(
        "bench",
        "--dataset",
        "gsm8k",
        "--limit",
        "1",
        "--methods",
        "specguard",
        "--target",
        str(tiny_dir / "target"),
        "--draft",
        str(tiny_dir / "draft"),
        "--cache-implementation",
        "static",
        "--out",
        str(tmp_path / "b"),
    )
    assert_one_line_error(p, "specguard methods need --cache-implementation dynamic")


def test_code_execution_is_opt_in(tiny_dir, tmp_path, monkeypatch):
    """Scoring HumanEval or MBPP runs model-written code: without --allow-code-execution (or the environment
    variable) the run stops before anything loads or is written; --sandbox names its mode or refuses."""
    monkeypatch.delenv("LOOSESPEC_ALLOW_CODE_EXECUTION", raising=False)
    monkeypatch.delenv("LOOSESPEC_SANDBOX", raising=False)
    out = tmp_path / "he"
    p = cli(
        "bench",
        "--target",
        str(tiny_dir / "target"),
        "--draft",
        "none",
        "--dataset",
        "humaneval",
        "--methods",
        "ar",
        "--limit",
        "1",
        "--out",
        str(out),
    )
    assert_one_line_error(p, "--allow-code-execution", "LOOSESPEC_ALLOW_CODE_EXECUTION")
    assert not out.exists()
    p = cli(
        "calibrate",
        "--method",
        "fly",
        "--dataset",
        "mbpp-train",
        "--target",
        str(tiny_dir / "target"),
        "--draft",
        str(tiny_dir / "target"),
    )
    assert_one_line_error(p, "mbpp-train", "--allow-code-execution")
    p = cli(
        "bench",
        "--target",
        str(tiny_dir / "target"),
        "--draft",
        "none",
        "--dataset",
        "humaneval",
        "--methods",
        "ar",
        "--out",
        str(out),
        "--allow-code-execution",
        "--sandbox",
        "jail",
    )
    assert_one_line_error(p, "unknown sandbox mode 'jail'")
    assert not out.exists()


def test_quiet_verbose_and_the_environment_set_what_stderr_shows(tiny_dir):
    """The default (INFO) shows the statistics lines; --quiet and LOOSESPEC_LOGGING_LEVEL=WARNING show only warnings
    and errors (the completion on stdout unchanged); --verbose and LOOSESPEC_LOGGING_LEVEL=debug add debug records
    (here the engine's load configuration). A flag wins over the variable."""
    args = (
        "generate",
        "--raw",
        "--target",
        str(tiny_dir / "target"),
        "--draft",
        "none",
        "--method",
        "ar",
        "--max-new-tokens",
        "4",
        "abc",
    )
    default = cli(*args)
    assert default.returncode == 0 and "[ar] " in default.stderr and "LoadConfig(" not in default.stderr
    for quiet in (cli("--quiet", *args), cli(*args, env={"LOOSESPEC_LOGGING_LEVEL": "WARNING"})):
        assert quiet.returncode == 0 and quiet.stdout == default.stdout
        assert "[ar]" not in quiet.stderr and "precision" not in quiet.stderr, quiet.stderr
    for verbose in (
        cli("--verbose", *args),
        cli(*args, env={"LOOSESPEC_LOGGING_LEVEL": "debug"}),
        cli("--verbose", *args, env={"LOOSESPEC_LOGGING_LEVEL": "ERROR"}),
    ):
        assert verbose.returncode == 0 and "[ar] " in verbose.stderr
        assert f"LoadConfig(target='{tiny_dir / 'target'}'" in verbose.stderr, verbose.stderr
    louder = cli("--quiet", *args, env={"LOOSESPEC_LOGGING_LEVEL": "DEBUG"})
    assert "[ar]" not in louder.stderr and "LoadConfig(" not in louder.stderr
    # errors are printed whatever the level, and bad logging settings are errors of their own
    assert_one_line_error(
        cli("--quiet", "generate", "--target", "./does/not/exist", "--draft", "none", "hi"), "not found"
    )
    assert_one_line_error(cli("--verbose", "--quiet", *args), "--verbose and --quiet")
    assert_one_line_error(cli(*args, env={"LOOSESPEC_LOGGING_LEVEL": "loud"}), "LOOSESPEC_LOGGING_LEVEL", "'loud'")
    assert cli("generate", "--quiet", "abc").returncode == 2  # a global option: before the command


# --- vLLM's --speculative-config (loosespec.speculative_config) ---------------------------------------------------


def test_speculative_config_sets_the_knobs_and_the_draft(tiny_dir):
    """vLLM's spelling on generate: its method is the drafter, its model the draft, rejection_sample_method the
    method; the knobs it names reach the run's config."""
    target = str(tiny_dir / "target")
    common = ("generate", "--json", "--raw", "--dtype", "float32", "--target", target, "--max-new-tokens", "6")
    p = cli(
        *common,
        "--draft",
        "none",
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}',
        "abcabc",
    )
    assert p.returncode == 0, p.stderr
    c = json.loads(p.stdout)["config"]
    assert (c["method"], c["drafter"], c["num_draft_tokens"], c["prompt_lookup_max"]) == ("exact", "ngram", 5, 4)
    spec = {
        "method": "draft_model",
        "model": str(tiny_dir / "draft"),
        "num_speculative_tokens": 4,
        "rejection_sample_method": "fly",
        "fly_window_size": 2,
        "fly_entropy_threshold": 0.3,
        "fly_entropy_top_k": 2,
    }
    p = cli(*common, "--speculative-config", json.dumps(spec), "abcabc")  # no --draft: the config's model
    assert p.returncode == 0, p.stderr
    c = json.loads(p.stdout)["config"]
    assert (c["method"], c["drafter"], c["num_draft_tokens"], c["lossy"]) == ("fly", "model", 4, True)
    assert (c["fly_window_size"], c["fly_entropy_threshold"], c["fly_entropy_top_k"]) == (2, 0.3, 2)
    assert c["draft"]["spec"] == str(tiny_dir / "draft")


@pytest.mark.parametrize(
    "args,words",
    [
        (
            ["--num-draft-tokens", "8", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}'],
            ["--speculative-config num_speculative_tokens is 5 but --num-draft-tokens is 8"],
        ),
        (
            ["--method", "exact", "--speculative-config", '{"rejection_sample_method": "fly"}'],
            ["rejection_sample_method is 'fly' but --method is 'exact'"],
        ),
        (["--draft", "other", "--speculative-config", '{"model": "mine"}'], ["model is 'mine' but --draft is 'other'"]),
        (["--speculative-config", '{"method": "eagle3", "model": "x"}'], ["'eagle3'", "ngram, draft_model"]),
        (["--speculative-config", '{"num_lookahead_slots": 2}'], ["'num_lookahead_slots'", "num_speculative_tokens"]),
        (["--speculative-config", "{'method': 'ngram'}"], ["--speculative-config is not valid JSON"]),
    ],
)
def test_speculative_config_refuses_by_name(tiny_dir, args, words):
    p = cli("generate", "--target", str(tiny_dir / "target"), *args, "hi")
    assert_one_line_error(p, *words)


def test_speculative_config_on_bench_is_one_more_method(tiny_dir, tmp_path):
    """bench runs the config as the method --methods would name it, <method>-<drafter>@<knob>=<value>."""
    out = tmp_path / "b"
    args = ["bench", "--target", str(tiny_dir / "target"), "--dtype", "float32", "--dataset", "gsm8k", "--limit", "1"]
    args += ["--max-new-tokens", "4", "--methods", "ar", "--out", str(out), "--no-plots"]
    p = cli(*args, "--draft", "none", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}')
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    assert {r["method"] for r in rows} == {"ar", "exact-ngram@num_draft_tokens=3"}
    p = cli(*args, "--draft", "none", "--speculative-config", '{"model": "elsewhere"}')
    assert_one_line_error(p, "model is 'elsewhere' but --draft is 'none'")
