#!/bin/bash
# Session 30: a bound on streaming x through a ring at 9-16 rows (one pass over K, no K slices or fewer): the lab build
# BIE_WQT_LAB_XWRAP holds only BIE_WQT_XW stages of x and re-reads them cyclically (wrong results), so that one slice
# (or the forced slices) fits beside two-tile rings of 4 / 6 / 8 stages (variants x4 / x6 / x8), against the product
# (variant 4). Ways slices:warps:XW=8 (slices 0: one slice in the lab build). Through run_s28_ring.sh (builds at once).
C16=16x28672x8192x4x128,12x28672x8192x4x128,16x8192x28672x4x128,16x4096x4096x4x128
VARIANTS=${VARIANTS:-"4 x4 x6 x8"} WAYS=${WAYS:-0:0,0:0:XW=8,4:0:XW=8,8:0:XW=8} WAYS_4=0:0 CASES=${CASES:-$C16} \
TLIM=${TLIM:-100} exec bash "$(dirname "$0")/run_s28_ring.sh"
