#!/bin/bash
# Session 32, the final tree: build, SASS check, every CUDA test, the conformance kit under cuda.
# GPU machine, repository root, carrying .whl: BIE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/lab/run_s32_check.sh
source benchmarks/lab/thin_lab.sh
lab_build
lab_sass
lab_tests
echo "done at $(el) s"
