#!/bin/bash
# Session 12, device call 1 (carry .whl): the binary family's build, SASS check, tests, kit and GEMM table,
# bie-backend-cuda built alongside for its column. The same steps as session 13's script, GEMM table only.
BENCH_ONLY=gemm exec bash "$(dirname "$0")/run_s13_binary.sh"
