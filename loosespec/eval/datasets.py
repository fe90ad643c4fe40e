"""Evaluation sets shipped with loosespec (``loosespec/eval/data``, see its README): the registry.

Datasets (``load_dataset(name, limit, directory, **options)``; ``DATASETS`` is the registry)
---------------------------------------------------------------------------------------------
``limit`` always means "the first ``limit`` problems in file order" of each group named below. The prompts
(``GSM8K_PROMPT`` ...) are :mod:`loosespec.eval.loaders`' constants.

- ``gsm8k``: GSM8K test (1319). Prompt :data:`GSM8K_PROMPT`; id ``gsm8k/<row>``; category ``gsm8k``.
- ``gsm8k-train``: GSM8K train (7473), as ``gsm8k``; id ``gsm8k-train/<row>``. For calibration only
  (``loosespec calibrate``'s default), so that no benchmark problem is calibrated on.
- ``mgsm``: MGSM (250 per language). Option ``lang="en"``: one of the 11 languages, a comma list
  (``"de,zh"``) or a list, or ``"all"``. The prompt is :data:`MGSM_PROMPT`, the GSM8K instruction
  kept in English (so every language gets the same instruction and the same "The answer is N."
  line to score; only the question is in its language). Problems are grouped by language in the
  order given; ``limit`` applies per language. id ``mgsm/<lang>/<id>``; category ``mgsm-<lang>``.
- ``math500``: MATH-500 (500). Prompt :data:`MATH500_PROMPT` (final answer in ``\\boxed{}``);
  id ``math500/<unique_id>``; category = subject (e.g. ``Precalculus``); meta has level.
- ``humaneval``: HumanEval (164). Prompt :data:`HUMANEVAL_PROMPT` (the format of
  the earlier runs); id = task_id (``HumanEval/0``); category ``humaneval``; ``answer`` is the
  canonical solution (gold body); meta has task_id, prompt, test, entry_point.
- ``mbpp-train``: MBPP's train split (task_id 601..974, 374 problems), each as a HumanEval-style stub
  (the reference's imports and signature, a docstring with the task and its asserts) in
  :data:`HUMANEVAL_PROMPT`; id ``mbpp-train/<task_id>``; category ``mbpp-train``; ``answer`` is the
  reference code; meta as humaneval's, so it is scored like humaneval. For calibration only, so that
  no benchmark problem (HumanEval) is calibrated on.
- ``specbench``: Spec-Bench (480), first turn only. Option ``category=None``: one of the six task
  types ``mt_bench`` (the 80 MT-Bench rows, question_id 81..160), ``translation``,
  ``summarization``, ``qa``, ``math_reasoning``, ``rag``, or one of the eight MT-Bench categories
  (``writing`` ...), or a comma list of those; ``None`` = all six task types. ``limit`` applies per
  selected task type / category (``limit=5`` without ``category`` -> 30 problems; ``mt_bench``
  takes its eight categories round-robin, so 5 gives writing, roleplay, reasoning, math, coding).
  id ``specbench/<question_id>``; category = the task type, as Spec-Bench reports; meta ``task``
  (the task type) and ``category`` (the row's own, e.g. ``writing``). No scorer.
- ``mtbench``: MT-Bench (80), first turn only; ``limit`` = first rows of the file. id
  ``mtbench/<question_id>``; category = its category; meta has the second turn. No scorer.
- ``niah``: needle in a haystack over Paul Graham essays; see :func:`~loosespec.eval.niah.niah`. Options
  ``context_lengths=(1024, 2048, 4096)`` (tokens), ``depths=(0.0, 0.25, 0.5, 0.75, 1.0)``,
  ``count_tokens=None``, ``seed=0``. Problems ordered by (length, depth); ``limit`` = first of them.
  id ``niah/<length>/<depth>``; category ``niah-<length>``.

Where each file is read from: :mod:`loosespec.eval.datafiles`; the loaders: :mod:`loosespec.eval.loaders` and
:mod:`loosespec.eval.niah`. Scorers (``score(name, problem, output)``, ``judge``; one line each in
:data:`SCORERS_DOC`, the rules in :mod:`loosespec.eval.scoring`): GSM8K and MGSM by the number the output ends
with, MATH-500 by ``math_verify``, HumanEval and MBPP by running the code against the tests in the sandbox, NIAH
by the needle's code; Spec-Bench and MT-Bench have no scorer (``score`` returns ``None``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from loosespec.errors import LoosespecError
from loosespec.eval.datafiles import Problem
from loosespec.eval.loaders import gsm8k, gsm8k_train, humaneval, math500, mbpp_train, mgsm, mtbench, specbench
from loosespec.eval.niah import niah
from loosespec.eval.scoring import (
    CODE_EXECUTION_REFUSAL,
    ScoringError,
    Verdict,
    as_verdict,
    code_execution_allowed,
    score_humaneval,
    score_math500,
    score_niah,
    score_number,
)


@dataclass(frozen=True)
class DatasetSpec:
    """One evaluation set: its loader, load options (name -> default), scorer and score options.

    ``short_answer``: a problem's ``answer`` is an answer to show beside an output (a number, an expression,
    a needle), not a reference solution that tests stand in for (HumanEval's canonical solution)."""

    name: str
    loader: Callable[..., list[Problem]]
    options: Mapping[str, Any]
    scorer: Callable[..., bool] | None
    score_options: Mapping[str, Any]
    scorer_doc: str
    short_answer: bool = True

    def __call__(self, limit: int | None = None, directory: str | Path | None = None, **options) -> list[Problem]:
        return self.loader(limit, directory, **options)  # DATASETS[name](limit, directory) as before


_CODE_SCORE_OPTIONS = {"timeout_s": 10.0, "memory_mb": 1024, "allow_code_execution": False, "sandbox": None}

DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in (
        DatasetSpec(
            "gsm8k",
            gsm8k,
            {},
            score_number,
            {},
            "numeric: extract_number (last 'The answer is N', else '#### N' or \\boxed{N}, else the last number) "
            "== gold",
        ),
        DatasetSpec(
            "gsm8k-train", gsm8k_train, {}, score_number, {}, "as gsm8k (GSM8K's train split, for calibration)"
        ),
        DatasetSpec(
            "mgsm",
            mgsm,
            {"lang": "en"},
            score_number,
            {},
            "numeric, as gsm8k: extract_number (last 'The answer is N', else the last number) == answer_number",
        ),
        DatasetSpec(
            "math500",
            math500,
            {},
            score_math500,
            {},
            "math_verify: verify(parse('$' + gold + '$'), parse(output)), \\boxed{} content preferred",
        ),
        DatasetSpec(
            "humaneval",
            humaneval,
            {},
            score_humaneval,
            _CODE_SCORE_OPTIONS,
            "pass@1: code from the reply's ```python block (full function or body) + tests run in the sandbox",
            short_answer=False,
        ),
        DatasetSpec(
            "mbpp-train",
            mbpp_train,
            {},
            score_humaneval,
            _CODE_SCORE_OPTIONS,
            "pass@1 as humaneval: code from the reply + MBPP's asserts run in the sandbox (MBPP's train split, "
            "for calibration)",
            short_answer=False,
        ),
        DatasetSpec(
            "specbench", specbench, {"category": None}, None, {}, "none: judged only by agreement with the ar output"
        ),
        DatasetSpec("mtbench", mtbench, {}, None, {}, "none: judged only by agreement with the ar output"),
        DatasetSpec(
            "niah",
            niah,
            {
                "context_lengths": (1024, 2048, 4096),
                "depths": (0.0, 0.25, 0.5, 0.75, 1.0),
                "count_tokens": None,
                "seed": 0,
            },
            score_niah,
            {},
            "exact retrieval: the needle's code (e.g. 7319-BRAVO, any case/separator) appears in the output",
        ),
    )
}

SCORERS_DOC: dict[str, str] = {name: spec.scorer_doc for name, spec in DATASETS.items()}


def _spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise LoosespecError(f"unknown dataset '{name}'; choose one of: {', '.join(DATASETS)}")
    return DATASETS[name]


def _check_options(name: str, given: Mapping[str, Any], valid: Mapping[str, Any], what: str) -> None:
    unknown = [k for k in given if k not in valid]
    if unknown:
        choices = ", ".join(valid) if valid else "none"
        raise LoosespecError(
            f"unknown {what} option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for "
            f"dataset '{name}'; valid: {choices}"
        )


def load_dataset(name: str, limit: int | None = None, directory: str | Path | None = None, **options) -> list[Problem]:
    """The problems of dataset ``name`` (see the module docstring for options and ``limit`` semantics)."""
    spec = _spec(name)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise LoosespecError(f"limit must be a positive integer, got {limit}")
    _check_options(name, options, spec.options, "load")
    return spec.loader(limit, directory, **options)


def judge(name: str, problem: Problem, output: str, **options) -> Verdict:
    """What scoring ``output`` for ``problem`` of dataset ``name`` found, as a :class:`Verdict`.

    Never raises for a failure of the scoring itself (a sandbox that could not start, a scorer's bug): that is
    ``Verdict("error", ...)``, no answer. A program under test that fails, times out or runs out of memory is
    ``"wrong"``. Bad options, and code execution that was not allowed, still raise :class:`LoosespecError`.
    Options of the sets that run code (humaneval, mbpp-train): ``allow_code_execution`` (False: see
    :func:`~loosespec.eval.scoring.code_execution_allowed`), ``sandbox`` (None: :func:`loosespec.eval.sandbox_probe.resolve_mode`'s),
    ``timeout_s`` (10) and ``memory_mb`` (1024).
    """
    spec = _spec(name)
    _check_options(name, options, spec.score_options, "score")
    if spec.scorer is None:
        return Verdict("unscored")
    try:
        return as_verdict(spec.scorer(problem, output, **options))
    except ScoringError as e:
        return Verdict("error", {"error": str(e), **e.detail})
    except LoosespecError:
        raise
    except Exception as e:  # a scorer's bug is the harness's failure, not a wrong answer
        return Verdict("error", {"error": f"{type(e).__name__}: {e}"})


def score(name: str, problem: Problem, output: str, **options) -> bool | None:
    """Whether ``output`` answers ``problem`` of dataset ``name``; ``None`` when the set has no scorer.

    Raises :class:`ScoringError` when the scoring itself failed (see :func:`judge`, which reports it instead).
    """
    v = judge(name, problem, output, **options)
    if v.status == "error":
        raise ScoringError(v.detail.get("error", "scoring failed"), v.detail)
    return v.score


def executes_code(name: str) -> bool:
    """Whether scoring dataset ``name`` runs model-written code (HumanEval, MBPP)."""
    return _spec(name).scorer is score_humaneval


def check_code_execution(names: Sequence[str], allow: bool = False, sandbox: str | None = None) -> str | None:
    """Before a run: refuse (one line) a set whose scoring runs model-written code unless it was allowed, and
    resolve the sandbox mode it will run in (None when no set runs code). Raises :class:`LoosespecError`."""
    code_sets = [n for n in dict.fromkeys(names) if executes_code(n)]
    if not code_sets:
        return None
    if not code_execution_allowed(allow):
        raise LoosespecError(CODE_EXECUTION_REFUSAL.format(name=" and ".join(code_sets)))
    from loosespec.eval.sandbox_probe import resolve_mode

    return resolve_mode(sandbox)
