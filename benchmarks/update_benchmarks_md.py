"""Refresh the tables in BENCHMARKS.md from the result directories they come from.

Every block between ``<!-- report DIR -->`` and ``<!-- end report -->`` is replaced by the table
``loosespec report DIR`` prints (per method, then per category when there are several), so the
numbers in BENCHMARKS.md are always the ones in ``DIR/results.jsonl``:

    python benchmarks/update_benchmarks_md.py            # rewrite BENCHMARKS.md in place
    python benchmarks/update_benchmarks_md.py --check    # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from loosespec.bench import report

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- report (\S+) -->\n)(.*?)(<!-- end report -->)", re.DOTALL)


def render(md: str) -> str:
    def table(m: re.Match) -> str:
        _, text = report(ROOT / m.group(2), draw=False, write=False)
        return m.group(1) + "\n" + text + "\n\n" + m.group(4)

    return BLOCK.sub(table, md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, default=ROOT / "BENCHMARKS.md")
    ap.add_argument("--check", action="store_true", help="only check that the tables are current")
    args = ap.parse_args(argv)
    old = args.file.read_text(encoding="utf-8")
    new = render(old)
    if args.check:
        if new != old:
            print(f"{args.file} is out of date: run python benchmarks/update_benchmarks_md.py", file=sys.stderr)
            return 1
        return 0
    args.file.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
