#!/bin/bash
# Session 28: the thin kernel's ring depth or block size against the product (BIE_WQT_S16 = 4 against 6 and 8 by
# default), with its K slices forced (more slices leave shared memory for deeper rings beside the staged x). The
# builds run at once.
source benchmarks/lab/thin_lab.sh   # (set-up, env.txt, el; each variant below sets its own cache and jobs)
VARIANTS=${VARIANTS:-"4 6 8"}
# variant 4 is the product; w20 / w24: BIE_WQT_LAB_MAXWARPS (blocks of 20 / 24 warps); s8_N: the one-tile kernels'
# ring depth BIE_WQT_S8=N; b8_N: the 8-bit one-tile ring depth BIE_WQT_S8B=N; b: the lab bounds build (BIE_WQT_LAB_BOUNDS; ways slices:warps:lab); else the two-tile ring
# depth BIE_WQT_S16; xN: the lab bound BIE_WQT_LAB_XWRAP (session 30) with the two-tile ring depth N
def() { case $1 in w*) echo BIE_WQT_LAB_MAXWARPS=${1#w};; s8_*) echo BIE_WQT_S8=${1#s8_};; b8_*) echo BIE_WQT_S8B=${1#b8_};; b) echo BIE_WQT_LAB_BOUNDS;; x*) echo "BIE_WQT_LAB_XWRAP BIE_WQT_S16=${1#x}";; *) echo BIE_WQT_S16=$1;; esac; }
# per-variant ways and cases: WAYS_<variant> (e.g. WAYS_w20=0:0,0:20), else WAYS; CASES_<variant>, else CASES
for s in $VARIANTS; do
  ( export MAX_JOBS=6 BIE_CUDA_CACHE=/tmp/cache_s$s; [ $s = 4 ] || export BIE_CUDA_DEFINES="$(def $s)"
    python3 -c "from bie_backend_cuda import _build; print('cuda ready:', _build.load())" > $OUT/build_s$s.log 2>&1 ) &
done
wait; echo "builds done at $(el) s"; tail -qn1 $OUT/build_s*.log
for s in $VARIANTS; do
  export BIE_CUDA_CACHE=/tmp/cache_s$s; if [ $s = 4 ]; then unset BIE_CUDA_DEFINES; else export BIE_CUDA_DEFINES="$(def $s)"; fi
  W=WAYS_$s; W=${!W:-$WAYS}; C=CASES_$s; C=${!C:-$CASES}
  timeout ${TLIM:-150} python3 benchmarks/lab/thin_s28.py ${C:+--cases $C} ${W:+--ways $W} 2>&1 | grep -v -i warn | tee -a $OUT/ring.txt
  echo "s$s done at $(el) s"
done
