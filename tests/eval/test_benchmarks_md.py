"""BENCHMARKS.md quotes only what the committed result files say."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_benchmarks_md_tables_match_the_result_files(capsys):
    """``python benchmarks/update_benchmarks_md.py --check``, in this process: the prose test below reuses its
    summaries (stats.bootstrap_ratio remembers what it computed)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "update_benchmarks_md", ROOT / "benchmarks" / "update_benchmarks_md.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, capsys.readouterr().err


def test_every_reported_directory_exists():
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    dirs = [line.split()[2] for line in text.splitlines() if line.startswith("<!-- report ")]
    assert len(dirs) >= 4
    for d in dirs:
        assert (ROOT / d / "results.jsonl").is_file(), d


# ------------------------------------------------------------------ numbers quoted in prose, outside the blocks


def _methods(directory: str) -> dict:
    from loosespec.eval.report import report

    summary, _ = report(ROOT / directory, draw=False, write=False)
    return summary["methods"]


def _speed(name: str, group: str) -> dict:
    """A benchmarks/speed.py result file's summary of one prompt group (results/<name>.json)."""
    import json

    return json.loads((ROOT / "results" / f"{name}.json").read_text(encoding="utf-8"))["summary"][group]


def _integration_lengths() -> tuple[str, str]:
    """make test-vllm's mean accepted lengths (exact, fly), from its committed log excerpt."""
    import re

    text = (ROOT / "results" / "vllm_integration.txt").read_text(encoding="utf-8")
    m = re.search(r"^mean accepted length: exact (\d+\.\d+), fly (\d+\.\d+)$", text, re.M)
    assert m, "results/vllm_integration.txt has no 'mean accepted length' line"
    return m[1], m[2]


def _calibration() -> dict:
    """`make calibrate-specguard`'s committed run, re-analysed from its step records."""
    import json

    from loosespec.eval.calibrate import analyse_report

    rep = json.loads((ROOT / "results/calibration/specguard.json").read_text(encoding="utf-8"))
    a = analyse_report(rep)
    best = {
        v: max((g for g in a["grid"] if g["sg_confidence"] == v), key=lambda g: g["auc_target_prefers"])
        for v in ("min", "mean")
    }
    return {
        "problems": rep["problems"],
        "steps": a["steps"],
        "prefers": a["target_prefers_rate"],
        "choice": a["choice"],
        "best": best,
        "signals": a["signals"],
        "grid": a["grid"],
    }


def _quoted_figures() -> list[tuple[str, str]]:
    """(file, sentence) for every figure the prose quotes from a committed result, each sentence written
    here with its numbers computed from the result files, so a rerun that changes them fails until the
    prose says the new ones."""

    def f(v, spec=".2f"):
        return format(v, spec)

    def right(s):
        return round(s["accuracy"] * s["scored"])

    g, h, load = (
        _methods("results/bench/vllm/gsm8k"),
        _methods("results/bench/vllm/humaneval"),
        _methods("results/bench/vllm/gsm8k-load"),
    )
    exact_len, fly_len = _integration_lengths()
    lossless, sg = _speed("speed_lossless", "humaneval"), _speed("specguard_gsm8k", "gsm8k")
    xtok = {
        (s, d): _methods(f"results/bench/xtok/{s}-{d}")
        for s in ("humaneval", "mtbench")
        for d in ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")
    }
    qwen, smol, gemma = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"
    assert all(right(s) == right(g["vllm-ar"]) for s in g.values()) and g["vllm-ar"]["scored"] == 3
    assert all(right(s) == right(load["vllm-ar"]) for s in load.values()) and load["vllm-ar"]["scored"] == 8
    assert lossless["exact-model"]["identical_to_ar"] == lossless["exact-model"]["prompts"]
    B, V = "BENCHMARKS.md", "docs/vllm.md"
    Bd, Mt = "docs/bench.md", "docs/methods.md"  # the README's results paragraph and departures table, moved
    from loosespec.eval.failures import retention

    cal = _calibration()
    ev = _methods("results/bench/evidence/gsm8k")
    keep = retention(ROOT / "results/bench/evidence/gsm8k")["fly-mla"]
    assert keep["verdict"].startswith("not decided")  # what docs/bench.md says of it
    from loosespec.eval.failures import openings

    mg = retention(ROOT / "results/bench/evidence/mgsm")["fly-mla"]
    math = retention(ROOT / "results/bench/evidence/math500")
    mf, msg = math["fly-mla"], math["specguard"]
    math_ident = _methods("results/bench/evidence/math500")["fly-mla"]
    per_set = {
        label: retention(ROOT / "results/bench/evidence" / d)["fly-mla"]
        for label, d in (("GSM8K", "gsm8k"), ("NIAH", "niah"), ("MGSM zh + ja", "mgsm"), ("MATH-500", "math500"))
    }
    assert mg["verdict"].startswith("not decided")  # what docs/bench.md and BENCHMARKS.md say of it
    mg_open, gsm_open = openings(ROOT / "results/bench/evidence/mgsm"), openings(ROOT / "results/bench/evidence/gsm8k")
    guard = "fly-mla@fly_copy_guard=4"  # FLy's copy guard on MGSM (BENCHMARKS.md "FLy's copy guard, measured")
    ms, gm = _methods("results/bench/evidence/mgsm"), retention(ROOT / "results/bench/evidence/mgsm")[guard]
    gs, fs = ms[guard], ms["fly-mla"]
    gg, gr = ev[guard], retention(ROOT / "results/bench/evidence/gsm8k")[guard]
    assert mg_open[guard]["restates"] == mg_open["ar"]["restates"]  # "restates as often as `ar`"
    from loosespec.eval.results import RESULTS, ResultsFile

    rows = ResultsFile(ROOT / "results/bench/evidence/mgsm" / RESULTS).read()
    scored = {(r["question_id"], r["method"]): bool(r["score"]) for r in rows}
    lost = {
        m: sorted(q for (q, mm), ok in scored.items() if mm == m and scored[q, "ar"] and not ok)
        for m in ("fly-mla", guard)
    }
    back = set(lost["fly-mla"]) - set(lost[guard])
    copy_class = {f"mgsm/{q}" for q in ("zh/26", "zh/27", "ja/3", "ja/19", "ja/26", "ja/49")}
    words = {8: "Eight", 9: "Nine", 10: "Ten"}
    assert copy_class <= back and set(lost[guard]) <= set(lost["fly-mla"])  # "all six ... among them"
    c, auc = cal["choice"], cal["choice"]["at_tau"]["roc_auc"]
    from loosespec.eval.failures import failures

    read = [x for d in ("gsm8k", "niah", "mgsm") for x in failures(ROOT / "results/bench/evidence" / d)]
    loops = sum(x["class"] == "repetition loop" for x in read)
    trunc = sum(x["class"] == "truncated at the budget" for x in read)
    sk = retention(ROOT / "results/bench/evidence/gsm8k")["specguard"]
    sg_steps = sum(x["method"] == "specguard" and x["class"] == "accepted draft step" for x in read)
    small = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
    he = retention(ROOT / "results/bench/evidence/humaneval")  # HumanEval, all 164 ("HumanEval: all 164 problems")
    hm = _methods("results/bench/evidence/humaneval")
    hf, hn, hg = he["fly-mla"], he["fly-ngram"], he[guard]
    assert hm["exact-ngram"]["identical_to_ar"] == 1.0 and hf["verdict"] == hn["verdict"] == "lost"
    assert hg["verdict"].startswith("not decided") and hm[guard]["prompts"] == 164

    def ci(r):
        return f"{f(r['recovery_ci95'][0])}-{f(r['recovery_ci95'][1])}"

    he_sentences = [
        (
            B,
            f"`fly-mla` recovery {f(hf['recovery'])} (95% interval {ci(hf)}, {hf['ar_right_method_wrong']} lost, "
            f"{hf['ar_wrong_method_right']} gained) and `fly-ngram` {f(hn['recovery'])} ({ci(hn)}), both `lost`",
        ),
        (
            B,
            f"With the copy guard the {hm[guard]['prompts']} problems come out at recovery "
            f"{f(hg['recovery'])} ({ci(hg)}): not decided.",
        ),
        # "Does FLy keep accuracy?", per set: the one decided FLy verdict
        (
            B,
            f"On HumanEval (n = {hf['scored']}) it is decided, against the claim: recovery {f(hf['recovery'])} "
            f"({ci(hf)}), {hf['ar_right_method_wrong']} answers lost and {hf['ar_wrong_method_right']} gained, and "
            f"`fly-ngram` {f(hn['recovery'])} ({ci(hn)}); most of those losses are docstring copies, which FLy's "
            f"labeled copy guard refuses (with it, {f(hg['recovery'])}, {ci(hg)}: not decided).",
        ),
        (B, f"where the lossless `exact-ngram` runs at {f(hm['exact-ngram']['speedup'])}x"),
        (
            Bd,
            f"`fly-mla` at {f(hm['fly-mla']['speedup'])}x with recovery {f(hf['recovery'])} (95% interval {ci(hf)}; "
            f"{hf['ar_right_method_wrong']} answers lost, {hf['ar_wrong_method_right']} gained)",
        ),
        (
            Bd,
            f"the copy guard brings recovery to {f(hg['recovery'])} ({ci(hg)}) on the {hm[guard]['prompts']} problems",
        ),
    ]
    return (
        he_sentences
        + [
            # the lost answers, read (BENCHMARKS.md "The answers a lossy method lost, read")
            (
                B,
                f"Of the {len(read)} lost answers on GSM8K, NIAH and MGSM "
                + ("none is a repetition loop" if not loops else f"{loops} are repetition loops"),
            ),
            (B, f"{small.get(trunc, trunc).capitalize()} ran to the token budget: mgsm/ja/40"),
            (B, f"SpecGuard's {small.get(sg_steps, sg_steps)} accepted draft steps that went wrong"),
            (
                B,
                f"On GSM8K SpecGuard lost {sk['ar_right_method_wrong']} answers and gained {sk['ar_wrong_method_right']} "
                f"(recovery {f(sk['recovery'])}, 95% interval {f(sk['recovery_ci95'][0])}-{f(sk['recovery_ci95'][1])}): "
                "not decided either"
                if sk["verdict"].startswith("not decided")
                else "SpecGuard's verdict has changed",
            ),
            # SpecGuard's calibration (results/calibration/specguard.json)
            (
                Bd,
                f"(sg_confidence {c['sg_confidence']}, sg_beta {c['sg_beta']}, sg_tau {c['sg_tau']}) come from `make "
                f"calibrate-specguard`: the target writes every step of the first {cal['problems']} problems of GSM8K's "
                f"*train* split",
            ),
            (Bd, f"scored, {cal['steps']} steps, default pair in int8."),
            (
                Bd,
                f"separates it best (AUC {f(auc, '.3f')}), and tau accepts the share of steps the target prefers "
                f"({f(100 * cal['prefers'], '.1f')}%).",
            ),
            (
                Mt,
                f"(AUC {f(auc, '.3f')} at beta {c['sg_beta']}, min's best {f(cal['best']['min']['auc_target_prefers'], '.3f')};",
            ),
            (
                Mt,
                f"beta {c['sg_beta']} and tau {c['sg_tau']}, calibrated on GSM8K's train split (`make calibrate-specguard`: "
                f"{cal['problems']} problems, {cal['steps']} steps)",
            ),
            (
                B,
                "The old defaults (min, beta 0.3) scored S well below C alone (AUC "
                + f(
                    next(
                        g["auc_target_prefers"]
                        for g in cal["grid"]
                        if (g["sg_confidence"], g["sg_beta"]) == ("min", 0.3)
                    ),
                    ".3f",
                )
                + " against the target's preference",
            ),
            (B, f"target (step acceptance {f(ev['specguard']['step_accept_rate'])}: most steps are rejected)"),
            # docs/bench.md's results paragraph: the GSM8K evidence run
            (Bd, f"EVID_GSM8K_N={ev['ar']['prompts']}`): the first {ev['ar']['prompts']} GSM8K test problems"),
            (
                Bd,
                f"Lossless `exact-mla` runs at {f(ev['exact-mla']['speedup'])}x of `ar` (95% interval "
                f"{f(ev['exact-mla']['speedup_ci95'][0])}-{f(ev['exact-mla']['speedup_ci95'][1])}) with every output "
                f"identical to `ar`'s"
                if ev["exact-mla"]["identical_to_ar"] == 1
                else "exact-mla is not identical to ar",
            ),
            (
                Bd,
                f"FLy (`fly-mla`, lossy) at {f(ev['fly-mla']['speedup'])}x ({f(ev['fly-mla']['speedup_ci95'][0])}-"
                f"{f(ev['fly-mla']['speedup_ci95'][1])}) with accuracy recovery {f(keep['recovery'])} (95% interval "
                f"{f(keep['recovery_ci95'][0])}-{f(keep['recovery_ci95'][1])}; {keep['ar_right_method_wrong']} answers "
                f"lost, {keep['ar_wrong_method_right']} gained), which at n = {keep['scored']} neither",
            ),
            (
                Bd,
                f"SpecGuard (lossy) at {f(ev['specguard']['speedup'])}x ({sk['ar_right_method_wrong']} answers lost, "
                f"{sk['ar_wrong_method_right']} gained): slower",
            ),
            # "Does FLy keep accuracy?", per set
            (
                B,
                "Per set, for FLy as published (`fly-mla`, greedy): "
                + ", ".join(
                    f"{label} (n = {k['scored']}) " + ("recovery " if label == "GSM8K" else "") + f"{f(k['recovery'])} "
                    f"({f(k['recovery_ci95'][0])}-{f(k['recovery_ci95'][1])})"
                    for label, k in per_set.items()
                )
                + ". On none of "
                "them is the answer decided"
                if all(k["verdict"].startswith("not decided") for k in per_set.values())
                else "a FLy verdict has been decided",
            ),
            (
                B,
                f"MATH-500, against it: {f(msg['recovery'])} ({f(msg['recovery_ci95'][0])}-{f(msg['recovery_ci95'][1])}), "
                f"{msg['ar_right_method_wrong']} answers lost and none gained; on GSM8K it is not ({f(sk['recovery'])}, "
                f"{f(sk['recovery_ci95'][0])}-{f(sk['recovery_ci95'][1])})",
            ),
            # MATH-500 (docs/bench.md's results paragraph and BENCHMARKS.md below its tables)
            (
                B,
                f"it deferred {math_ident['fly_deferred']} times in {math_ident['prompts']} problems (`fly_deferred` in the "
                f"run's `summary.json`; {ev['fly-mla']['fly_deferred']} times in GSM8K's {ev['fly-mla']['prompts']} and "
                f"{fs['fly_deferred']} in MGSM's {fs['prompts']}",
            ),
            (B, f"chose short drafts (mean accepted length {f(math_ident['mean_accepted_length'])})"),
            (
                Bd,
                f"On the first {mf['scored']} MATH-500 problems FLy lost "
                f"{'no answer' if not mf['ar_right_method_wrong'] else mf['ar_right_method_wrong']} ({f(mf['speedup'])}x) and "
                f"SpecGuard lost {msg['ar_right_method_wrong']}, gained {msg['ar_wrong_method_right']} (recovery "
                f"{f(msg['recovery'])}, 95% interval {f(msg['recovery_ci95'][0])}-{f(msg['recovery_ci95'][1])}: a decided "
                f"loss)"
                if msg["verdict"] == "lost"
                else "SpecGuard's MATH-500 verdict has changed",
            ),
            (
                B,
                f"SpecGuard lost {msg['ar_right_method_wrong']} answers and gained {msg['ar_wrong_method_right']}: with "
                f"n = {msg['scored']} its recovery interval ({f(msg['recovery_ci95'][0])}-{f(msg['recovery_ci95'][1])}) "
                f"lies below 0.99 and the exact McNemar test gives p = {msg['mcnemar_p']:.2g}",
            ),
            (
                B,
                f"FLy lost no answer and gained none on these {mf['scored']} (recovery {f(mf['recovery'])}, 95% interval "
                f"{f(mf['recovery_ci95'][0])}-{f(mf['recovery_ci95'][1])}: not decided); "
                f"{round(math_ident['identical_to_ar'] * math_ident['prompts'])} of its {math_ident['prompts']} outputs"
                if mf["ar_right_method_wrong"] == mf["ar_wrong_method_right"] == 0
                and mf["verdict"].startswith("not decided")
                else "FLy's MATH-500 answers have changed",
            ),
            (
                Bd,
                f"FLy runs at {f(mg['speedup'])}x with recovery {f(mg['recovery'])} (95% interval "
                f"{f(mg['recovery_ci95'][0])}-{f(mg['recovery_ci95'][1])}; {mg['ar_right_method_wrong']} answers lost, "
                f"{mg['ar_wrong_method_right']} gained): not decided either",
            ),
            # the MGSM lost answers and openings, read (BENCHMARKS.md "The answers a lossy method lost, read")
            (
                B,
                f"FLy lost {mg['ar_right_method_wrong']} answers and gained {mg['ar_wrong_method_right']} (recovery "
                f"{f(mg['recovery'])}, 95% interval {f(mg['recovery_ci95'][0])}-{f(mg['recovery_ci95'][1])}, McNemar p "
                f"{mg['mcnemar_p']:.3g}): the clearest sign so far",
            ),
            (
                B,
                f"open by restating the question in {mg_open['fly-mla']['restates']} of {mg_open['fly-mla']['scored']} "
                f"problems against `ar`'s {mg_open['ar']['restates']}, and there such answers are right less often (`ar`: "
                f"{f(mg_open['ar']['accuracy_restating'])} against {f(mg_open['ar']['accuracy_other'])})",
            ),
            (
                B,
                f"the association is the other way round ({f(gsm_open['ar']['accuracy_restating'])} against "
                f"{f(gsm_open['ar']['accuracy_other'])} for `ar`)",
            ),
            # FLy's copy guard on MGSM
            (
                B,
                f"the guard lost {gm['ar_right_method_wrong']} answers and gained {gm['ar_wrong_method_right']} (accuracy "
                f"{f(gs['accuracy'])} against `ar`'s {f(gs['ar_accuracy'])}, recovery {f(gm['recovery'])}, 95% interval "
                f"{f(gm['recovery_ci95'][0])}-{f(gm['recovery_ci95'][1])}; FLy without it: {mg['ar_right_method_wrong']} "
                f"lost, {mg['ar_wrong_method_right']} gained, accuracy {f(fs['accuracy'])})",
            ),
            (
                B,
                f"{round(gs['identical_to_ar'] * gs['prompts'])} of {gs['prompts']} outputs are `ar`'s token for token "
                f"({round(fs['identical_to_ar'] * fs['prompts'])} without the guard)",
            ),
            (
                B,
                f"It took back {gs['fly_copy_rejects']} deferrals (`fly_copy_rejects` in the run's `summary.json`) and "
                f"let {gs['fly_deferred']} stand, where FLy without it deferred {fs['fly_deferred']} times",
            ),
            (
                B,
                f"its mean accepted length is {f(gs['mean_accepted_length'])} against FLy's "
                f"{f(fs['mean_accepted_length'])} and its rate {f(gs['tokens_per_s'])} against {f(fs['tokens_per_s'])} "
                f"tokens/s",
            ),
            (
                B,
                f"its answers are about as long as `ar`'s ({gs['new_tokens']:,} tokens against {ms['ar']['new_tokens']:,}; "
                f"FLy's {fs['new_tokens']:,}",
            ),
            (
                B,
                f"the wall-clock speedup over the same problems is {f(gs['speedup'])}x ({f(gs['speedup_ci95'][0])}-"
                f"{f(gs['speedup_ci95'][1])}) against FLy's {f(fs['speedup'])}x",
            ),
            (
                B,
                f"{words.get(len(back), len(back))} of FLy's ten losses come back, all six of the copy class among "
                f"them; the two it still loses ({', '.join(q for q in lost[guard])}) come from deferrals"
                if len(lost["fly-mla"]) == 10 and len(lost[guard]) == 2
                else "the lost answers have changed",
            ),
            (
                B,
                f"the guard refused {gg['fly_copy_rejects']} deferrals in {gg['prompts']} problems and changed little: "
                f"{gr['ar_right_method_wrong']} answer lost and {gr['ar_wrong_method_right']} gained against `ar` (FLy: "
                f"{keep['ar_right_method_wrong']} and {keep['ar_wrong_method_right']})",
            ),
            (
                B,
                f"restates as often as `ar` ({mg_open[guard]['restates']} of {mg_open[guard]['scored']}) and loses "
                f"{gm['ar_right_method_wrong']} answers where FLy lost {mg['ar_right_method_wrong']}",
            ),
            (
                Bd,
                f"FLy's copy guard (`--fly-copy-guard 4`, a labeled lossy variant, off by default) lost "
                f"{gm['ar_right_method_wrong']} and gained {gm['ar_wrong_method_right']} on the same problems (recovery "
                f"{f(gm['recovery'])}, 95% interval {f(gm['recovery_ci95'][0])}-{f(gm['recovery_ci95'][1])})",
            ),
            (
                Mt,
                f"grounding alone does not separate the steps the target prefers here (AUC "
                f"{f(cal['signals']['G']['auc_target_prefers'], '.3f')})",
            ),
            # vLLM, batch of one, GSM8K
            (
                B,
                f"`vllm-draft` runs at {f(g['vllm-draft']['speedup'])}x of `vllm-ar`, `vllm-fly` at "
                f"{f(g['vllm-fly']['speedup'])}x, `vllm-ngram` at {f(g['vllm-ngram']['speedup'])}x.",
            ),
            (B, f"in its prompt (acceptance {f(g['vllm-ngram']['acceptance_rate'])})"),
            (
                B,
                f"Mean accepted length {f(g['vllm-fly']['mean_accepted_length'])} with `vllm-fly` (k = 15) against "
                f"{f(g['vllm-draft']['mean_accepted_length'])} for `vllm-draft` (k = 5); at equal k = 15 the integration "
                f"test measured {fly_len} against {exact_len}",
            ),
            (
                B,
                f"drafting 15 tokens per step here: {f(g['vllm-fly']['tokens_per_s'])} against "
                f"{f(g['vllm-draft']['tokens_per_s'])} tokens/s.",
            ),
            (
                B,
                f"every method answered the same {right(g['vllm-ar'])} of 3 problems (recovery "
                f"{f(g['vllm-fly']['recovery'])})",
            ),
            (B, f"(identical to `vllm-ar`: {f(g['vllm-fly']['identical_to_ar'])}; lossy)"),
            (
                B,
                f"vLLM without speculation ({f(g['vllm-ar']['tokens_per_s'])} tokens/s) is about as fast as the "
                f"transformers engine's `ar` ({f(g['ar']['tokens_per_s'])})",
            ),
            # vLLM, batch of one, HumanEval
            (
                B,
                f"`vllm-draft` {f(h['vllm-draft']['speedup'])}x, `vllm-fly` {f(h['vllm-fly']['speedup'])}x, "
                f"`vllm-ngram` {f(h['vllm-ngram']['speedup'])}x of `vllm-ar`.",
            ),
            (
                B,
                f"FLy's mean accepted length is {f(h['vllm-fly']['mean_accepted_length'])} of at most 16 per step "
                f"(k = 15), `vllm-draft`'s {f(h['vllm-draft']['mean_accepted_length'])} of 6.",
            ),
            (
                B,
                f"(ar right, method wrong: {h['vllm-fly']['ar_right_method_wrong']}; recovery "
                f"{f(h['vllm-fly']['recovery'])})",
            ),
            (
                B,
                f"(accuracy interval {f(h['vllm-fly']['accuracy_ci95'][0])} to {f(h['vllm-fly']['accuracy_ci95'][1])})",
            ),
            # vLLM under load
            (
                B,
                f"delivers {f(load['vllm-ar']['throughput_tokens_per_s'])} tokens/s with 8 requests in flight "
                f"({f(g['vllm-ar']['tokens_per_s'])} one request at a time on the first 3 problems, above); `vllm-draft` "
                f"{f(load['vllm-draft']['throughput_tokens_per_s'])} and `vllm-fly` "
                f"{f(load['vllm-fly']['throughput_tokens_per_s'])}.",
            ),
            (
                B,
                f"under load ({f(load['vllm-fly']['mean_accepted_length'])}, k = 15) is what it was one request at a "
                f"time ({f(g['vllm-fly']['mean_accepted_length'])} on the first 3 problems)",
            ),
            (
                B,
                f"Accuracy is the same {right(load['vllm-ar'])} of 8 for every method (recovery "
                f"{f(load['vllm-fly']['recovery'])})",
            ),
            (
                B,
                f"(acceptance {f(load['vllm-draft']['acceptance_rate'])} for `vllm-draft`, "
                f"{f(load['vllm-fly']['acceptance_rate'])} for `vllm-fly`, against "
                f"{f(g['vllm-draft']['acceptance_rate'])} and {f(g['vllm-fly']['acceptance_rate'])} one request at a time)",
            ),
            # docs/vllm.md's status table
            (V, f"mean accepted length {exact_len} (vLLM's verification) vs {fly_len} (FLy,"),
            (
                V,
                f"FLy raises the mean accepted length ({f(g['vllm-fly']['mean_accepted_length'])} on GSM8K, "
                f"{f(h['vllm-fly']['mean_accepted_length'])} on HumanEval, k = 15)",
            ),
            (
                V,
                f"server throughput {f(load['vllm-ar']['throughput_tokens_per_s'])} (`vllm-ar`), "
                f"{f(load['vllm-draft']['throughput_tokens_per_s'])} (`vllm-draft`), "
                f"{f(load['vllm-fly']['throughput_tokens_per_s'])} (`vllm-fly`) tokens/s; FLy's mean accepted length "
                f"{f(load['vllm-fly']['mean_accepted_length'])}, as for one request; same accuracy "
                f"({right(load['vllm-ar'])} of 8) for all.",
            ),
            # methods measured by benchmarks/speed.py, quoted in BENCHMARKS.md
            (
                B,
                f"`exact-model` {f(lossless['exact-model']['speedup'])}x, mean accepted length "
                f"{f(lossless['exact-model']['mean_accepted_length'])}, all outputs identical to `ar`.",
            ),
            (
                B,
                f"`results/specguard_gsm8k.json`: {f(sg['specguard']['speedup'])}x, mean accepted length "
                f"{f(sg['specguard']['mean_accepted_length'])}, {round(sg['specguard']['accuracy'] * 3)} of 3 correct "
                f"(`ar` {round(sg['ar']['accuracy'] * 3)} of 3).",
            ),
            # drafts with another tokenizer
            (
                B,
                f"(mean accepted length {f(xtok['humaneval', qwen]['exact-model']['mean_accepted_length'])} with "
                f"`exact`), Gemma 270M next ({f(xtok['humaneval', gemma]['exact-model']['mean_accepted_length'])}), "
                f"SmolLM2-135M last ({f(xtok['humaneval', smol]['exact-model']['mean_accepted_length'])})",
            ),
            (
                B,
                f"SmolLM2 with `exact` is {f(xtok['humaneval', smol]['exact-model']['speedup'])}x on HumanEval and "
                f"{f(xtok['mtbench', smol]['exact-model']['speedup'])}x on `mt_bench`, the Qwen 0.5B "
                f"{f(xtok['humaneval', qwen]['exact-model']['speedup'])}x and "
                f"{f(xtok['mtbench', qwen]['exact-model']['speedup'])}x, Gemma "
                f"{f(xtok['humaneval', gemma]['exact-model']['speedup'])}x and "
                f"{f(xtok['mtbench', gemma]['exact-model']['speedup'])}x",
            ),
        ]
        + _fly_calibration_sentences(B)
        + _readme_table()
    )


def _readme_table() -> list[tuple[str, str]]:
    """README.md's "Measured so far" table, row by row: the lossy methods' rows from the retention verdicts (as
    BENCHMARKS.md's "Does FLy keep accuracy?"), the lossless ones' from their bench summaries."""
    from loosespec.eval.failures import retention

    ev = ROOT / "results/bench/evidence"

    def pair(value, ci, unit=""):
        return f"{value:.2f}{unit} ({ci[0]:.2f}-{ci[1]:.2f})"

    def lossless(label, d, m):
        s = _methods(f"results/bench/evidence/{d}")[m]
        same = "every output `ar`'s" if s["identical_to_ar"] == 1 else "outputs that differ from ar's"
        return f"| {label} | {s['prompts']} | `{m}` | {pair(s['speedup'], s['speedup_ci95'], 'x')} | {same} | - | lossless |"

    def lossy(label, d, m):
        r = retention(d)[m]
        return (
            f"| {label} | {r['scored']} | `{m}` (lossy) | {pair(r['speedup'], r['speedup_ci95'], 'x')} | "
            f"{pair(r['recovery'], r['recovery_ci95'])} | {r['ar_right_method_wrong']} / {r['ar_wrong_method_right']} | "
            f"{r['verdict']} |"
        )

    guard = "fly-mla@fly_copy_guard=4"
    rows = [
        lossless("GSM8K", "gsm8k", "exact-mla"),
        lossy("GSM8K", ev / "gsm8k", "fly-mla"),
        lossy("GSM8K", ev / "gsm8k", "specguard"),
        lossy("MGSM zh + ja", ev / "mgsm", "fly-mla"),
        lossy("MGSM zh + ja", ev / "mgsm", guard),
        lossy("MATH-500", ev / "math500", "fly-mla"),
        lossy("MATH-500", ev / "math500", "specguard"),
        lossless("HumanEval", "humaneval", "exact-ngram"),
        lossy("HumanEval", ev / "humaneval", "fly-mla"),
        lossy("HumanEval", ev / "humaneval", guard),
        lossy("GSM8K, T = 0.7, three seeds", [ev / f"gsm8k-t0.7-seed{i}" for i in range(3)], "fly-mla"),
    ]
    return [("README.md", row) for row in rows]


def _fly_calibration_sentences(B: str) -> list[tuple[str, str]]:
    """BENCHMARKS.md "FLy's calibration": the screen's and the confirmed rows' figures from results/calibration/fly.json."""
    import json

    rep = json.loads((ROOT / "results/calibration/fly.json").read_text())
    screen = {r["name"]: r for r in rep["screen"]}
    top = max(rep["screen"], key=lambda r: r["gain"])
    paper = screen["theta=0.3,W=5,K=15,guard=0"]
    first = next(n for n in rep["confirmed"] if n != "exact-default")
    c, ch = rep["confirmed"][first], rep["confirmed"][rep["chosen"]["name"]]
    exact = rep["confirmed"]["exact-default"]["tokens_per_s"]
    return [
        (
            B,
            f"at most {top['gain']:.2f}x exact verification's tokens per round ({top['name']}), touching "
            f"{top['touched']} of {top['problems']} problems; at the published theta and W ({paper['name']}), "
            f"{paper['gain']:.2f}x, touching {paper['touched']} of {paper['problems']}",
        ),
        (
            B,
            f"the first setting tried ({first}) lost {c['lost']} answer and gained {c['gained']} (retention "
            f"{c['retention']:.2f}), so the bisection went " + ("stricter" if not c["meets_bound"] else "looser"),
        ),
        (B, f"the chosen {rep['chosen']['name']} lost {ch['lost']} and gained {ch['gained']}"),
        (
            B,
            f"the chosen setting deferred {ch['deferrals']} times in {ch['rounds']} rounds ({ch['deferrable_rounds']} "
            "long enough to defer)",
        ),
        (B, f"rests on {ch['tokens_per_s'] / exact:.3f}x exact's tokens/s"),
    ]


def _specguard_acceptance() -> list[tuple[str, str]]:
    """README.md's and BENCHMARKS.md's sentences on SpecGuard's acceptance runs with the backing-off chooser
    (results/bench/specguard-47-accept2), from the result files."""
    from loosespec.eval.failures import retention
    from loosespec.eval.results import RESULTS, ResultsFile

    said = []
    readme = []
    for name in ("gsm8k", "math500"):
        d = ROOT / "results/bench/specguard-47-accept2" / name
        r = retention(d)["specguard"]
        rows = [x for x in ResultsFile(d / RESULTS).read() if x["method"] == "specguard"]
        steps = sum(x["stats"]["steps"] + x["stats"]["skipped_steps"] for x in rows)
        attempts = sum(x["stats"]["steps"] for x in rows)
        lo, hi = r["speedup_ci95"]
        rlo, rhi = r["recovery_ci95"]
        readme.append(
            (
                f"{r['speedup']:.2f}x ({lo:.2f}-{hi:.2f})",
                f"recovery {r['recovery']:.2f} ({rlo:.2f}-{rhi:.2f})",
                r["ar_right_method_wrong"],
                r["ar_wrong_method_right"],
                attempts,
                steps,
            )
        )
        if name == "math500":
            kept = sum(x["stats"]["accepted_steps"] for x in rows)
            ar = {x["question_id"]: x["token_ids"] for x in ResultsFile(d / RESULTS).read() if x["method"] == "ar"}
            same = sum(x["token_ids"] == ar[x["question_id"]] for x in rows)
            said += [
                ("BENCHMARKS.md", f"{attempts} attempts in {steps} steps"),
                ("BENCHMARKS.md", f"{kept} of them kept"),
                ("BENCHMARKS.md", f"the other {same} are `ar`'s token for token"),
                ("BENCHMARKS.md", f"recovery {r['recovery']:.2f} ({rlo:.2f}-{rhi:.2f})"),
                ("BENCHMARKS.md", f"Speed {r['speedup']:.2f}x ({lo:.2f}-{hi:.2f}) of `ar`"),
            ]
    (g_s, g_r, g_l, g_g, g_a, g_n), (m_s, m_r, m_l, m_g, m_a, m_n) = readme
    said.append(
        (
            "README.md",
            f"on GSM8K {g_s} of `ar`, {g_r}, {g_l} answers lost and {g_g} gained, with {g_a} of {g_n} steps "
            f"attempted; on MATH-500's first 50 {m_s}, {m_r}, {m_l} lost and {m_g} gained, with {m_a} of {m_n} "
            "steps attempted.",
        )
    )
    return said


def test_specguard_acceptance_prose_matches_the_results():
    import re

    text = {n: re.sub(r"\s+", " ", (ROOT / n).read_text(encoding="utf-8")) for n in ("README.md", "BENCHMARKS.md")}
    assert [f"{n}: {s}" for n, s in _specguard_acceptance() if s not in text[n]] == []


def test_figures_quoted_in_prose_match_the_result_files():
    """The numbers BENCHMARKS.md, docs/vllm.md, docs/bench.md and docs/methods.md quote outside the generated blocks
    (vLLM figures, the speed.py runs, the cross-tokenizer runs, the evidence runs, the calibrations) and README.md's
    results table are the committed results' own."""
    import re

    texts = {}
    wrong = []
    for name, sentence in _quoted_figures():
        if name not in texts:  # prose wraps anywhere: compare with whitespace collapsed
            texts[name] = re.sub(r"\s+", " ", (ROOT / name).read_text(encoding="utf-8"))
        if sentence not in texts[name]:
            wrong.append(f"{name}: {sentence}")
    assert not wrong, "figures that differ from the result files (or moved):\n" + "\n".join(wrong)


def _precision_pair(a: str, b: str, dataset: str, a_dir: str | None = None) -> dict:
    """``benchmarks/precision_accuracy.py``'s comparison of ``ar`` in precisions ``a`` and ``b`` on ``dataset``
    (results/bench/precision/, ``a``'s directory named ``a_dir`` where that is not ``a``), read back as the strings it
    prints: ``right`` per precision ("12/30"), ``only`` (right in a only, in b only), ``p`` (exact McNemar) and
    ``same`` (outputs identical, of how many)."""
    import re
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from precision_accuracy import compare

    p = ROOT / "results/bench/precision"
    text = compare(p / f"{dataset}-{a_dir or a}", p / f"{dataset}-{b}")
    only = re.search(
        rf"right in {a} only: (\d+); right in {b} only: (\d+); exact McNemar p = (\d\.\d+); "
        r"outputs identical token for token: (\d+)/(\d+)",
        text,
    )
    return {
        "right": dict(re.findall(rf"^\| ({a}|{b}) \| (\d+/\d+) =", text, re.M)),
        "only": only.groups()[:2],
        "p": only.group(3),
        "same": only.groups()[3:],
    }


def test_prose_below_the_generated_blocks_matches_them():
    """The int8 paragraph and the draft-units range restate what the generated blocks say: checked against
    the same result files."""
    import re

    from loosespec.eval.results import RESULTS, ResultsFile

    g, h = (_precision_pair("int8", "float32", s) for s in ("gsm8k", "humaneval"))
    g_i8, g_f32 = g["only"]
    g_p, h_p = (x["p"][:3] for x in (g, h))  # the paragraph quotes one decimal, as written
    assert (g["only"], g_p) == (h["only"], h_p) and g["same"][0] == "0"  # the paragraph says "in each" and "none"
    said = [
        f"int8 got {h['right']['int8']} HumanEval and {g['right']['int8']} GSM8K answers right, float32 "
        f"{h['right']['float32']} and {g['right']['float32']}: in each set float32 alone got {g_f32} right and int8 "
        f"alone {g_i8} (exact McNemar p = {g_p} in each)",
        f"({h['same'][0]} of the {h['same'][1]} HumanEval outputs and none of the {g['same'][1]} GSM8K ones are token "
        "for token the same)",
    ]
    ratios = []
    for d in (ROOT / "results/bench/xtok").iterdir():
        rows = [r for r in ResultsFile(d / RESULTS).read() if r["method"] != "ar"] if (d / RESULTS).exists() else []
        for m in {r["method"] for r in rows}:
            mine = [r for r in rows if r["method"] == m]
            drafted = sum(r.get("drafted_tokens") or 0 for r in mine)
            units = sum(r["stats"].get("draft_units_drafted", r.get("drafted_tokens") or 0) for r in mine)
            if drafted and "qwen2.5-coder-0.5b" not in d.name:  # across tokenizers only
                ratios.append(units / drafted)
    said.append(f"a drafted target token costs {min(ratios):.2f} to {max(ratios):.2f} draft-model tokens")
    text = re.sub(r"\s+", " ", (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert [s for s in said if s not in text] == []


def _int4_invariant_prose() -> list[str]:
    """BENCHMARKS.md's sentences on the batch-invariant int4 forward (results/bench/forward-int4-invariant and its
    forward-cost file), each figure computed from the result files."""
    import json
    import re
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from forward_compare import compare

    root = ROOT / "results/bench/forward-int4-invariant"
    table = {}
    for line in compare(root).splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 9 and re.fullmatch(r"\w+ / \w+", cells[0]):
            table[(cells[0].split(" / ")[0], cells[1])] = cells
    cost = json.loads((ROOT / "results/forward/20261207-0034-intel-r-xeon-r-processor-2-80ghz.json").read_text())
    c2 = {r["precision"]: r["ratios"]["2"] for r in cost["rows"] if r["model"] == cost["target"]}
    ours = cost["llamacpp_variants"][-1]
    default = cost["llamacpp_variants"][0]
    assert (ours["repack"], ours["flash_attn"], ours["cache_type"], ours["row_chunk"]) == (False, 1, "bf16", 7)
    inv = [ours[k]["bit_equal_rows"] for k in ("batch_invariance", "batch_invariance_long")]
    assert inv == [16, 16], "the prose says every row is bit-equal at both contexts"
    d = [default[k]["bit_equal_rows"] for k in ("batch_invariance", "batch_invariance_long")]
    same = {table[("int4", m)][7] for m in ("exact-ngram", "exact-mla")}
    assert len(same) == 1
    return [
        f"{same.pop()} prompts token-identical to `ar` for both `exact-ngram` and `exact-mla`",
        f"cached positions ({max(d)}/16 with llama.cpp's defaults)",
        f"`ar` in int4 at {table[('int4', 'ar')][5]} `llamacpp-ar` in the same run, against "
        f"{table[('int8', 'ar')][5]} for `ar` in int8 in its own",
        f"(c(2)/c(1) {c2['int4']:.2f} against {c2['int8']:.2f}, the forward-cost table)",
        f"({table[('int4', 'exact-mla')][8]} draft-model rounds with the int4 target); the best lossless method, "
        f"`exact-ngram`, ran at {table[('int4', 'exact-ngram')][5]} `llamacpp-ar`",
        f"`llamacpp-spec`, at {table[('int4', 'llamacpp-spec')][5]} `llamacpp-ar` (its draft's tokens accepted "
        f"{table[('int4', 'llamacpp-spec')][8].replace('/', ' of ')} times)",
        f"ran at {table[('int4', 'llamacpp-ar')][3]} and then {table[('int8', 'llamacpp-ar')][3]} tok/s",
    ]


def test_int4_invariant_prose_matches_the_results():
    import re

    text = re.sub(r"\s+", " ", (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert [s for s in _int4_invariant_prose() if s not in text] == []


def _int4_repack_prose() -> list[str]:
    """BENCHMARKS.md's sentences on the repacked int4 forward (results/bench/forward-int4-repack and its forward-cost
    file), each figure computed from the result files."""
    import json
    import re
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from forward_compare import compare

    table = {}
    for line in compare(ROOT / "results/bench/forward-int4-repack").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 9 and re.fullmatch(r"\w+ / \w+", cells[0]):
            table[(cells[0].split(" / ")[0], cells[1])] = cells
    cost = json.loads((ROOT / "results/forward/20261207-0320-amd-epyc.json").read_text())
    rows = {r["precision"]: r for r in cost["rows"] if r["model"] == cost["target"]}
    variants = cost["llamacpp_variants"]
    ours, default = variants[-1], variants[0]
    assert (ours["repack"], ours["row_chunk"], ours["prefill_repack"]) == (True, 3, False)
    assert (default["repack"], default["flash_attn"], default["cache_type"]) == (True, -1, "f16")
    (before,) = [v for v in variants if (v["repack"], v["row_chunk"]) == (False, 7)]
    (groups,) = [v for v in variants if (v["repack"], v["row_chunk"]) == (True, 4)]

    def equal(v):
        return {v[k]["bit_equal_rows"] for k in ("batch_invariance", "batch_invariance_long")}

    assert equal(ours) == {16} and equal(groups) == {0}
    ratios = {int(n): r for n, r in rows["int4"]["ratios"].items()}
    best = max(ratios, key=lambda n: n / ratios[n])
    same = {table[("int4", m)][7] for m in ("exact-ngram", "exact-mla")}
    assert len(same) == 1
    return [
        f"**A one-token forward at llama.cpp's cost**: {ours['c1_ms']} ms against {default['c1_ms']} for llama.cpp's "
        f"defaults and {before['c1_ms']} for the previous setting, with 16/16 verify rows bit-equal at 128 and 700 "
        "cached positions; the gemm's groups of 4 give 0/16",
        f"took {ours['prefill']['seconds']:.2f} s for 512 tokens against {default['prefill']['seconds']:.2f} with "
        "llama.cpp's defaults",
        f"**`ar` at {table[('int4', 'ar')][5]} `llamacpp-ar`** in the same run, `exact-ngram` and `exact-mla` "
        f"token-identical to it on {same.pop()} prompts",
        f"(c(2)/c(1) {ratios[2]:.2f}, against {rows['int8']['ratios']['2']:.2f} in int8, the forward-cost table)",
        f"gains at most {best / ratios[best]:.2f}x over `ar` ({best} positions in one forward",
        f"drafts with the model in {table[('int4', 'exact-mla')][8]} rounds; the best lossless method, "
        f"`exact-ngram`, ran at {table[('int4', 'exact-ngram')][5]} `llamacpp-ar`",
        f"`llamacpp-spec` ran at {table[('int4', 'llamacpp-spec')][5]} `llamacpp-ar`",
        f"`ar` in int8 at {table[('int8', 'ar')][5]} `llamacpp-ar`, its best lossless method (`exact-ngram`) at "
        f"{table[('int8', 'exact-ngram')][5]}; its one-token forward costs {rows['int8']['c1_ms']} ms against int4's "
        f"{rows['int4']['c1_ms']} in the same table",
    ]


def test_int4_repack_prose_matches_the_results():
    import re

    text = re.sub(r"\s+", " ", (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert [s for s in _int4_repack_prose() if s not in text] == []


def _int4_against_int8_float32(a_dir: str):
    """An int4 accuracy run (results/bench/precision/*-``a_dir``) paired with int8 and float32 on GSM8K and HumanEval:
    the four comparisons, then GSM8K's (int4 right, of n, int8 right, int4 right on float32's problems, of n, float32
    right) and HumanEval's (int4 right, of n, int8 right, float32 right), as the strings the paragraphs quote."""
    c = {(s, o): _precision_pair("int4", o, s, a_dir) for s in ("gsm8k", "humaneval") for o in ("int8", "float32")}

    def right(s, o, m):
        return c[(s, o)]["right"][m].split("/")

    (g4, gn), (g8, _), (g432, gn32), (g32, _) = (
        right("gsm8k", o, m)
        for o, m in (("int8", "int4"), ("int8", "int8"), ("float32", "int4"), ("float32", "float32"))
    )
    (h4, hn), (h8, _), (h32, _) = (
        right("humaneval", o, m) for o, m in (("int8", "int4"), ("int8", "int8"), ("float32", "float32"))
    )
    return c, (g4, gn, g8, g432, gn32, g32), (h4, hn, h8, h32)


def test_int4_accuracy_prose_matches_the_results():
    """The paragraph on int4's accuracy (make bench-precision-int4) restates its generated blocks."""
    import re

    c, (g4, gn8, g8, g432, gn32, g32), (h4, hn8, h8, h32) = _int4_against_int8_float32("int4")
    assert {float(v["p"]) for v in c.values()} == {1.0}  # "every exact McNemar p = 1.0"
    hs32, hn32 = c[("humaneval", "float32")]["same"]
    gs32, _ = c[("gsm8k", "float32")]["same"]
    hs8, _ = c[("humaneval", "int8")]["same"]
    gs8, _ = c[("gsm8k", "int8")]["same"]
    said = [
        f"GSM8K: int4 got {g4} of the first {gn8} right against int8's {g8}, and {g432} of the first {gn32} against "
        f"float32's {g32}; HumanEval: {h4} of {hn8} against int8's {h8} and float32's {h32}.",
        f"it shares {hs32} of {hn32} HumanEval outputs and {gs32} of {gn32} GSM8K ones with float32 token for token "
        f"(with int8: {hs8} of {hn8} and {gs8} of {gn8}).",
    ]
    text = re.sub(r"\s+", " ", (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert [s for s in said if s not in text] == []


def test_repacked_int4_accuracy_prose_matches_the_results():
    """The paragraph on the repacked int4's accuracy restates its generated blocks, and its comparison with the
    setting before (benchmarks/precision_accuracy.py on the two int4 directories)."""
    import re
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from precision_accuracy import compare

    c, (g4, gn, g8, g432, gn32, g32), (h4, hn, h8, h32) = _int4_against_int8_float32("int4-repack")
    ps = sorted(float(v["p"]) for v in c.values())
    before = {}
    for s in ("gsm8k", "humaneval"):
        p = ROOT / "results/bench/precision"
        text = compare(p / f"{s}-int4-repack", p / f"{s}-int4")
        before[s] = re.search(r"outputs identical token for token: (\d+)/(\d+)", text).groups()
    said = [
        f"GSM8K: the repacked int4 got {g4} of the first {gn} right against int8's {g8}, and {g432} of the first {gn32} "
        f"against float32's {g32}; HumanEval: {h4} of {hn} against int8's {h8} and float32's {h32}.",
        f"(exact McNemar p from {ps[0]:g} to {ps[-1]:.1f})",
        f"it shares {before['humaneval'][0]} of {before['humaneval'][1]} HumanEval and {before['gsm8k'][0]} of "
        f"{before['gsm8k'][1]} GSM8K outputs with it token for token, and {c[('humaneval', 'float32')]['same'][0]} of "
        f"{c[('humaneval', 'float32')]['same'][1]} HumanEval outputs with float32.",
    ]
    text = re.sub(r"\s+", " ", (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert [s for s in said if s not in text] == []


def _specbench_sentences() -> list[tuple[str, str]]:
    """BENCHMARKS.md's Spec-Bench section (issue 20's evidence run): its machine, duration and the figures of "What it
    shows", each from results/bench/evidence/specbench's rows."""
    from loosespec.eval.results import RESULTS, ResultsFile
    from loosespec.eval.stats import machine_label, summarize

    B = "BENCHMARKS.md"
    rows = ResultsFile(ROOT / "results/bench/evidence/specbench" / RESULTS).read()
    s = summarize(rows)
    cats, per = s["categories"], s["methods"]
    (machine,) = {machine_label(r["hardware"]) for r in rows}
    cpu, flags = machine.split(" (")[0], machine.split(" (")[1].split(";")[0]
    minutes = sum(r["wall_time"] for r in rows) / 60
    ar = {r["question_id"]: r["token_ids"] for r in rows if r["method"] == "ar"}

    def differ(m, cat):
        return sum(r["token_ids"] != ar[r["question_id"]] for r in rows if r["method"] == m and r["category"] == cat)

    def avg_tokens(cat):
        return cats[cat]["ar"]["new_tokens"] / cats[cat]["ar"]["prompts"]

    summ = cats["summarization"]
    drafting = [m for m in per if m not in ("ar", "hf-pld", "llamacpp-ar")]
    lengths = [summ[m]["mean_accepted_length"] for m in drafting]
    outside = [cats[c][m]["mean_accepted_length"] for c in cats if c != "summarization" for m in drafting]
    guard = "fly-ngram@fly_copy_guard=4"
    short = [c for c in cats if avg_tokens(c) < 30]
    # where llama.cpp one token at a time is not the fastest: the categories some loosespec method beats it
    beaten = {c for c in cats if max(cats[c][m]["speedup"] for m in drafting) > cats[c]["llamacpp-ar"]["speedup"]}
    assert beaten == {"summarization", "rag"}  # the prose: "... except on summarization and rag"
    assert sorted(short) == ["qa", "translation"] and all(avg_tokens(c) >= 30 for c in cats if c not in short)

    def x(v):
        return f"{v:.2f}x"

    return [
        (B, f"on a 2-core {cpu} ({flags}, recorded in every row)"),
        (B, f"about {round(minutes, -1):.0f} minutes in all"),
        (B, f"the largest speedups and mean accepted lengths of {min(lengths):.1f}-{max(lengths):.1f}"),
        (B, f"on rag (long retrieved passages as prompts, {avg_tokens('rag'):.0f} new tokens on average)"),
        (B, f"(`exact-mla` {x(cats['rag']['exact-mla']['speedup'])})"),
        (
            B,
            f"`fly-ngram` in {differ('fly-ngram', 'summarization')} of the 10 summaries and "
            f"{differ('fly-ngram', 'mt_bench')} mt_bench answer, `fly-mla` in {differ('fly-mla', 'summarization')} "
            f"summaries, {differ('fly-mla', 'mt_bench')} mt_bench answers and {differ('fly-mla', 'math_reasoning')} "
            "math_reasoning answer",
        ),
        (
            B,
            f"(`fly-ngram` {x(per['fly-ngram']['speedup'])} against `exact-ngram` {x(per['exact-ngram']['speedup'])}, "
            f"`fly-mla` {x(per['fly-mla']['speedup'])} against `exact-mla` {x(per['exact-mla']['speedup'])})",
        ),
        (B, f"(mean accepted length {min(outside):.1f}-{max(outside):.1f} per category)"),
        (
            B,
            f"keeps {10 - differ(guard, 'summarization')} of the 10 summaries `ar`'s token for token (against "
            f"{10 - differ('fly-ngram', 'summarization')} without it) and {per[guard]['identical_to_ar']:.2f} of all "
            f"60 outputs, at {x(summ[guard]['speedup'])} on summarization (`fly-ngram` {x(summ['fly-ngram']['speedup'])}, "
            f"`exact-ngram` {x(summ['exact-ngram']['speedup'])}) and {x(per[guard]['speedup'])} overall",
        ),
        (B, "faster than every loosespec method here except on summarization and rag"),
    ]


def _t07_sentences() -> list[tuple[str, str]]:
    """BENCHMARKS.md's T = 0.7 sentences: where each seed's rows were timed and the pooled and per-seed verdicts."""
    from collections import Counter

    from loosespec.eval.failures import retention
    from loosespec.eval.results import RESULTS, ResultsFile

    B = "BENCHMARKS.md"
    dirs = [ROOT / f"results/bench/evidence/gsm8k-t0.7-seed{i}" for i in range(3)]

    def machines(d):
        rows = [r for r in ResultsFile(d / RESULTS).read() if r["method"] == "ar"]
        return Counter("avx512_bf16" if "avx512_bf16" in r["hardware"]["cpu_flags"] else "avx2" for r in rows)

    seed0, seed1, seed2 = (machines(d) for d in dirs)
    assert seed1 == seed2 == Counter(avx512_bf16=50)  # "seeds 1 and 2 all on the avx512_bf16 EPYC"
    pooled, each = retention(dirs), [retention(d) for d in dirs]
    rej = "fly-mla@fly_sampling=rejection"

    def rc(v):
        return f"{v['recovery']:.2f} ({v['recovery_ci95'][0]:.2f}-{v['recovery_ci95'][1]:.2f})"

    r0 = each[0][rej]
    return [
        (
            B,
            f"Seed 0: the first {seed0['avx2']} problems on an AMD EPYC with avx2 only, the other {seed0['avx512_bf16']} "
            "on an AMD EPYC with avx512_bf16 in a later session",
        ),
        (B, "seeds 1 and 2 all on the avx512_bf16 EPYC"),
        (B, f"the two-sample `fly-mla` recovers {rc(pooled['fly-mla'])}, the paper's rejection form {rc(pooled[rej])}"),
        (
            B,
            f"Seed 0 alone read `{r0['verdict']}` for the rejection form ({r0['recovery']:.2f}, "
            f"{r0['recovery_ci95'][0]:.2f}-{r0['recovery_ci95'][1]:.2f}); seeds 1 and 2 did not "
            f"({each[1][rej]['recovery']:.2f} and {each[2][rej]['recovery']:.2f})",
        ),
    ]


def _readme_machines() -> list[tuple[str, str]]:
    """README.md's "on the CPUs measured (...)": the machines FLy's default was measured against exact's on
    (results/bench/fly-default*, every row's hardware)."""
    from loosespec.eval.results import RESULTS, ResultsFile

    names = []
    for d in ("results/bench/fly-default", "results/bench/fly-default-xeon-amx"):
        (hw,) = {
            (r["hardware"]["cpu"], tuple(r["hardware"]["cpu_flags"]))
            for sub in ("humaneval", "specbench")
            for r in ResultsFile(ROOT / d / sub / RESULTS).read()
        }
        cpu, flags = hw
        kind = "AMX" if "amx_tile" in flags else ("AVX2" if flags == ("avx2",) else "+".join(flags))
        names.append(f"an {kind} {'EPYC' if 'EPYC' in cpu else 'Xeon'}")
    return [("README.md", f"on the CPUs measured ({', '.join(names)})")]


def test_specbench_t07_and_readme_machine_prose_matches_the_results():
    import re

    said = _specbench_sentences() + _t07_sentences() + _readme_machines()
    text = {n: re.sub(r"\s+", " ", (ROOT / n).read_text(encoding="utf-8")) for n, _ in said}
    assert [f"{n}: {s}" for n, s in said if s not in text[n]] == []


def _evidence2_sentences() -> list[tuple[str, str]]:
    """BENCHMARKS.md's and README.md's words on the second evidence round (issue 48): the first round's deferrals it
    starts from, and each FLy configuration as loosespec's presets define it."""
    from loosespec.eval.results import RESULTS, ResultsFile
    from loosespec.presets import FLY_PRESETS

    B = "BENCHMARKS.md"
    rows = [r for r in ResultsFile(ROOT / "results/bench/evidence/gsm8k" / RESULTS).read() if r["method"] == "fly-mla"]
    deferred, rounds = sum(r["stats"]["fly_deferred"] for r in rows), sum(r["rounds"] for r in rows)
    cal, paper = FLY_PRESETS["calibrated"], FLY_PRESETS["paper"]
    assert cal["adaptive_draft_length"] and not paper["adaptive_draft_length"] and paper["fly_boundary"] == "official"
    return [
        (B, f"{deferred} deferrals in {rounds:,} GSM8K rounds"),
        (
            B,
            f"(`fly-mla`, the default preset: theta {cal['fly_entropy_threshold']}, a window of "
            f"{cal['fly_window_size']} decisions after the mismatch, the cost-aware draft length;",
        ),
        (
            B,
            f"(`fly-mla@fly_preset=paper`: K = {paper['num_draft_tokens']} drafted every round by the draft model with "
            f"n-gram lookup, theta {paper['fly_entropy_threshold']}, the official window and boundary)",
        ),
        (
            "README.md",
            f"(`fly-mla@fly_preset=paper`: K = {paper['num_draft_tokens']} every round, theta "
            f"{paper['fly_entropy_threshold']}, the official window)",
        ),
    ]


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _evidence2_verdict_sentences() -> list[tuple[str, str]]:
    """The second round's summary in BENCHMARKS.md: per set the fastest method that keeps 99% of ``ar``, per FLy
    configuration its verdicts with the deferrals they rest on, where its speedup was above lossless ``exact-mla``'s
    (its decoding rate and output length there), and how the published preset lost its answers; from the points the
    frontier table is drawn from."""
    from loosespec.eval.failures import failures
    from loosespec.eval.frontier import fastest_kept, points, set_label

    dirs = [ROOT / "results/bench/evidence2" / s for s in ("humaneval", "gsm8k", "mgsm", "math500")]
    sets = {set_label(d): points(d)["methods"] for d in dirs}
    summaries = {set_label(d): _methods(str(d.relative_to(ROOT))) for d in dirs}
    fastest = {s: fastest_kept(found) for s, found in sets.items()}
    assert set(fastest.values()) == {"exact-mla"}, fastest
    exact = [f"{found['exact-mla']['speedup']:.2f}x on {s}" for s, found in sets.items()]
    said = [
        "On every set of the round, the fastest method that keeps at least 99% of `ar`'s accuracy is lossless "
        f"`exact-mla` ({_and(exact)}). Neither FLy configuration is `kept` on any set."
    ]
    by_verdict: dict[str, dict[str, list[str]]] = {}  # per configuration, its sets by verdict
    slower_on: dict[str, list[str]] = {}  # per configuration, the sets where its speedup interval is below exact's
    for label, m in (("FLy as calibrated (`fly-mla`)", "fly-mla"), ("FLy as published", "fly-mla@fly_preset=paper")):
        by = by_verdict[m] = {}
        for s, found in sets.items():
            v = found[m]["verdict"]
            assert v != "kept", (s, m)
            by.setdefault("not decided" if v.startswith("not decided") else f"`{v}`", []).append(s)
        deferred = sum(found[m]["fly_deferred"] for found in sets.values())
        could = sum(found[m]["fly_deferrable_rounds"] for found in sets.values())
        verdicts = "; ".join(f"{v} on {_and(ss)}" for v, ss in sorted(by.items()))
        rounds = sum(found[m]["rounds"] for found in sets.values())
        said.append(
            f"{label}: {verdicts}; {deferred:,} deferrals in the {could:,} rounds that could defer "
            f"({deferred / could:.1%}; {could / rounds:.0%} of its rounds could)."
        )
        faster, slower = [], []
        for s, found in sets.items():
            a, e = found[m], found["exact-mla"]
            if a["speedup_ci95"][1] < e["speedup_ci95"][0]:
                slower.append(s)
            if round(a["speedup"], 2) > round(e["speedup"], 2):
                assert a["speedup_ci95"][0] <= e["speedup_ci95"][1], (s, m)  # above it, but within its interval
                sm, se, sa = summaries[s][m], summaries[s]["exact-mla"], summaries[s]["ar"]
                faster.append(
                    f"{s} ({a['speedup']:.2f}x against {e['speedup']:.2f}x; {sm['tokens_per_s']:.2f} tok/s against "
                    f"{se['tokens_per_s']:.2f}, {sm['new_tokens'] / sm['prompts']:.0f} tokens per problem against "
                    f"`ar`'s {sa['new_tokens'] / sa['prompts']:.0f})"
                )
        slower_on[m] = slower
        if faster:
            said.append(f"Its speedup is above `exact-mla`'s only on {_and(faster)}")
        said.append(
            f"its whole speedup interval lies below `exact-mla`'s on {_and(slower)}"
            if slower
            else "its speedup interval overlaps `exact-mla`'s on every set"
        )
    lost = {
        s: [f["class"] for f in failures(d) if f["method"] == "fly-mla@fly_preset=paper"] for s, d in zip(sets, dirs)
    }
    assert all(c.count("deferred mismatch") > len(c) / 2 for c in lost.values()), lost
    said.append("FLy as published loses mostly through deferred mismatches, on every set of the round.")
    lost_on = {m: by.get("`lost`", []) for m, by in by_verdict.items()}
    readme = (
        f"Neither FLy configuration keeps 99% of `ar`'s accuracy on any set: FLy as calibrated is `lost` on "
        f"{_and(lost_on['fly-mla'])} and FLy as published on {_and(lost_on['fly-mla@fly_preset=paper'])}, the others "
        f"not decided at these sizes; FLy as published, the one that defers often, is slower than `exact-mla` on "
        f"{_and(slower_on['fly-mla@fly_preset=paper'])}."
    )
    return [("BENCHMARKS.md", s) for s in said] + [("README.md", readme)]


def test_second_evidence_round_prose_matches_the_presets_and_results():
    import re

    said = _evidence2_sentences() + _evidence2_verdict_sentences()
    text = {n: re.sub(r"\s+", " ", (ROOT / n).read_text(encoding="utf-8")) for n, _ in said}
    assert [f"{n}: {s}" for n, s in said if s not in text[n]] == []


def test_second_round_calibrated_flys_lost_humaneval_answers_restate_the_docstring_where_ar_starts_the_code():
    """BENCHMARKS.md's "The answers FLy lost in the second round, read": every HumanEval answer `fly-mla` lost parts
    from ar's right after the docstring closes, and FLy's output goes on with text the docstring already said."""
    import os
    import re

    from loosespec.eval.failures import _read
    from loosespec.presets import FLY_PRESETS

    text = re.sub(r"\s+", " ", (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert (
        "every HumanEval answer that FLy as calibrated (`fly-mla`) lost parts from `ar`'s right after the docstring"
        in text
    )
    assert "Neither preset has FLy's copy guard (`fly_copy_guard`) on." in text
    assert not FLY_PRESETS["calibrated"]["fly_copy_guard"] and not FLY_PRESETS["paper"]["fly_copy_guard"]
    rows, _ = _read(ROOT / "results/bench/evidence2/humaneval")
    ar = {r["question_id"]: r for r in rows if r["method"] == "ar"}
    lost = [r for r in rows if r["method"] == "fly-mla" and ar[r["question_id"]]["score"] and r["score"] is False]
    assert lost
    for r in lost:
        a = ar[r["question_id"]]["output"]
        shared = os.path.commonprefix([a, r["output"]])
        assert shared.rstrip().endswith(('"""', "'''")), r["question_id"]
        restated = r["output"][len(shared) :].strip().split("\n")[0][:20]
        assert restated and restated in shared, (r["question_id"], restated)
