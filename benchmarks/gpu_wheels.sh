#!/usr/bin/env bash
# The wheels the GPU check (benchmarks/gpu_check.py) carries to a GPU machine without network:
# what fitkit and the check need that its image lacks (Python 3.12, x86-64; it has torch with
# CUDA, lightning, transformers, accelerate, torchmetrics, rich, numpy, pytest, pytest-xdist).
# Downloaded into .whl/ (ignored by git, never committed); DeepSpeed has no wheel on PyPI, so its
# source is built here into a pure-Python wheel with its CUDA ops left to JIT on the GPU machine.
#
#   bash benchmarks/gpu_wheels.sh              # into .whl/ (about 20 MB); PYTHON=... to choose pip's Python
#   NO_DEEPSPEED=1 bash benchmarks/gpu_wheels.sh
#
# Each package's version is the one installed where this runs (the versions the suite passes
# with), else PyPI's newest. Then, on the GPU machine, before the check:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
DEST=.whl
mkdir -p "$DEST"

# fitkit's own (lightning-fabric, optuna and optuna's), Keras 3 for the Keras test files, and
# DeepSpeed's pure-Python needs (pydantic's core is compiled: a cp312 manylinux wheel)
PACKAGES=(lightning-fabric optuna alembic sqlalchemy mako colorlog keras namex optree hjson pydantic pydantic-core
          annotated-types typing-inspection typing-extensions)
DEEPSPEED_VERSION=${DEEPSPEED_VERSION:-0.19.8}

pinned() {  # NAME==VERSION when NAME is installed here, else NAME
    "$PYTHON" - "$1" <<'EOF'
import importlib.metadata as md, sys
name = sys.argv[1]
try:
    print(f"{name}=={md.version(name)}")
except md.PackageNotFoundError:
    print(name)
EOF
}

PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
    PLATFORMS+=(--platform "$p")
done

for name in "${PACKAGES[@]}"; do
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLATFORMS[@]}" -d "$DEST" "$(pinned "$name")"
done

if [ -z "${NO_DEEPSPEED:-}" ] && ! ls "$DEST"/deepspeed-*.whl >/dev/null 2>&1; then
    SRC=$(mktemp -d)
    "$PYTHON" -m pip download -q --no-deps --no-binary=:all: -d "$SRC" "deepspeed==$DEEPSPEED_VERSION"
    # no ops built here (DS_BUILD_OPS=0): they compile on first use on the GPU machine (nvcc, ninja)
    DS_BUILD_OPS=0 "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$SRC"/deepspeed-*.tar.gz
    rm -rf "$SRC"
fi

ls -la "$DEST"
du -sh "$DEST"
