// stream-K, tile 512 channels x 16 tokens x K 128
#include "wql_lab.h"
WQL_VARIANT(1, WQL_SK(512, 16, 128))
