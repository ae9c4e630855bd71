// stream-K, tile 384 channels x 16 tokens x K 128
#include "wql_lab.h"
WQL_VARIANT(2, WQL_SK(384, 16, 128))
