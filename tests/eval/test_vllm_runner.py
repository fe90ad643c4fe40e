"""The vllm-* benchmark methods' plumbing (loosespec.eval.peers.vllm, bench), against a stand-in
``vllm serve`` (tests/fakes/fake_vllm.py): server commands, the plugin's environment, counters read
from /metrics, results rows, and speedup measured against vllm-ar."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from loosespec.errors import LoosespecError
from loosespec.eval import bench_methods as M
from loosespec.eval import harness as H
from loosespec.eval import report as RP
from loosespec.eval import results as R
from loosespec.eval import stats as S
from loosespec.eval.peers.vllm import VllmServer, VllmSettings, server_command, speculative_config

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "fake_vllm.py"


@pytest.fixture
def fake_bin(tmp_path):
    """An executable named like vLLM's CLI that runs the stand-in with this interpreter."""
    exe = tmp_path / "vllm"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    exe.chmod(0o755)
    return str(exe)


def test_server_commands_per_method():
    # the plugin path, whatever vLLM this machine has (native FLy: test_fly_methods_take_vllms_native_fly_...)
    s = VllmSettings(target="/m/target", draft="/m/draft", num_speculative_tokens=8, fly_path="plugin")
    assert speculative_config("vllm-ar", s) is None
    assert speculative_config("vllm-ngram", s)["method"] == "ngram"
    assert speculative_config("vllm-fly", s) == {
        "method": "draft_model",
        "model": "/m/draft",
        "num_speculative_tokens": 8,
    }
    default = VllmSettings(target="/m/target", draft="/m/draft", fly_path="plugin")
    assert speculative_config("vllm-draft", default)["num_speculative_tokens"] == 5
    assert speculative_config("vllm-fly", default)["num_speculative_tokens"] == 15  # FLy's K
    with pytest.raises(LoosespecError, match="never defers"):  # 5 positions after a mismatch never fit 5 drafts
        speculative_config(
            "vllm-fly", dataclasses.replace(default, num_speculative_tokens=5, fly={"fly_window_size": 5})
        )
    # unset, the window is vLLM's default, min(6, k - 1): FLy can defer in 5 drafts
    assert (
        speculative_config("vllm-fly", dataclasses.replace(default, num_speculative_tokens=5))["num_speculative_tokens"]
        == 5
    )
    argv, env = server_command("vllm-fly", dataclasses.replace(s, vllm_bin="/x/vllm"), 8000)
    assert argv[:3] == ["/x/vllm", "serve", "/m/target"] and env["LOOSESPEC_REJECTION_SAMPLE_METHOD"] == "fly"
    argv, _ = server_command("vllm-fly", dataclasses.replace(s, vllm_bin="/x/python3"), 8000)
    assert argv[:5] == ["/x/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/target"]
    assert "--max-num-batched-tokens" not in argv  # vLLM's default unless asked
    argv, _ = server_command("vllm-ar", dataclasses.replace(s, max_num_batched_tokens=256), 8000)
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "256"
    # unset FLy knobs are not passed: the plugin takes vLLM's native defaults (W = min(6, K - 1), theta 0.3)
    assert "LOOSESPEC_FLY_WINDOW_SIZE" not in env and "LOOSESPEC_FLY_ENTROPY_THRESHOLD" not in env
    _, env = server_command(
        "vllm-fly", dataclasses.replace(s, fly={"fly_window_size": 5, "fly_boundary": "official"}), 8000
    )
    assert env["LOOSESPEC_FLY_WINDOW_SIZE"] == "5" and env["LOOSESPEC_FLY_BOUNDARY"] == "official"
    _, env = server_command("vllm-draft", s, 8000)
    assert env["LOOSESPEC_REJECTION_SAMPLE_METHOD"] == "standard"  # exact verification, even if the shell set fly
    with pytest.raises(LoosespecError, match="needs a draft model"):
        speculative_config("vllm-draft", VllmSettings(target="/m/target", draft=None))
    assert M.is_lossy("vllm-fly") and M.is_lossy("vllm-fly-ngram") and not M.is_lossy("vllm-draft")
    assert M.parse_methods("vllm-ar,vllm-fly") == ["ar", "vllm-ar", "vllm-fly"]


def test_missing_vllm_is_a_clear_error(tmp_path):
    with pytest.raises(LoosespecError, match="make vllm"):
        VllmServer("vllm-ar", VllmSettings(target="t", draft=None, vllm_bin=str(tmp_path / "nope")), tmp_path / "log")


class Problem:
    def __init__(self, i):
        self.id, self.category, self.prompt, self.answer = f"p{i}", "c", f"prompt {i}", None


def test_bench_runs_vllm_methods_against_vllm_ar(tmp_path, fake_bin):
    problems = [Problem(i) for i in range(3)]
    settings = {"max_new_tokens": 8, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "sg_tau": None}
    vllm = VllmSettings(target="/m/target", draft="/m/draft", vllm_bin=fake_bin)
    rows = H.run_bench(
        None,
        problems,
        ["vllm-ar", "vllm-draft", "vllm-fly"],
        tmp_path,
        dataset="toy",
        settings=settings,
        encode=lambda p: list(range(10, 20 + int(p.id[1:]))),
        scorer=lambda p, text: "rule=fly" not in text,
        model_id="target",
        progress=False,
        vllm=vllm,
    )
    assert len(rows) == 9 and len(R.ResultsFile(tmp_path / R.RESULTS).read()) == 9
    by = {(r["question_id"], r["method"]): r for r in rows}
    fly = by[("p1", "vllm-fly")]
    assert fly["lossy"] and fly["output"].startswith("rule=fly") and fly["token_ids"] == list(range(20, 12, -1))
    assert by[("p1", "vllm-draft")]["output"].startswith("rule=standard")
    assert fly["drafted_tokens"] == 2 * 15 and fly["accepted_tokens"] == 8 - 2 and fly["rounds"] == 2
    # the same counts under vLLM's names, as a loosespec row's stats has them
    vllm_names = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    assert [fly["stats"][k] for k in vllm_names] == [2, 2 * 15, 8 - 2]
    assert by[("p1", "vllm-ar")]["rounds"] == 8 and by[("p1", "vllm-ar")]["drafted_tokens"] == 0
    summary = S.summarize(rows)
    assert summary["methods"]["vllm-fly"]["baseline"] == "vllm-ar"
    assert summary["methods"]["vllm-fly"]["mean_accepted_length"] == 4.0
    assert summary["methods"]["vllm-fly"]["recovery"] == 0.0  # the toy scorer fails every fly output
    assert summary["methods"]["vllm-draft"]["identical_to_ar"] == 1.0
    log = (tmp_path / "vllm.log").read_text()
    assert log.count("# ") >= 3 and '"LOOSESPEC_REJECTION_SAMPLE_METHOD": "fly"' in log
    # resuming: nothing left to run, no server started
    again = H.run_bench(
        None,
        problems,
        ["vllm-ar", "vllm-draft", "vllm-fly"],
        tmp_path,
        dataset="toy",
        settings=settings,
        encode=lambda p: [1, 2],
        scorer=lambda p, t: None,
        model_id="target",
        progress=False,
        vllm=VllmSettings(target="t", draft="d", vllm_bin=str(tmp_path / "absent")),
    )
    assert len(again) == 9


def test_concurrent_load_reads_counters_per_block(tmp_path, fake_bin):
    problems = [Problem(i) for i in range(3)]
    settings = {"max_new_tokens": 6, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "sg_tau": None}
    vllm = VllmSettings(target="/m/target", draft="/m/draft", vllm_bin=fake_bin, concurrency=2)
    rows = H.run_bench(
        None,
        problems,
        ["vllm-ar", "vllm-draft"],
        tmp_path,
        dataset="toy",
        settings=settings,
        encode=lambda p: list(range(10)),
        scorer=lambda p, t: None,
        model_id="target",
        progress=False,
        vllm=vllm,
    )
    draft = [r for r in rows if r["method"] == "vllm-draft"]
    assert [r["stats"]["block"]["requests"] for r in draft] == [2, 2, 1]
    assert draft[0]["stats"]["block"]["vllm_counters"]["drafts"] == 4  # two requests of 6 tokens: 2 steps each
    assert draft[0]["rounds"] == 2 and draft[0]["config"]["server"]["concurrency"] == 2
    s = S.summarize(rows)["methods"]["vllm-draft"]
    assert s["throughput_tokens_per_s"] > 0 and s["mean_accepted_length"] == 3.0
    blocks = {r["stats"]["block"]["makespan_s"]: r["stats"]["block"]["vllm_counters"] for r in draft}
    assert len(blocks) == 2 and s["acceptance_rate"] == pytest.approx(
        sum(c["accepted"] for c in blocks.values()) / sum(c["draft_tokens"] for c in blocks.values()), abs=1e-4
    )
    table = RP.format_table(S.summarize(rows)).splitlines()
    assert "| throughput tok/s |" in table[0] and table[0].count("|") == table[1].count("|") == table[2].count("|")
    draft_row = next(line for line in table if line.startswith("| vllm-draft |"))
    assert draft_row.split(" | ")[4] == f"{s['throughput_tokens_per_s']:.2f}"


def test_a_server_that_dies_while_starting_is_reported(tmp_path):
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\necho 'RuntimeError: no AVX-512' >&2\nexit 3\n")
    exe.chmod(0o755)
    with pytest.raises(LoosespecError, match="exited with 3 while starting"):
        with VllmServer("vllm-ar", VllmSettings(target="t", draft=None, vllm_bin=str(exe)), tmp_path / "v.log"):
            pass
    assert "no AVX-512" in (tmp_path / "v.log").read_text()


def test_serve_engine_vllm_execs_vllm_serve_with_the_plugin_configured(tmp_path):
    """`loosespec serve --engine vllm` becomes `vllm serve` (here a script that records what it got)."""
    import subprocess

    exe = tmp_path / "vllm"
    exe.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/argv\necho "$LOOSESPEC_REJECTION_SAMPLE_METHOD '
        f'$LOOSESPEC_FLY_WINDOW_SIZE" > {tmp_path}/env\n'
    )
    exe.chmod(0o755)
    tiny = tmp_path / "m"
    from conftest import make_tiny_model, make_tiny_tokenizer

    make_tiny_model(0).save_pretrained(tiny)
    make_tiny_tokenizer().save_pretrained(tiny)
    cmd = [
        sys.executable,
        "-m",
        "loosespec.cli",
        "serve",
        "--engine",
        "vllm",
        "--vllm-bin",
        str(exe),
        "--target",
        str(tiny),
        "--draft",
        "none",
        "--method",
        "fly",
        "--fly-window-size",
        "4",
        "--port",
        "8765",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    argv = (tmp_path / "argv").read_text()
    assert f"serve {tiny}" in argv and "--port 8765" in argv and '"method": "ngram"' in argv
    assert '"num_speculative_tokens": 15' in argv  # FLy's K by default: its window must fit in the draft
    assert (tmp_path / "env").read_text().split() == ["fly", "4"]
    assert "vllm-fly-ngram (LOSSY)" in p.stderr
    # refused before any exec: in this process, with exec made an error should it be reached
    from unittest import mock

    from conftest import run_cli

    with mock.patch("os.execve", side_effect=AssertionError("exec reached")):
        p = run_cli(*cmd[3:-6], "--method", "specguard")
        assert p.returncode != 0 and "--engine vllm serves ar, exact or fly" in p.stderr
        p = run_cli(*cmd[3:], "--num-draft-tokens", "4")
        assert (
            p.returncode != 0
            and "need --fly-window-size < --num-draft-tokens" in p.stderr
            and "Traceback" not in p.stderr
        )


def test_vllm_on_a_gpu_the_engine_shares_gets_what_is_free(tmp_path, fake_bin, monkeypatch):
    """bench keeps the transformers pair on the GPU; vLLM at its default share (0.9 of the total) would refuse
    to start on a 24-48 GB GPU. With this process holding CUDA memory, --gpu-memory-utilization is sized from
    torch.cuda.mem_get_info() (stand-ins here: no GPU is needed), and too little left is a clear error."""
    import torch

    from loosespec.eval.peers.vllm import gpu_memory_share, size_for_shared_gpu

    gib = 2**30
    assert gpu_memory_share(10 * gib, 24 * gib) == round(9 / 24, 3)
    assert gpu_memory_share(80 * gib, 80 * gib) == 0.9  # an idle GPU: vLLM's default
    with pytest.raises(LoosespecError, match="0.9 of 24.0 GiB are free"):
        gpu_memory_share(int(0.9 * gib), 24 * gib)
    s = VllmSettings(target="/m/target", draft="/m/draft", vllm_bin=fake_bin)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert size_for_shared_gpu(s) == (s, None)  # this process never touched CUDA: vLLM's default
    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (10 * gib, 24 * gib))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Stand-in GPU")  # the rows' hardware record
    assert size_for_shared_gpu(dataclasses.replace(s, gpu_memory_utilization=0.5))[0].gpu_memory_utilization == 0.5
    problems = [Problem(i) for i in range(2)]
    settings = {"max_new_tokens": 4, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "sg_tau": None}
    lines = []
    H.run_bench(
        None,
        problems,
        ["vllm-ar"],
        tmp_path,
        dataset="toy",
        settings=settings,
        encode=lambda p: list(range(10)),
        scorer=lambda p, t: None,
        model_id="target",
        progress=False,
        vllm=s,
        log=lines.append,
    )
    assert calls == ["empty"] and any("--gpu-memory-utilization 0.375" in line for line in lines)
    assert "--gpu-memory-utilization 0.375" in (tmp_path / "vllm.log").read_text()
    argv, _ = server_command("vllm-ar", s, 8000)
    assert "--gpu-memory-utilization" not in argv  # unless sized or asked for


def test_fly_methods_take_vllms_native_fly_where_it_has_it(tmp_path):
    """vllm-fly* on a vLLM whose SpeculativeConfig declares FLy (stand-in environments: the fields decide, not the
    version) pass rejection_sample_method "fly" and loosespec's knobs under vLLM's names in --speculative-config,
    with the plugin left off; on one without, the plugin path as before; the rows record which path ran."""
    from fakes.fake_vllm import write_env

    from loosespec.eval.peers.vllm import fly_record, fly_route

    native = write_env(tmp_path / "native", native=True, version="0.0.1")
    older = write_env(tmp_path / "older", native=False, version="9.9.9")
    knobs = {
        "fly_window_size": 5,
        "fly_entropy_threshold": 0.9,
        "fly_entropy_top_k": 3,
        "fly_boundary": "window",
        "fly_sampling": "two-sample",
    }
    s = VllmSettings(target="/m/target", draft="/m/draft", vllm_bin=native, fly=knobs)
    assert fly_route("vllm-fly", s).path == "native" and fly_route("vllm-draft", s) is None
    assert speculative_config("vllm-fly", s) == {
        "method": "draft_model",
        "model": "/m/draft",
        "num_speculative_tokens": 15,
        "rejection_sample_method": "fly",
        "fly_window_size": 5,
        "fly_entropy_threshold": 0.9,
        "fly_entropy_top_k": 3,
    }
    assert speculative_config("vllm-fly-ngram", s)["rejection_sample_method"] == "fly"
    assert "rejection_sample_method" not in speculative_config("vllm-draft", s)
    argv, env = server_command("vllm-fly", s, 8000)
    assert json.loads(argv[argv.index("--speculative-config") + 1])["rejection_sample_method"] == "fly"
    assert env["LOOSESPEC_REJECTION_SAMPLE_METHOD"] == "standard" and "LOOSESPEC_FLY_WINDOW_SIZE" not in env
    assert fly_record("vllm-fly", s)["fly_path"] == "native" and fly_record("vllm-ar", s) == {}
    # unset knobs are left to vLLM's native defaults, as the plugin takes them
    assert speculative_config("vllm-fly", dataclasses.replace(s, fly={})) == {
        "method": "draft_model",
        "model": "/m/draft",
        "num_speculative_tokens": 15,
        "rejection_sample_method": "fly",
    }
    # what vLLM's native FLy cannot express is refused, not changed
    with pytest.raises(LoosespecError, match="fly_boundary 'official'"):
        speculative_config("vllm-fly", dataclasses.replace(s, fly={**knobs, "fly_boundary": "official"}))
    # the older vLLM: the plugin, exactly as before
    old = dataclasses.replace(s, vllm_bin=older)
    assert fly_route("vllm-fly", old).path == "plugin" and "no native FLy" in fly_route("vllm-fly", old).reason
    assert "rejection_sample_method" not in speculative_config("vllm-fly", old)
    _, env = server_command("vllm-fly", old, 8000)
    assert env["LOOSESPEC_REJECTION_SAMPLE_METHOD"] == "fly" and env["LOOSESPEC_FLY_WINDOW_SIZE"] == "5"
    # asked for: native on the older vLLM is an error; the plugin on the native one tells the plugin to patch
    with pytest.raises(LoosespecError, match="no native FLy"):
        speculative_config("vllm-fly", dataclasses.replace(old, fly_path="native"))
    _, env = server_command("vllm-fly", dataclasses.replace(s, fly_path="plugin"), 8000)
    assert env["LOOSESPEC_REJECTION_SAMPLE_METHOD"] == "fly" and env["LOOSESPEC_VLLM_FLY_PATH"] == "plugin"
    # a CPU build declaring native FLy keeps the plugin (vLLM's native FLy is GPU code)
    cpu = dataclasses.replace(s, vllm_bin=write_env(tmp_path / "cpu", native=True, cpu=True))
    assert fly_route("vllm-fly", cpu).path == "plugin" and "CPU" in fly_route("vllm-fly", cpu).reason


def test_bench_serves_vllm_fly_on_the_native_path(tmp_path):
    """The whole bench path against stand-in vLLM environments: rows served by vLLM's own FLy (the stand-in's
    rule=native-fly, its config accepting the fly_* keys) or by the plugin, each row saying which."""
    from fakes.fake_vllm import write_env

    problems = [Problem(i) for i in range(2)]
    settings = {"max_new_tokens": 6, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "sg_tau": None}
    for name, native, rule in (("native", True, "native-fly"), ("older", False, "fly")):
        vllm = VllmSettings(
            target="/m/target",
            draft="/m/draft",
            vllm_bin=write_env(tmp_path / name, native=native),
            fly={"fly_window_size": 5},
        )
        rows = H.run_bench(
            None,
            problems,
            ["vllm-ar", "vllm-fly"],
            tmp_path / f"out-{name}",
            dataset="toy",
            settings=settings,
            encode=lambda p: list(range(10)),
            scorer=lambda p, t: None,
            model_id="target",
            progress=False,
            vllm=vllm,
        )
        fly = [r for r in rows if r["method"] == "vllm-fly"]
        assert len(fly) == 2 and all(r["output"].startswith(f"rule={rule} ") for r in fly), fly[0]["output"]
        server = fly[0]["config"]["server"]
        assert server["fly_path"] == ("native" if native else "plugin")
        assert ("fly_native_differences" in server) == native
        assert f"# FLy: {server['fly_path']}" in (tmp_path / f"out-{name}" / "vllm.log").read_text()


def test_the_stand_in_refuses_fly_keys_its_config_lacks(tmp_path):
    """The stand-in vLLM refuses --speculative-config keys its SpeculativeConfig lacks, as vLLM's pydantic config
    does: passing the native keys to an older vLLM would fail at start-up, not run unnoticed."""
    import subprocess

    from fakes.fake_vllm import write_env

    exe = write_env(tmp_path / "older", native=False)
    spec = json.dumps(
        {"method": "ngram", "num_speculative_tokens": 4, "rejection_sample_method": "fly", "fly_window_size": 2}
    )
    p = subprocess.run(
        [exe, "serve", "/m/target", "--port", "1", "--speculative-config", spec],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0 and "fly_window_size" in p.stderr and "Extra inputs are not permitted" in p.stderr
