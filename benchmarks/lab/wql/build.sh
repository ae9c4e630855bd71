#!/bin/bash
# Builds wql_lab.so here:  CUTLASS_INC=<.../cutlass_library/source/include> bash build.sh
exec bash "$(dirname "$0")/../cutlass_lab_build.sh" "$(dirname "$0")" wq_gemm_sm90.cuh "reorder v0 v1 v2 v3"
