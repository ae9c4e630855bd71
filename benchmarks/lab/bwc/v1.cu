// current CFG2: ping-pong 64x256, cluster 2x1
#include "bwc_lab.h"
using namespace cute;
BWC_VARIANT(1, cutlass::bfloat16_t, BIE_WG_CFG2)
