#!/usr/bin/env bash
# The wheels the lent GPU machine lacks, fetched here (where the package registry is reachable)
# into .whl/ (git-ignored) for scripts/gpu_check.sh to install there with --no-index.
#
#   bash scripts/gpu_wheels.sh            # then: device run, carry [".whl"], scripts/gpu_check.sh
#
# The GPU image already holds torch (CUDA), numpy, scipy, pytest, pytest-xdist, grpcio, protobuf,
# typer, rich, httpx, sentencepiece, transformers, peft and matplotlib (the device tool's KINDS.md);
# fedpriv's CUDA checks import, beyond those, what is listed below (measured by importing every
# module tests/test_cuda.py and scripts/bench_scale.py load, and subtracting the image's list).
# Versions are this checkout's .venv's, built for CPython 3.12 on manylinux x86-64 (the image's
# Python); antlr4-python3-runtime 4.9.3 (pinned by omegaconf) has no wheel on PyPI and is built
# here (pure Python). About 9 MB in all: within the 64 MiB a device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PKGS="cffi cryptography dill dm-tree dp-accounting flwr grpcio-health-checking hydra-core iterators omegaconf pycryptodome pycparser"
pin() { "$PY" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
pins=()
for p in $PKGS; do
    v=$(pin "$p")
    [ -n "$v" ] || { echo "error: $p is not installed in $PY's environment (run make venv first)" >&2; exit 2; }
    pins+=("$p==$v")
done
rm -rf .whl && mkdir -p .whl
quiet() { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; }  # pip's local-index notes
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "${pins[@]}" 2> >(quiet)
"$PY" -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==$(pin antlr4-python3-runtime)" 2> >(quiet)
ls .whl
du -sh .whl
