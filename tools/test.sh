#!/usr/bin/env bash
# The project's test command (the README's second command and CI's): notebooks and library in sync,
# notebooks clean, README rendered from nbs/index.ipynb, then every notebook and every pytest test.
# Every part runs even when an earlier one fails (one CI run shows every failure); the exit status is 1 when nbdev_test
# or pytest failed. At the end: the 25 slowest tests, the 15 slowest notebooks and the seconds of each part.
set -euo pipefail
cd "$(dirname "$0")/.."
nb_log=$(mktemp); vllm_log=$(mktemp)
trap 'rm -f "$nb_log" "$vllm_log"' EXIT
t_start=$SECONDS
# torch's OpenMP threads busy-wait by default; on a small shared machine that makes tiny ops many times slower.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
echo "== checking that nbs/ and rlhf_nb/ are in sync (nbdev_export, nbdev_clean)"
snapshot() { find rlhf_nb nbs README.md -type f -not -path "*/__pycache__/*" -not -path "*/.ipynb_checkpoints/*" | sort | xargs sha1sum; }
before=$(snapshot)
nbdev_export
nbdev_clean
python tools/render_readme.py --check
after=$(snapshot)
if [ "$before" != "$after" ]; then
  echo "nbdev_export or nbdev_clean changed files: the notebooks and the library are out of sync:"
  diff <(echo "$before") <(echo "$after") || true
  exit 1
fi
echo "== the vLLM (CPU) engine's own virtualenv, set up in the background while the notebooks run (tools/vllm_env.sh)"
tools/vllm_env.sh >"$vllm_log" 2>&1 &
vllm_pid=$!
echo "== nbdev_test (notebook cells are the tests; slow, gpu and vllm cells skipped: tests/test_rollout_vllm.py runs those)"
t_nb=$SECONDS
nb_status=0   # pipefail: the pipeline fails when nbdev_test does (tee passes its output through and succeeds)
nbdev_test --n_workers 2 --timing 2>&1 | tee "$nb_log" || nb_status=$?
python tools/notebook_budget.py "$nb_log"
t_nb=$((SECONDS - t_nb))
echo "== headless browser for tests/test_docs_site.py (Debian's chromium and chromium-driver)"
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
      || echo "WARNING: installing chromium failed: tests/test_docs_site.py will SKIP its browser check"
  else
    echo "WARNING: chromium/chromedriver missing and not root: tests/test_docs_site.py will SKIP its browser check"
  fi
fi
if wait "$vllm_pid"; then
  export RLHF_NB_VLLM_PYTHON="$(tail -n 1 "$vllm_log")"
  echo "vLLM engine: $RLHF_NB_VLLM_PYTHON"
else
  echo "tools/vllm_env.sh failed (tests/test_rollout_vllm.py will fail):"; tail -n 20 "$vllm_log"
fi
export RLHF_NB_REQUIRE_VLLM=1
echo "== pytest tests/ in two workers, each taking whole test files (the 25 slowest tests are listed at its end)"
t_py=$SECONDS
py_status=0
python -m pytest tests/ -q -p no:cacheprovider -p no:benchmark -n 2 --dist loadfile --durations=25 || py_status=$?
t_py=$((SECONDS - t_py))
echo "== the 15 slowest notebooks (nbdev_test --timing; its lines are further up)"
if grep -qE '^\S+\.ipynb: [0-9]+ secs$' "$nb_log"; then
  grep -E '^\S+\.ipynb: [0-9]+ secs$' "$nb_log" | sort -t: -k2,2nr | sed -n 1,15p
else
  echo "no notebook timings: nbdev_test prints them only when every notebook passed"
fi
echo "== seconds: nbdev_test $t_nb, pytest $t_py, all $((SECONDS - t_start))"
[ "$nb_status" = 0 ] || echo "FAILED: nbdev_test (exit status $nb_status): see 'nbdev Tests Failed On The Following Notebooks' above"
[ "$py_status" = 0 ] || echo "FAILED: pytest (exit status $py_status): see its short summary above"
[ "$nb_status" = 0 ] && [ "$py_status" = 0 ]
