#!/bin/bash
# Session 33, the final tree (product code as session 32's final tree 467433e): build, SASS check, every CUDA test,
# the conformance kit under cuda, then the product table with what is left of the call.
# GPU machine, repository root, carrying .whl: BIE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/lab/run_s33_check.sh
source benchmarks/lab/thin_lab.sh
lab_build
lab_sass
lab_tests
echo "tests done at $(el) s"
lab_table
echo "done at $(el) s"
