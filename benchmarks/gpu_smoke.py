"""The GPU smoke run (issue 22): everything loosespec should check the first time it gets a GPU, in one
script that needs no network and at most 64 MiB of files carried to the machine, and writes one JSON summary.

Two steps:

    python benchmarks/gpu_smoke.py prepare               # here (network): .gpu-smoke/ = the default pair's configs
                                                         # and tokenizer, and wheels a GPU image may lack
    benchmarks/gpu_smoke.sh --device cuda                # there: sets the Python path up, then `run`
    python benchmarks/gpu_smoke.py run --device cpu --size tiny   # the CPU dry run of the same script

``run`` sections (each timed, each failing on its own without stopping the others, all under ``--budget-s``):

- ``env``: Python, torch, CUDA, the GPU (name, compute capability, native bfloat16, memory), the versions of
  loosespec's dependencies checked against pyproject.toml's ranges, and ``pip list``-style versions of the rest;
- ``tests``: the tiny-model test files with ``LOOSESPEC_TEST_DEVICE=<device>`` (the switch in tests/conftest.py);
- ``models``: target and draft built with random weights from the embedded pair's configs (real weights cannot
  travel), plus a "self-draft" (the target with 5% weight noise) that agrees with it often enough for FLy to
  defer; ``--size tiny`` shrinks the configs' depth and width (the vocabulary stays) for the CPU dry run;
- ``matrix``: every method and drafter at T = 0 and 0.7, in bfloat16 and float16 (float32 replaces bfloat16
  where the device has no native bfloat16), and FLy with its gate open (theta 0) on the self-draft pair, which
  must defer;
- ``rule_cost``: ``benchmarks/rule_cost.py --device <device>`` on the target and the draft (cost curves);
- ``syncs``: host-device synchronisations per round under ``torch.cuda.set_sync_debug_mode("warn")`` (CUDA only);
- ``peak_memory``: peak GPU memory of exact-mla and SpecGuard after a 4k-token prompt (CUDA only);
- ``vllm_rule``: the vLLM V2 rule function (``fly_rejection_sample_v2``) on a 64-request batch on the device,
  greedy equal to its CPU result; a mixed greedy/sampled batch timed per request and on the padded layout
  (``LOOSESPEC_V2_SAMPLED_PATH``), whose greedy rows must agree.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / ".gpu-smoke"
PAIR = {"target": "qwen2.5-coder-1.5b-instruct", "draft": "qwen2.5-coder-0.5b-instruct"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
# what loosespec imports at run time beside torch (numpy is assumed: GPU images ship it with torch); wheels of the
# versions installed here are carried for those a GPU image lacks. Pure-Python or abi3 wheels, plus per-Python
# builds of the two small binary ones.
WHEELS = (
    "transformers",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
    "hf-xet",
    "tqdm",
    "filelock",
    "fsspec",
    "packaging",
    "jinja2",
    "typer",
    "click",
    "shellingham",
    "rich",
    "markdown-it-py",
    "mdurl",
    "pygments",
    "typing-extensions",
    "annotated-doc",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "idna",
    "certifi",
    "sniffio",
    "pytest",
    "pluggy",
    "iniconfig",
)
BINARY_WHEELS = ("regex", "pyyaml", "markupsafe")
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
TINY_TESTS = (
    "tests/decode/test_engine_tiny.py",
    "tests/decode/test_fly_e2e.py",
    "tests/decode/test_specguard.py",
    "tests/decode/test_draftlen.py",
    "tests/decode/test_static_cache.py",
    "tests/verify",
    "tests/integrations/test_vllm_rule.py",
)
PROMPT = (
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n\n"
    "def div(a, b):\n"
)


def _write(path: Path, text: str) -> None:
    """Replace ``path`` whole (temporary file and rename: a run killed mid-write leaves the last summary)."""
    try:
        from loosespec.fileio import atomic_write_text
    except ImportError:  # the checkout's loosespec not importable here: a plain write
        path.write_text(text)
        return
    atomic_write_text(path, text)


# ---------------------------------------------------------------------------------------------------------------
# prepare (here, with the network)
# ---------------------------------------------------------------------------------------------------------------


def prepare(args) -> int:
    """Copy the pair's configs and tokenizer into the assets folder and download the wheels listed above."""
    from loosespec.models import resolve

    out = Path(args.assets)
    out.mkdir(parents=True, exist_ok=True)
    for role, name in PAIR.items():
        src = Path(resolve(name, progress=True).path)
        dst = out / role
        dst.mkdir(exist_ok=True)
        shutil.copy2(src / "config.json", dst / "config.json")
        for f in TOKENIZER_FILES:  # the draft's, only where they differ from the target's (the pair shares one)
            same = (
                role != "target"
                and (out / "target" / f).exists()
                and (src / f).exists()
                and (out / "target" / f).read_bytes() == (src / f).read_bytes()
            )
            if (src / f).exists() and not same:
                shutil.copy2(src / f, dst / f)
            elif same and (dst / f).exists():
                (dst / f).unlink()
    if not args.no_wheels:
        wheels = out / "wheels"
        wheels.mkdir(exist_ok=True)
        pip = [
            sys.executable,
            "-m",
            "pip",
            "--disable-pip-version-check",
            "-q",
            "download",
            "--no-deps",
            "-d",
            str(wheels),
        ]

        def version(name):
            try:
                return md.version(name)
            except md.PackageNotFoundError:
                return None

        pure = [f"{n}=={version(n)}" for n in WHEELS if version(n)]
        subprocess.run([*pip, "--only-binary=:all:", *pure], check=True)
        for py in PYTHONS:
            binary = [f"{n}=={version(n)}" for n in BINARY_WHEELS if version(n)]
            subprocess.run(
                [
                    *pip,
                    "--only-binary=:all:",
                    "--python-version",
                    py,
                    "--platform",
                    "manylinux_2_17_x86_64",
                    "--platform",
                    "manylinux2014_x86_64",
                    *binary,
                ],
                check=False,
            )
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 2**20:.1f} MiB (the device run carries at most 64 MiB)")
    return 0 if size < 60 * 2**20 else 1


# ---------------------------------------------------------------------------------------------------------------
# run (there)
# ---------------------------------------------------------------------------------------------------------------


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def section(summary: dict, name: str, budget: Budget, need_s: float = 5.0):
    """Run a section's body, recording its time, its result and any error without stopping the run."""

    @contextlib.contextmanager
    def body():
        rec = summary["sections"].setdefault(name, {})
        if budget.left() < need_s:
            rec.update(ok=None, skipped=f"out of time budget ({budget.left():.0f} s left)")
            yield None
            return
        t = time.perf_counter()
        try:
            yield rec
            rec.setdefault("ok", True)
        except Exception as e:  # recorded, not raised: the other sections still run
            rec["ok"] = False
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc()[-3000:]
        finally:
            rec["seconds"] = round(time.perf_counter() - t, 2)
            if summary.get("out"):  # a run killed later still leaves what it measured
                _write(Path(summary["out"]), json.dumps(summary, indent=1, default=str) + "\n")
            ok = rec.get("ok")
            state = (
                "ok"
                if ok
                else f"FAILED: {rec.get('error', '')}"
                if ok is False
                else f"n/a: {rec.get('skipped') or rec.get('note', '')}"
            )
            print(f"# {name}: {state} ({rec.get('seconds', 0)} s)", file=sys.stderr, flush=True)

    return body()


def pinned_ranges() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    out = {}
    for line in re.findall(r'"([^"]+)"', deps):
        m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?(.*)", line)
        out[m.group(1).lower()] = m.group(3).strip()
    return out


def env_section(rec: dict, device) -> None:
    import torch

    rec["python"] = platform.python_version()
    rec["torch"] = torch.__version__
    rec["torch_cuda"] = torch.version.cuda
    rec["cuda_available"] = torch.cuda.is_available()
    from loosespec.hardware import describe_device

    # what every timing of this summary ran on: the host CPU (model, flags of note, threads), and the GPU
    rec["host"] = describe_device(device)
    if device.type == "cuda":
        from loosespec.hardware import cuda_bf16_native, resolve_precision

        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        rec["gpu"] = {
            "name": props.name,
            "capability": list(torch.cuda.get_device_capability(device)),
            "bf16_native": cuda_bf16_native(device),
            "bf16_supported_incl_emulation": torch.cuda.is_bf16_supported(),
            "memory_gib": round(total / 2**30, 1),
            "free_gib": round(free / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
        }
        rec["dtype_auto"] = resolve_precision("auto", "auto", device).to_dict()
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        SpecifierSet = None
    checks = {}
    for name, spec in pinned_ranges().items():
        try:
            v = md.version(name)
        except md.PackageNotFoundError:
            v = None
        ok = (
            None
            if v is None or SpecifierSet is None
            else SpecifierSet(spec).contains(v.split("+")[0], prereleases=True)
        )
        checks[name] = {"installed": v, "pinned": spec, "in_range": ok}
    rec["dependencies"] = checks
    rec["out_of_range"] = sorted(n for n, c in checks.items() if c["in_range"] is False)
    rec["missing"] = sorted(n for n, c in checks.items() if c["installed"] is None)
    rec["pip_list"] = sorted(f"{d.metadata['Name']}=={d.version}" for d in md.distributions() if d.metadata["Name"])
    try:
        import transformers

        rec["transformers_import"] = transformers.__version__
    except Exception as e:  # everything below needs it: say so once, plainly
        rec["transformers_import"] = f"FAILED: {e}"
        raise RuntimeError(f"transformers does not import here ({e}): carry its wheel (prepare) or install it")


def tests_section(rec: dict, device, budget: Budget, files) -> None:
    junit = Path(tempfile.mkdtemp()) / "junit.xml"
    env = {
        **os.environ,
        "LOOSESPEC_TEST_DEVICE": str(device),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "not real_model and not default_pair and not vllm",
        f"--junitxml={junit}",
        *files,
    ]
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(30.0, budget.left() - 240)
        )
        rec["returncode"] = proc.returncode
        rec["tail"] = proc.stdout[-2500:]
    except subprocess.TimeoutExpired as e:
        rec["returncode"] = None
        rec["tail"] = (
            (e.stdout or b"")[-2500:].decode(errors="replace") if isinstance(e.stdout, bytes) else str(e.stdout)[-2500:]
        )
        rec["timed_out"] = True
    if junit.exists():
        import xml.etree.ElementTree as ET

        root = ET.parse(junit).getroot()
        suites = [root] if root.tag == "testsuite" else list(root)
        rec["counts"] = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
        rec["failed"] = [
            f"{c.get('classname')}::{c.get('name')}"
            for s in suites
            for c in s.iter("testcase")
            if c.find("failure") is not None or c.find("error") is not None
        ][:40]
    rec["ok"] = rec.get("returncode") == 0


def shrink(cfg):
    """The config at a size a 2-core CPU runs the whole smoke with (depth 2, width 64; the vocabulary stays)."""
    cfg = copy.deepcopy(cfg)
    cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size = 2, 64, 128
    cfg.num_attention_heads, cfg.num_key_value_heads = 4, 2
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:2]
    if hasattr(cfg, "max_window_layers"):
        cfg.max_window_layers = 2
    if hasattr(cfg, "head_dim"):
        cfg.head_dim = 16
    return cfg


def build_models(rec: dict, assets: Path, work: Path, device, size: str) -> dict[str, Path]:
    """Random-weight target, draft and self-draft directories, with the pair's tokenizer files."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dirs = {}
    build_device = device if device.type == "cuda" else torch.device("cpu")
    for role in ("target", "draft"):
        cfg = AutoConfig.from_pretrained(assets / role)
        if size == "tiny":
            cfg = shrink(cfg)
        torch.manual_seed(0 if role == "target" else 1)
        with build_device:
            model = AutoModelForCausalLM.from_config(
                cfg, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32
            )
        with torch.no_grad():
            if not cfg.tie_word_embeddings:  # peaked logits: greedy choices well apart, outputs that loop
                model.lm_head.weight.mul_(30.0)
        names = [role] + (["selfdraft"] if role == "target" else [])
        for name in names:
            if name == "selfdraft":  # the target with 5% weight noise: agrees often, not always
                g = torch.Generator(device=build_device).manual_seed(2)
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(
                            torch.randn(p.shape, generator=g, device=build_device, dtype=p.dtype)
                            * p.float().std().to(p.dtype)
                            * 0.05
                        )
            d = work / name
            model.save_pretrained(d)
            for f in TOKENIZER_FILES:  # the draft's own where prepare kept them, else the target's (shared)
                src = assets / role / f if (assets / role / f).exists() else assets / "target" / f
                if src.exists():
                    shutil.copy2(src, d / f)
            dirs[name] = d
        rec[role] = {
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size,
            "vocab": cfg.vocab_size,
        }
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return dirs


def generation_runs(device):
    """(method, drafter, temperature, extra knobs) for the matrix."""
    runs = [("ar", None, 0.0, {}), ("ar", None, 0.7, {})]
    for drafter in ("ngram", "model", "mla"):
        runs.append(("exact", drafter, 0.0, {}))
        for t in (0.0, 0.7):
            runs.append(("rejection", drafter, t, {}))
            runs.append(("fly", drafter, t, {}))
            if t:
                runs.append(("fly", drafter, t, {"fly_sampling": "rejection"}))
    for t in (0.0, 0.7):
        runs.append(
            (
                "specguard",
                "ngram",
                t,
                {"sg_tau": 0.5, "sg_candidates": 2, "sg_max_step_tokens": 16, "sg_delimiter": "\n"},
            )
        )
    return runs


def run_one(engine, method, drafter, temperature, knobs, max_new_tokens, prompt=PROMPT):
    from loosespec import DecodeConfig

    cfg = DecodeConfig.create(
        method,
        drafter,
        has_draft_model=engine.draft is not None,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=0,
        adaptive_draft_length=False,
        **knobs,
    )
    r = engine.generate(prompt, cfg, raw=True)
    st = r.stats.to_dict()
    return {
        "new_tokens": st["new_tokens"],
        "rounds": st["rounds"],
        "acceptance_rate": st["acceptance_rate"],
        "mean_accepted_length": st["mean_accepted_length"],
        "tokens_per_s": st["tokens_per_s"],
        "wall_s": st["wall_s"],
        "fly_deferred": st.get("fly_deferred"),
        "finish": r.finish_reason,
    }


def dtypes_for(device) -> list[str]:
    from loosespec.hardware import cuda_bf16_native

    if device.type == "cuda" and not cuda_bf16_native(device):
        return ["float32", "float16"]  # no native bfloat16 (pre-Ampere): float16 is the one to check
    return ["bfloat16", "float16"]


def matrix_section(rec: dict, dirs: dict, device, max_new_tokens: int, budget: Budget) -> None:
    import torch

    from loosespec.decode.engine import Engine

    rec["runs"], failures = [], []
    deferred = {}
    for dtype in dtypes_for(device):
        if budget.left() < 60:
            rec.setdefault("skipped", []).append(f"{dtype}: out of time")
            continue
        engine = Engine.load(str(dirs["target"]), str(dirs["draft"]), dtype=dtype, device=str(device), progress=False)
        for method, drafter, t, knobs in generation_runs(device):
            row = {"dtype": dtype, "method": method, "drafter": drafter, "temperature": t, **knobs}
            if budget.left() < 45:  # leave time for the gate-open check and the later sections
                rec.setdefault("skipped", []).append(f"{dtype} {method}-{drafter} T={t}: out of time")
                continue
            try:
                row.update(run_one(engine, method, drafter, t, knobs, max_new_tokens))
                row["ok"] = row["new_tokens"] > 0
            except Exception as e:
                row.update(ok=False, error=f"{type(e).__name__}: {e}"[:400])
            if not row["ok"]:
                failures.append(row)
            rec["runs"].append(row)
            print(
                f"  {dtype} {method}-{drafter} T={t}: {'ok' if row['ok'] else row.get('error')} "
                f"({row.get('wall_s')} s)",
                file=sys.stderr,
                flush=True,
            )
        del engine
        # FLy with its gate open (theta 0) on a draft that agrees with the target often: it must defer
        selfpair = Engine.load(
            str(dirs["target"]), str(dirs["selfdraft"]), dtype=dtype, device=str(device), progress=False
        )
        for drafter in ("ngram", "model", "mla"):
            row = {
                "dtype": dtype,
                "method": "fly",
                "drafter": drafter,
                "temperature": 0.0,
                "pair": "self-draft",
                "fly_entropy_threshold": 0.0,
            }
            try:
                row.update(run_one(selfpair, "fly", drafter, 0.0, {"fly_entropy_threshold": 0.0}, max_new_tokens))
                row["ok"] = row["new_tokens"] > 0
            except Exception as e:
                row.update(ok=False, error=f"{type(e).__name__}: {e}"[:400])
            deferred[f"{dtype}/{drafter}"] = row.get("fly_deferred") or 0
            rec["runs"].append(row)
        del selfpair
        if device.type == "cuda":
            torch.cuda.empty_cache()
    rec["fly_gate_open_deferred"] = deferred
    rec["failures"] = len(failures)
    rec["fly_deferred_somewhere"] = any(v > 0 for v in deferred.values())
    rec["ok"] = not failures and rec["fly_deferred_somewhere"]


def rule_cost_section(rec: dict, dirs: dict, device, size: str) -> None:
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    if device.type == "cuda":
        from loosespec.hardware import cuda_bf16_native

        dtype = "bfloat16" if cuda_bf16_native(device) else "float16"
    for role in ("target", "draft"):
        out = Path(tempfile.mkdtemp()) / "cost.json"
        cmd = [
            sys.executable,
            str(ROOT / "benchmarks" / "rule_cost.py"),
            "--target",
            str(dirs[role]),
            "--device",
            str(device),
            "--dtype",
            dtype,
            "--quantize",
            "none",
            "--json",
            str(out),
        ]
        if size == "tiny":
            cmd += ["--prompt-tokens", "64", "--repeat", "2"]
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
        )
        rec[role] = json.loads(out.read_text()) if out.exists() else {"error": proc.stderr[-1500:]}
        rec[role]["stdout"] = proc.stdout[-1500:]
        if proc.returncode:
            raise RuntimeError(f"rule_cost.py on the {role} exited {proc.returncode}: {proc.stderr[-500:]}")


def syncs_section(rec: dict, dirs: dict, device, max_new_tokens: int) -> None:
    """Host-device synchronisations per round: torch reports each one as a warning in "warn" mode."""
    import warnings

    import torch

    from loosespec import DecodeConfig
    from loosespec.decode.engine import Engine

    if device.type != "cuda":
        rec.update(ok=None, note="CUDA only (torch.cuda.set_sync_debug_mode)")
        return
    engine = Engine.load(
        str(dirs["target"]), str(dirs["selfdraft"]), dtype=dtypes_for(device)[0], device=str(device), progress=False
    )
    for method, drafter, k in (
        ("ar", None, None),
        ("exact", "ngram", 10),
        ("exact", "mla", 15),
        ("fly", "mla", 15),
        ("fly", "model", 15),
        ("rejection", "mla", 15),
    ):
        cfg = DecodeConfig.create(
            method,
            drafter,
            num_draft_tokens=k,
            has_draft_model=True,
            max_new_tokens=max_new_tokens,
            temperature=0.7 if method == "rejection" else 0.0,
            adaptive_draft_length=False,
        )
        engine.generate(PROMPT, cfg, raw=True)  # warm-up
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                r = engine.generate(PROMPT, cfg, raw=True)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum(1 for w in caught if "synchroniz" in str(w.message).lower())
        rounds = max(1, r.stats.rounds)
        rec[f"{method}-{drafter or 'none'}"] = {
            "syncs": syncs,
            "rounds": r.stats.rounds,
            "syncs_per_round": round(syncs / rounds, 2),
            "k": k,
            "tokens_per_s": round(r.stats.tokens_per_s, 1),
        }


def static_compile_section(rec: dict, dirs: dict, device, max_new_tokens: int) -> None:
    """Issue 22, 5: the dynamic cache against the static cache and the compiled fixed-shape forwards (CUDA
    graphs on a GPU), on the self-draft pair: tokens/s, the first (compiling) run's time, same tokens.
    On the CPU the compiled path runs dynamo's tracing only (backend eager): inductor takes minutes here."""
    import time

    from loosespec import DecodeConfig
    from loosespec.decode.engine import Engine

    dtype = dtypes_for(device)[0]
    base = Engine.load(str(dirs["target"]), str(dirs["selfdraft"]), dtype=dtype, device=str(device), progress=False)
    backend = "inductor" if device.type == "cuda" else "eager"
    engines = {
        "dynamic": base,
        "static": Engine(base.target, base.draft, cache_implementation="static", max_cache_len=2048),
        "static-compiled": Engine(
            base.target,
            base.draft,
            cache_implementation="static",
            max_cache_len=2048,
            compile=True,
            compile_backend=backend,
        ),
    }
    rec.update(dtype=dtype, compile_backend=backend)
    for method, drafter, k in (("ar", None, None), ("exact", "model", 15)):
        cfg = DecodeConfig.create(
            method,
            drafter,
            num_draft_tokens=k,
            has_draft_model=True,
            max_new_tokens=max_new_tokens,
            adaptive_draft_length=False,
        )
        tokens, row = {}, {}
        for name, engine in engines.items():
            t0 = time.perf_counter()
            engine.generate(PROMPT, cfg, raw=True)  # the first run compiles
            first = time.perf_counter() - t0
            r = engine.generate(PROMPT, cfg, raw=True)
            tokens[name] = r.token_ids
            row[name] = {
                "tokens_per_s": round(r.stats.tokens_per_s, 1),
                "first_run_s": round(first, 1),
                "compiled_forwards": getattr(engine.target_lm, "compiled_forwards", None),
            }
        row["same_tokens"] = {n: tokens[n] == tokens["dynamic"] for n in tokens if n != "dynamic"}
        row["speedup_compiled_over_dynamic"] = round(
            row["static-compiled"]["tokens_per_s"] / max(row["dynamic"]["tokens_per_s"], 1e-9), 2
        )
        rec[f"{method}-{drafter or 'none'}"] = row
    rec["ok"] = all(
        all(r["same_tokens"].values()) for key, r in rec.items() if isinstance(r, dict) and "same_tokens" in r
    )


def peak_memory_section(rec: dict, dirs: dict, device, prompt_tokens: int) -> None:
    import torch

    from loosespec import DecodeConfig
    from loosespec.decode.engine import Engine

    if device.type != "cuda":
        rec.update(ok=None, note="CUDA only (torch.cuda.max_memory_allocated)")
        return
    engine = Engine.load(
        str(dirs["target"]), str(dirs["draft"]), dtype=dtypes_for(device)[0], device=str(device), progress=False
    )
    ids = engine.tokenizer(PROMPT * (prompt_tokens // 40 + 1), return_tensors="pt")["input_ids"][:, :prompt_tokens]
    rec["weights_gib"] = round(torch.cuda.memory_allocated(device) / 2**30, 2)
    for name, method, drafter, knobs in (
        ("exact-mla", "exact", "mla", {}),
        ("specguard", "specguard", "ngram", {"sg_tau": 0.5, "sg_candidates": 2, "sg_max_step_tokens": 16}),
    ):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        cfg = DecodeConfig.create(
            method, drafter, has_draft_model=True, max_new_tokens=32, adaptive_draft_length=False, **knobs
        )
        r = engine.generate(ids.to(device), cfg)  # a 2-D prompt already on the GPU (issue 22, 3)
        rec[name] = {
            "prompt_tokens": int(ids.shape[1]),
            "new_tokens": r.stats.new_tokens,
            "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
        }


def vllm_rule_section(rec: dict, device, vocab: int, requests: int = 64, k: int = 15) -> None:
    """fly_rejection_sample_v2 on a V2-shaped batch: greedy requests must rule identically on the device and the
    CPU; sampled requests (generators differ between devices) must give well-formed output."""
    import torch

    from loosespec.integrations.vllm.rule import FlySettings, fly_rejection_sample_v2

    g = torch.Generator().manual_seed(0)
    lens = torch.randint(0, k + 1, (requests,), generator=g)
    lens[0] = k
    rows = int((lens + 1).sum())
    cu = torch.cat([torch.zeros(1, dtype=torch.long), (lens + 1).cumsum(0)])
    raw = torch.randn(rows, vocab, generator=g)
    hot = torch.randint(0, vocab, (rows,), generator=g)
    raw[torch.arange(rows), hot] += torch.where(torch.rand(rows, generator=g) < 0.7, 12.0, 1.0)  # some uncertain
    sampled = torch.zeros(rows, dtype=torch.long)
    for r in range(requests):  # drafts: the target's argmax mostly, a few mismatches
        lo, n = int(cu[r]), int(lens[r])
        d = hot[lo : lo + n].clone()
        flip = torch.rand(n, generator=g) < 0.25
        d[flip] = torch.randint(0, vocab, (int(flip.sum()),), generator=g)
        sampled[lo + 1 : lo + 1 + n] = d
    pos = torch.arange(rows)
    idx = torch.randperm(requests, generator=g)
    settings = FlySettings(fly_entropy_threshold=0.0)  # gate open: deferral paths run

    def call(dev, temperature, sampled_path="per-request"):
        t = lambda x: x.to(dev)
        return fly_rejection_sample_v2(
            t(raw),
            t(raw),
            None,
            t(sampled),
            t(cu),
            t(pos),
            t(idx),
            t(temperature),
            t(torch.arange(requests)),
            k,
            settings,
            sampled_path=sampled_path,
        )

    def timed(dev, temperature, sampled_path="per-request"):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = call(dev, temperature, sampled_path)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return result, round((time.perf_counter() - t0) * 1e3, 2)

    greedy_t = torch.zeros(requests)
    cpu = call(torch.device("cpu"), greedy_t)
    dev, rec["greedy_ms"] = timed(device, greedy_t)
    rec["greedy_equal_to_cpu"] = bool(
        torch.equal(cpu[0], dev[0].cpu()) and torch.equal(cpu[1], dev[1].cpu()) and cpu[2] == dev[2]
    )
    rec["events"] = dev[2]
    mixed_t = torch.where(torch.arange(requests) % 2 == 0, torch.tensor(0.0), torch.tensor(0.7))
    greedy_rows = [i for i in range(requests) if float(mixed_t[idx[i]]) == 0.0]
    well_formed = True
    # a batch with sampled requests: per request (the default) and on the padded layout (LOOSESPEC_V2_SAMPLED_PATH)
    for path in ("per-request", "padded"):
        call(device, mixed_t, path)  # warm-up
        (s, n, _), ms = timed(device, mixed_t, path)
        s, n = s.cpu(), n.cpu()
        ok = bool(((n >= 1) & (n <= lens + 1)).all()) and all(
            bool((s[i, : int(n[i])] >= 0).all() and (s[i, int(n[i]) :] == -1).all()) for i in range(requests)
        )
        if path == "per-request":
            per_request = s
        else:  # greedy requests: the same rows on either path
            ok = ok and all(torch.equal(s[i], per_request[i]) for i in greedy_rows)
        rec[f"mixed_{path}_ms"] = ms
        rec[f"mixed_{path}_well_formed"] = ok
        well_formed = well_formed and ok
    rec["mixed_well_formed"] = well_formed
    rec.update(requests=requests, k=k, vocab=vocab)
    rec["ok"] = rec["greedy_equal_to_cpu"] and well_formed


def run(args) -> int:
    import torch

    budget = Budget(args.budget_s)
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    summary = {
        "script": "benchmarks/gpu_smoke.py",
        "device": str(device),
        "size": args.size,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sections": {},
    }
    if device.type == "cuda" and not torch.cuda.is_available():
        summary["error"] = "--device cuda but torch sees no CUDA device"
    assets = Path(args.assets)
    work = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    summary["out"] = str(args.out)
    import signal

    signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(SystemExit(143)))  # finally: the summary
    skip = set(filter(None, args.skip.split(",")))
    dirs = None
    try:
        with section(summary, "env", budget) as rec:
            if rec is not None:
                env_section(rec, device)
        if "tests" not in skip:
            with section(summary, "tests", budget, need_s=240) as rec:
                if rec is not None:
                    tests_section(rec, device, budget, args.tests.split(",") if args.tests else TINY_TESTS)
        with section(summary, "models", budget) as rec:
            if rec is not None:
                if not (assets / "target" / "config.json").exists():
                    raise FileNotFoundError(f"{assets}/target/config.json: run `gpu_smoke.py prepare` first")
                dirs = build_models(rec, assets, work, device, args.size)
        if dirs is not None:
            plan = [
                ("matrix", 90, lambda r: matrix_section(r, dirs, device, args.max_new_tokens, budget)),
                ("rule_cost", 30, lambda r: rule_cost_section(r, dirs, device, args.size)),
                ("syncs", 20, lambda r: syncs_section(r, dirs, device, args.max_new_tokens)),
                ("peak_memory", 20, lambda r: peak_memory_section(r, dirs, device, args.long_prompt)),
                ("static_compile", 150, lambda r: static_compile_section(r, dirs, device, args.max_new_tokens)),
            ]
            for name, need, fn in plan:
                if name in skip:
                    continue
                with section(summary, name, budget, need_s=need) as rec:
                    if rec is not None:
                        fn(rec)
        if "vllm_rule" not in skip:
            with section(summary, "vllm_rule", budget) as rec:
                if rec is not None:
                    vllm_rule_section(rec, device, args.vllm_vocab)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        secs = summary["sections"]
        summary["ok"] = all(s.get("ok") is not False for s in secs.values()) and "error" not in summary
        summary["failed_sections"] = [n for n, s in secs.items() if s.get("ok") is False]
        summary["seconds"] = round(args.budget_s - budget.left(), 1)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        _write(out, json.dumps(summary, indent=1, default=str) + "\n")
        print(
            f"# summary: {out} (ok={summary['ok']}, failed: {summary['failed_sections'] or 'none'}, "
            f"{summary['seconds']} s)",
            file=sys.stderr,
        )
    return 0 if summary["ok"] else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="copy configs and tokenizer, download wheels (here, with the network)")
    p.add_argument("--assets", default=str(ASSETS))
    p.add_argument("--no-wheels", action="store_true")
    r = sub.add_parser("run", help="the smoke run (no network)")
    r.add_argument("--device", default="auto")
    r.add_argument("--assets", default=str(ASSETS))
    r.add_argument("--out", default=os.path.join(os.environ.get("OUT", str(ROOT / "results")), "gpu_smoke.json"))
    r.add_argument("--size", choices=("full", "tiny"), default=None, help="full on CUDA, tiny on the CPU by default")
    r.add_argument("--max-new-tokens", type=int, default=None)
    r.add_argument("--long-prompt", type=int, default=4096)
    r.add_argument(
        "--vllm-vocab",
        type=int,
        default=None,
        help="vocabulary of the 64-request batch (default: the target's 151936 on CUDA, 4096 on the CPU)",
    )
    r.add_argument("--budget-s", type=float, default=450.0)
    r.add_argument("--tests", default="", help="comma-separated test paths (default: the tiny-model test files)")
    r.add_argument("--skip", default="", help="comma-separated sections to skip")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        return prepare(args)
    cuda = args.device.startswith("cuda") or args.device == "auto" and __import__("torch").cuda.is_available()
    args.size = args.size or ("full" if cuda else "tiny")
    args.max_new_tokens = args.max_new_tokens or (48 if cuda else 24)
    args.vllm_vocab = args.vllm_vocab or (151936 if cuda else 4096)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
