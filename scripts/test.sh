#!/usr/bin/env bash
# Runs every test: the unit/integration tests, then the conformance kit for each
# backend that can run on this machine, with the native CPU kernels on and off.
# Any failing run fails the script; a run that collects no test fails too.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
status=0
run() {
  echo "+ $*"
  "$@"
  rc=$?
  if [ $rc -eq 5 ]; then echo "test.sh: no tests were collected by: $*"; status=1;
  elif [ $rc -ne 0 ]; then status=1; fi
}
backends=$($PY - <<'PY'
import bie_core
print(",".join(r.name for r in bie_core.backends() if r.status == "loaded"))
PY
)
echo "backends loaded here: $backends"
run $PY -m pytest -q -p no:cacheprovider tests
run $PY -m pytest -q -p no:cacheprovider --bie-backend="$backends" bie_core/testing
BIE_CPU_NATIVE=0 run $PY -m pytest -q -p no:cacheprovider --bie-backend=cpu bie_core/testing
exit $status
