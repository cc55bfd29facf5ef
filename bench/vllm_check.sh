#!/usr/bin/env bash
# Real vLLM behind Lifeline, in one command, on a machine with a CUDA device:
# installs vLLM (the CUDA build) into its own venv, .lifeline/tools/vllm-cuda, runs tests/gpu/test_vllm_failover.py (two `vllm serve` of the
# `small` preset, the agent holding their leases, a gateway; SIGKILL the vLLM
# serving a stream; the stream must go on) and writes a result file.
#
#   bench/vllm_check.sh                      # result: bench/results/vllm_check.json
#   VLLM_VERSION=0.11.0 RESULT=/tmp/r.json bench/vllm_check.sh
#
# Needs: python3 (3.11+), git checkout of Lifeline, Redis on 127.0.0.1:6379
# (started here if redis-server is installed), network to PyPI for the
# first run. Exit status: pytest's (0 passed; 5 would mean nothing ran).
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION="${VLLM_VERSION:-0.11.0}"
RESULT="${RESULT:-bench/results/vllm_check.json}"
VLLM_VENV="${VLLM_VENV:-.lifeline/tools/vllm-cuda}"  # never the CPU build `make vllm` keeps in .lifeline/tools/vllm
PY="${PY:-python3}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L | grep -q GPU; then
  echo "vllm_check: no CUDA device (nvidia-smi -L lists none); this check needs one" >&2
  exit 2
fi

make install                       # .venv: Lifeline itself (gateway, agent, model build on CPU torch)
if [ ! -x "$VLLM_VENV/bin/vllm" ]; then
  echo "installing vllm==$VLLM_VERSION into $VLLM_VENV"
  "$PY" -m venv "$VLLM_VENV"
  "$VLLM_VENV/bin/pip" install -q --upgrade pip
  "$VLLM_VENV/bin/pip" install -q "vllm==$VLLM_VERSION"
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
fi

mkdir -p "$(dirname "$RESULT")"
rm -f "$RESULT"
set +e
LIFELINE_VLLM="$PWD/$VLLM_VENV/bin/vllm" LIFELINE_GPU_RESULT="$RESULT" \
  # tests/gpu/test_holder_cuda_ipc.py needs a CUDA torch in the interpreter that runs it (docs/holder.md)
  .venv/bin/python -m pytest -m gpu tests/gpu/test_vllm_failover.py -v -rA --timeout 1800 -p no:cacheprovider 2>&1 | tee "${RESULT%.json}.log"
status=${PIPESTATUS[0]}
set -e
"$PY" - "$RESULT" "$status" "$VLLM_VERSION" <<'PYEOF'
import json, pathlib, subprocess, sys
path, status, version = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
record = json.loads(path.read_text()) if path.exists() else {"note": "the test wrote no record: see the .log"}
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
record.update({"pytest_exit_status": status, "passed": status == 0, "vllm_requested": version, "gpu": gpu})
path.write_text(json.dumps(record, indent=2) + "\n")
print(json.dumps(record, indent=2))
PYEOF
exit "$status"
