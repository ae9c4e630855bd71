#!/bin/bash
# Builds bwc_lab.so here:  CUTLASS_INC=<.../cutlass_library/source/include> bash build.sh
exec bash "$(dirname "$0")/../cutlass_lab_build.sh" "$(dirname "$0")" binary_wgmma.cuh \
    "v0 v1 v2 v3 v4 v5 v6 v7 v8 v9 v11 v12 v13 v14 v17 popc" -DCUTLASS_ENABLE_GDC_FOR_SM90
