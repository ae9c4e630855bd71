// current CFG0: cooperative 128x256, cluster 2x1
#include "bwc_lab.h"
using namespace cute;
BWC_VARIANT(0, BIE_WG_CFG0, cutlass::bfloat16_t)
