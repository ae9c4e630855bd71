// stream-K, tile 512 channels x 32 tokens x K 128
#include "wql_lab.h"
WQL_VARIANT(3, WQL_SK(512, 32, 128))
