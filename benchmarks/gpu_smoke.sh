#!/usr/bin/env bash
# The GPU smoke run (issue 22; docs/gpu.md). On the GPU machine, from the repository root, with .gpu-smoke/ carried
# (made here by `python benchmarks/gpu_smoke.py prepare`):
#   benchmarks/gpu_smoke.sh                  # --device cuda when torch sees one; JSON to $OUT/gpu_smoke.json
#   benchmarks/gpu_smoke.sh --device cpu     # the CPU dry run (tiny configs)
# No network: loosespec runs from this checkout (PYTHONPATH), dependencies the image lacks or has outside
# pyproject.toml's ranges come from the carried wheels, installed into .gpu-smoke/site (never over the image's torch).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in .venv/bin/python python3 python; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c "import torch" >/dev/null 2>&1; then PY=$c; break; fi
  done
fi
if [ -z "$PY" ]; then echo "gpu_smoke: no Python with torch found (set PYTHON=...)" >&2; exit 2; fi
SITE=.gpu-smoke/site
export PYTHONPATH="$PWD:$PWD/$SITE${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONDONTWRITEBYTECODE=1
# which pinned dependencies are missing or out of range in this image (torch is never replaced)
NEED=$("$PY" - <<'PYEOF'
import re, importlib.metadata as md
from pathlib import Path
text = Path("pyproject.toml").read_text()
deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
try:
    from packaging.specifiers import SpecifierSet
except ImportError:
    SpecifierSet = None
need = []
for line in re.findall(r'"([^"]+)"', deps):
    m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?(.*)", line)
    name, spec = m.group(1), m.group(3).strip()
    if name in ("torch", "gguf", "numpy", "accelerate", "fastapi", "uvicorn", "prometheus-client"):
        continue  # torch and numpy come with the image; the others (the server's among them) are not used by the smoke run
    try:
        v = md.version(name)
    except md.PackageNotFoundError:
        need.append(name); continue
    if SpecifierSet is not None and not SpecifierSet(spec).contains(v.split("+")[0], prereleases=True):
        need.append(name)
print(" ".join(need))
PYEOF
)
"$PY" -c "import pytest" >/dev/null 2>&1 || NEED="$NEED pytest pluggy iniconfig"
if [ -n "$NEED" ]; then
  echo "gpu_smoke: this image lacks or has out-of-range: $NEED; installing the carried wheels into $SITE" >&2
  if ls .gpu-smoke/wheels/*.whl >/dev/null 2>&1; then
    PKGS=$(echo $NEED packaging pyyaml regex tqdm filelock fsspec huggingface-hub hf-xet safetensors tokenizers \
      jinja2 markupsafe typer click rich shellingham httpx httpcore h11 anyio idna certifi sniffio \
      typing-extensions annotated-doc markdown-it-py mdurl pygments | tr 'A-Z ' 'a-z\n' | sort -u | tr '\n' ' ')
    "$PY" -m pip --disable-pip-version-check -q install --no-index --no-deps --find-links .gpu-smoke/wheels \
      --target "$SITE" --upgrade $PKGS 2>&1 | tail -5 \
      || echo "gpu_smoke: installing the wheels failed; the env section will say what is missing" >&2
  else
    echo "gpu_smoke: no wheels in .gpu-smoke/wheels; the env section will say what is missing" >&2
  fi
fi
exec "$PY" benchmarks/gpu_smoke.py run "$@"
