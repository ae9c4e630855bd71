// coop 128x256 c2x1, whole-tile buffers, epilogue bf16(acc) only (not the op's output)
#include "bwc_epi.h"
BWC_EPI_VARIANT(9, 1)
