#!/usr/bin/env bash
# The GPU check of bie-backend-cuda and bie-backend-cutlass, in stages (one device command runs at most 10 minutes):
#
#   bash benchmarks/gpu_check.sh STAGE [STAGE ...]
#
#   install         pip-install the distributions (and the nvidia-cutlass wheel carried in .whl/)
#   build-cuda      build the CUDA extension
#   build-cutlass   build the CUTLASS families (binary, integer, weight_only, binary_conv)
#   build           both builds at once (each CUTLASS family in its own process; BIE_FAMILIES="integer" or the like
#                   builds only the families it names). On one H200's 16 cores the CUDA extension and the binary,
#                   integer and weight_only families together take about 9 minutes of one 10-minute command (the
#                   CUDA extension 3.4 minutes, the families 7.0, 8.4 and 8.8; alone the CUDA extension takes 2
#                   minutes; with the integer family alone about 4, with binary_conv alone about 2.5): leave the
#                   tests to the next command on the warm machine. A build cut off resumes (ninja keeps the objects
#                   it finished, and the lock file of the interrupted build is removed: bie_core/native_build.py)
#   test-cuda       tests/test_cuda_backend.py, test_cuda_bound_calls.py, test_cuda_quantize_int.py, test_wq_kernel_choice.py, test_dynamic_cuda.py,
#                   test_cuda_mbwq.py, test_cuda_few_row_gemv.py and
#                   the conformance kit under cuda
#   test-cutlass    tests/test_cutlass_*.py, the compiled QConv2d's route on codes (test_int_conv_operand.py) and the
#                   conformance kit under cutlass
#   bench-wq        the weight-only product tables (bench_cuda.py --only wq --quick, bench_cutlass_wq.py --quick)
#   bench-binary    the binary product tables (bench_cuda.py --only binary --quick, bench_cutlass_binary.py --quick)
#   bench-host      host time of the layers' eager inference against nn.Linear / nn.Conv2d (bench_host.py --quick;
#                   then --decode: MPQLinear W4 g128 at 1, 5, 8 rows on Llama-3-8B's projections)
#   bench-dynamic   the dynamic int8 linear's table (bench_dynamic_cuda.py, M = 1 ... 8192 on both shapes)
#   bench-mbwq      the mixed-width weight-only kernels (bench_cuda.py --only mbwq --quick)
#   bench-bgemv     binary_linear at 1-32 rows: the one-launch GEMV against the two-launch paths (bench_binary_gemv.py)
#   bench-igemv     QLinear's int_gemm at 8-32 rows: the one-launch GEMV against the CUTLASS pair (bench_int_gemv.py)
#   bench-prefill   the W4 kernels at 128-1024 rows on Llama-3-8B's projections (bench_wq_prefill.py)
#   bench-qat       QAT convs against cuDNN and training steps (bench_qat_conv.py --quick)
#   bench-cnn       ResNet-18 end to end, eager and compiled (bench_e2e_cnn.py, 30 timed steps)
#   profile-cnn     where ResNet-18's GPU time goes per variant, and the bounds (profile_e2e_cnn.py --kernels 20)
#   explain         which wq_gemm kernel runs for a few layer shapes and why (bie_core.explain)
#   save-builds     the finished libraries of .bie_cuda_cache (each with its stamp) as xz tarballs in parts of at
#                   most 15 MiB, $OUT/builds-<name>.tar.xz.NN, to carry to the next machine of a session: a machine
#                   goes back soon after its command, and the next one would build again (2-9 minutes). Here, copy
#                   the parts into .builds/ (ignored by git) and name .builds in the next command's carry (the
#                   device tool returns at most 8 files a command, and carries 64 MiB: the CUDA extension is about
#                   80 MiB before compression); a library already in .builds/ is left out
#   restore-builds  unpack .builds/ into .bie_cuda_cache (a library whose sources changed since is not used: its
#                   build directory's name is the hash of its sources); the install stage runs it first
#   all             every stage above, in order
#
# Every stage installs first when the packages are not importable (a fresh machine). Logs go to $OUT (default
# /tmp/out): one <stage>.log each, and bench JSON. Builds are cached in .bie_cuda_cache/ (ignored by git), which a
# warm machine keeps between commands. Needs python3 with a CUDA torch, nvcc and ninja; no network.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16}
export BIE_CUDA_CACHE=${BIE_CUDA_CACHE:-$PWD/.bie_cuda_cache/cuda}
export BIE_CUTLASS_CACHE=${BIE_CUTLASS_CACHE:-$PWD/.bie_cuda_cache/cutlass}
SITE=$PWD/.bie_cuda_cache/site
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
status=0

run() {   # run NAME CMD...: log to $OUT/NAME.log, remember a failure
  local name=$1; shift
  echo "+ $*" | tee -a "$OUT/$name.log"
  "$@" 2>&1 | tee -a "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "[$name] exit $rc" | tee -a "$OUT/$name.log"
  [ "$rc" -eq 0 ] || status=1
}

save_builds() {
  local d name
  for d in .bie_cuda_cache/cuda/* .bie_cuda_cache/cutlass/*; do
    [ -f "$d/bie_build_ok" ] && ls "$d"/*.so >/dev/null 2>&1 || continue
    name=$(basename "$(dirname "$d")")-$(basename "$d" | sed 's/-torch.*-\([0-9a-f]*\)$/-\1/')
    # a library carried in .builds/ came back from an earlier machine already (the name is the sources' hash);
    # returning it again would spend the device tool's eight files a command on parts this side holds
    if [ -f ".builds/builds-$name.tar.xz.00" ]; then echo "already in .builds: $name"; continue; fi
    tar -C .bie_cuda_cache -c "${d#.bie_cuda_cache/}/bie_build_ok" $(cd .bie_cuda_cache && ls "${d#.bie_cuda_cache/}"/*.so) \
      | xz -T0 -3 | split -b 15M -d - "$OUT/builds-$name.tar.xz."
    ls -l "$OUT"/builds-"$name".tar.xz.* | awk '{print $5, $9}'
  done
}

restore_builds() {
  local first
  [ -d .builds ] || return 0
  mkdir -p .bie_cuda_cache
  for first in .builds/builds-*.tar.xz.00; do
    [ -f "$first" ] || continue
    cat "${first%.00}".* | xz -d | tar -C .bie_cuda_cache -x && echo "restored ${first%.00}"
  done
}

install() {
  restore_builds
  # the distributions' pyproject.toml need setuptools >= 77 (a machine without network installs it from .whl/)
  if ls .whl/setuptools-*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps .whl/setuptools-*.whl
  fi
  if ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        .whl/nvidia_cutlass-*.whl
  fi
  $PY -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda -e backend_cutlass
  { nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv; date -u;
    git log -1 --format='commit %H' 2>/dev/null; $PY -c "import torch; print('torch', torch.__version__, torch.version.cuda)";
    nvcc --version | tail -1; } 2>&1 | tee "$OUT/env.txt"
}

installed() {
  $PY -c "import bie_core, bie_backend_cpu, bie_backend_cuda, bie_backend_cutlass" >/dev/null 2>&1
}

stage() {
  case $1 in
    install) run install install ;;
    build-cuda)
      run build-cuda $PY -c "from bie_backend_cuda import _build; print(_build.load(verbose=False))" ;;
    build-cutlass)
      run build-cutlass $PY - <<'PY'
import time
from bie_backend_cutlass import _build
from bie_backend_cutlass.plugin_extensions import EXTENSIONS
for ext in EXTENSIONS:
    t0 = time.time()
    print(ext.family, _build.load(ext), f"{time.time() - t0:.0f} s", flush=True)
PY
      ;;
    build)   # the CUDA extension and the CUTLASS families at once (their builds barely overlap in time
             # otherwise: a family is a few large translation units that leave most cores idle)
      local pids=() fam
      $PY -c "from bie_backend_cuda import _build; print(_build.load(verbose=False))" > "$OUT/build-cuda.log" 2>&1 &
      pids+=($!)
      for fam in $($PY -c "from bie_backend_cutlass.plugin_extensions import EXTENSIONS
print(' '.join(e.family for e in EXTENSIONS))"); do
        if [ -n "${BIE_FAMILIES:-}" ] && [[ " $BIE_FAMILIES " != *" $fam "* ]]; then continue; fi
        $PY -c "
import time
from bie_backend_cutlass import _build
from bie_backend_cutlass.plugin_extensions import EXTENSIONS
t0 = time.time(); ext = next(e for e in EXTENSIONS if e.family == '$fam')
print(ext.family, _build.load(ext), f'{time.time() - t0:.0f} s', flush=True)" > "$OUT/build-cutlass-$fam.log" 2>&1 &
        pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p" || status=1; done
      tail -n 2 "$OUT"/build-cuda.log "$OUT"/build-cutlass-*.log ;;
    test-cuda)
      run test-cuda timeout 580 $PY -m pytest -q -p no:cacheprovider --tb=short -rfs \
          tests/test_cuda_backend.py tests/test_cuda_bound_calls.py tests/test_cuda_quantize_int.py \
          tests/test_wq_kernel_choice.py tests/test_import_rules.py \
          tests/test_dynamic_cuda.py tests/test_dynamic_gemv_layout.py tests/test_cuda_mbwq.py tests/test_cuda_few_row_gemv.py
      run kit-cuda timeout 300 $PY -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cuda bie_core/testing ;;
    test-cutlass)
      run test-cutlass timeout 480 $PY -m pytest -q -p no:cacheprovider --tb=short -rfs tests/test_cutlass_build.py \
          tests/test_cutlass_binary.py tests/test_cutlass_integer.py tests/test_cutlass_int_bound_calls.py \
          tests/test_cutlass_wq.py tests/test_cutlass_dynamic.py tests/test_int_conv_operand.py
      run kit-cutlass timeout 300 $PY -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cutlass bie_core/testing ;;
    bench-wq)
      run bench-wq timeout 330 $PY benchmarks/bench_cuda.py --quick --only wq --json "$OUT/bench_cuda_wq.json"
      run bench-wq timeout 240 $PY benchmarks/bench_cutlass_wq.py --quick --json "$OUT/bench_cutlass_wq.json" ;;
    bench-binary)
      run bench-binary timeout 240 $PY benchmarks/bench_cuda.py --quick --only binary --json "$OUT/bench_cuda_binary.json"
      run bench-binary timeout 300 $PY benchmarks/bench_cutlass_binary.py --quick --json "$OUT/bench_cutlass_binary.json" ;;
    bench-host)
      run bench-host timeout 400 $PY benchmarks/bench_host.py --device cuda --quick --out-dir "$OUT"
      run bench-host timeout 300 $PY benchmarks/bench_host.py --device cuda --quick --decode --out-dir "$OUT" ;;
    bench-dynamic)
      run bench-dynamic timeout 400 $PY benchmarks/bench_dynamic_cuda.py "$OUT/dynamic_cuda.json" \
          --ms 1,2,4,8,16,64,256,1024,2048,4096,8192 ;;
    bench-mbwq)
      run bench-mbwq timeout 200 $PY benchmarks/bench_cuda.py --quick --only mbwq --json "$OUT/mbwq_cuda.json" ;;
    bench-bgemv)
      run bench-bgemv timeout 240 $PY benchmarks/bench_binary_gemv.py ;;
    bench-igemv)
      run bench-igemv timeout 240 $PY benchmarks/bench_int_gemv.py ;;
    bench-prefill)
      run bench-prefill timeout 300 $PY benchmarks/bench_wq_prefill.py ;;
    bench-qat)
      run bench-qat timeout 300 $PY benchmarks/bench_qat_conv.py --quick --json "$OUT/qat_conv.json" --md "$OUT/qat_conv.md" ;;
    bench-cnn)
      mkdir -p "$OUT/cnn_eager" "$OUT/cnn_compiled"
      run bench-cnn timeout 200 $PY benchmarks/bench_e2e_cnn.py --compile off --steps 30 --out "$OUT/cnn_eager"
      run bench-cnn timeout 400 $PY benchmarks/bench_e2e_cnn.py --compile on --steps 30 --out "$OUT/cnn_compiled" ;;
    profile-cnn)
      run profile-cnn timeout 420 $PY benchmarks/profile_e2e_cnn.py --kernels 20 --md "$OUT/e2e_cnn_profile.md" \
        --json "$OUT/e2e_cnn_profile.json" ;;
    save-builds) run save-builds save_builds ;;
    restore-builds) run restore-builds restore_builds ;;
    explain)
      run explain $PY - <<'PY'
import torch
import bie_core
from bie_core.ops.weight_only import make_wq_case, wq_gemm
gen = torch.Generator().manual_seed(0)
for n, k in ((4096, 4096), (28672, 8192)):
    qw, s, z, gi, _ = make_wq_case(k, n, 4, 128, "gptq", False, gen, "cuda", sdtype=torch.float16)
    for m in (1, 8, 16, 64, 256, 2048):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        e = bie_core.explain(wq_gemm, x, qw, s, z, gi, None, 4, 128, "gptq")
        print(f"M={m} {n}x{k}: {e.chosen()['wq_gemm']}")
    print(e)
PY
      ;;
    *) echo "unknown stage $1 (install build build-cuda build-cutlass test-cuda test-cutlass bench-wq bench-binary bench-host"\
            "bench-dynamic bench-mbwq bench-bgemv bench-igemv bench-prefill bench-qat bench-cnn profile-cnn save-builds"\
            "restore-builds explain all)"
       status=1 ;;
  esac
}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(all)
if [ "${stages[0]}" = all ]; then
  stages=(install build build-cuda build-cutlass test-cuda test-cutlass bench-wq bench-binary explain)
fi
if [ "${stages[0]}" != install ] && ! installed; then
  run install install
fi
for s in "${stages[@]}"; do
  stage "$s"
done
grep -h -E "passed|failed|error|\[.*\] exit" "$OUT"/*.log 2>/dev/null | tail -40
exit $status
