"""BENCHMARKS.md quotes only what the committed result files say."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_benchmarks_md_tables_match_the_result_files():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_benchmarks_md.py"), "--check"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr


def test_every_reported_directory_exists():
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    dirs = [line.split()[2] for line in text.splitlines() if line.startswith("<!-- report ")]
    assert len(dirs) >= 4
    for d in dirs:
        assert (ROOT / d / "results.jsonl").is_file(), d
