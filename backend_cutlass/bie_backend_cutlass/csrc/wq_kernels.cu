// bie-backend-cutlass, weight-only family: the table of GEMM instantiations.
#include "wq_launch.h"

namespace bie_wq {

#define BIE_WQ_DECLARE(cfg)                                         \
  std::string wq_##cfg##_w4_f16(const WqArgs&, size_t*);            \
  std::string wq_##cfg##_w4_bf16(const WqArgs&, size_t*);           \
  std::string wq_##cfg##_w8_f16(const WqArgs&, size_t*);            \
  std::string wq_##cfg##_w8_bf16(const WqArgs&, size_t*);
BIE_WQ_DECLARE(c128x256)
BIE_WQ_DECLARE(c128x128)
BIE_WQ_DECLARE(p64x128)
BIE_WQ_DECLARE(s128x16)
BIE_WQ_DECLARE(s128x32)
BIE_WQ_DECLARE(s256x16)
BIE_WQ_DECLARE(s256x32)
BIE_WQ_DECLARE(s256x64)

WqFn wq_fn(int config, int bits_code, int act_code) {
  static const WqFn table[kNumConfigs][2][2] = {
      {{wq_c128x256_w4_f16, wq_c128x256_w4_bf16}, {wq_c128x256_w8_f16, wq_c128x256_w8_bf16}},
      {{wq_c128x128_w4_f16, wq_c128x128_w4_bf16}, {wq_c128x128_w8_f16, wq_c128x128_w8_bf16}},
      {{wq_p64x128_w4_f16, wq_p64x128_w4_bf16}, {wq_p64x128_w8_f16, wq_p64x128_w8_bf16}},
      {{wq_s128x16_w4_f16, wq_s128x16_w4_bf16}, {wq_s128x16_w8_f16, wq_s128x16_w8_bf16}},
      {{wq_s128x32_w4_f16, wq_s128x32_w4_bf16}, {wq_s128x32_w8_f16, wq_s128x32_w8_bf16}},
      {{wq_s256x16_w4_f16, wq_s256x16_w4_bf16}, {wq_s256x16_w8_f16, wq_s256x16_w8_bf16}},
      {{wq_s256x32_w4_f16, wq_s256x32_w4_bf16}, {wq_s256x32_w8_f16, wq_s256x32_w8_bf16}},
      {{wq_s256x64_w4_f16, wq_s256x64_w4_bf16}, {wq_s256x64_w8_f16, wq_s256x64_w8_bf16}},
  };
  if (config < 0 || config >= kNumConfigs || bits_code < 0 || bits_code > 1 || act_code < 0 || act_code > 1)
    return nullptr;
  return table[config][bits_code][act_code];
}

}  // namespace bie_wq
