// stream-K, tile 256 channels x 16 tokens x K 128
#include "wql_lab.h"
WQL_VARIANT(0, WQL_SK(256, 16, 128))
