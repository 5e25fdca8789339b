#!/usr/bin/env bash
# A Python environment for Triton's Python backend under PyTriton's bundled tritonserver:
#     scripts/triton_env.sh VENV
# then `VENV/bin/python scripts/pytriton_server.py --model-repository REPO` serves a `spot triton-repo` repository,
# and SPOT_TRITON_VENV=VENV lets tests/test_triton.py run it. PyTriton pins numpy < 2, hence its own environment; spot
# is installed editable, so the server runs this checkout's code.
set -euo pipefail
venv=${1:?usage: scripts/triton_env.sh VENV}
repo=$(cd "$(dirname "$0")/.." && pwd)
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$repo[triton]"
"$venv/bin/python" -c "import pytriton, spot; print('PyTriton environment ready:', '$venv')"
