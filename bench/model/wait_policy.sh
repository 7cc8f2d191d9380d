#!/usr/bin/env bash
# OpenMP wait policies, alone and beside one busy process, interleaved:
#  - `pagedattn generate`: one stream's decode tokens/s (MODEL, default the
#    test model);
#  - the Python package: seconds for 4 x 64 tokens on the synthetic tiny model.
# Policies: the runtime's default (libgomp: spin 300,000 iterations, then
# sleep; what the library leaves in place) and passive (sleep at once).
# Usage: bench/model/wait_policy.sh [ROUNDS]
#   PAGEDATTN_CLI (default build/release/tools/pagedattn), PYTHON (default
#   build/pyenv/bin/python, with the package installed).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
cli=${PAGEDATTN_CLI:-build/release/tools/pagedattn}
python=${PYTHON:-build/pyenv/bin/python}
[[ $python = /* ]] || python=$PWD/$python  # the Python case runs from /tmp
model=${MODEL:-$(scripts/get_test_model.sh)}
with_policy() {  # with_policy POLICY COMMAND...: default leaves OMP_WAIT_POLICY unset
  if [ "$1" = default ]; then shift; env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$@"
  else local p=$1; shift; env -u GOMP_SPINCOUNT OMP_WAIT_POLICY="$p" "$@"; fi
}

decode_rate() {  # decode_rate POLICY: generate's decode tokens/s
  with_policy "$1" "$cli" generate --model "$model" --max-tokens 64 --ignore-eos \
    --prompt "Write a long story about a robot who learns to paint." 2>&1 >/dev/null |
    grep -o "decode [0-9.]* tokens/s" | head -1
}
python_seconds() {  # python_seconds POLICY: the Python engine loop's seconds
  (cd /tmp && with_policy "$1" "$python" - <<'PY'
import time
import pagedattn
engine = pagedattn.Engine("tiny")
start = time.perf_counter()
for i in range(4):
    engine.add_request([1 + i, 2, 3, 4, 5], pagedattn.SamplingParams(max_tokens=64, ignore_eos=True))
while engine.has_unfinished():
    engine.step()
print(f"{time.perf_counter() - start:.3f} s")
PY
  )
}

for round in $(seq "$rounds"); do
  for load in alone busy; do
    busy=
    if [ "$load" = busy ]; then (while :; do :; done) & busy=$!; fi
    for policy in default passive; do
      echo "round $round, $load, $policy: generate $(decode_rate $policy); python $(python_seconds $policy)"
    done
    if [ -n "$busy" ]; then kill "$busy"; wait "$busy" 2>/dev/null || true; fi
  done
done
