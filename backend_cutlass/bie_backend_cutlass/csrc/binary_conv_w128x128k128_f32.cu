// One instantiation per file: CUTLASS sm_90 templates compile slowly, ninja builds the files in parallel.
#include "binary_conv_windows_sm90.cuh"

namespace bie_bconv {
BIE_BWIN_DEFINE(w128x128k128, f32, float)
}  // namespace bie_bconv
