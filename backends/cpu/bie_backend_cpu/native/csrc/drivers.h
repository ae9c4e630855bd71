// Generic drivers, included once per ISA variant (inside that variant's
// anonymous namespace, after its primitives; the variant exports the drv_*
// functions it provides as bie_<variant>_<op>, see BIE_EXPORT). It defines:
//
//   BIE_WITH_PACK / _BINARY / _INT   which drivers it provides
//   sgn_mask16<DT>(p)            sign bits of 16 elements (bit i = element i >= 0)
//   or_bit_lanes16(dst, m, bit)  dst[i] |= bit for every set bit i of m (i < 16;
//                                may rewrite all 16 lanes of dst)
//   finish_row(...)              the epilogue of one output row segment
//   quant_block<DT>(x, n, s, lo, hi, out, sv)  quantize n contiguous elements with the
//                                scale s, or sv[i] per element when sv is not null
//   binary: BMR, BNR, btile<MR, NR>(A, lda, B, pstride, KW, tile)
//           tile[r * BNR * 8 + c] = popcount over KW words of A[r] ^ column c
//   int:    IMR, INR, IPW (columns per panel), IKSTEP (k per step), IBSIZE (bytes per
//           weight element), IVNNI, iscalar_t, iprep_row(), itile<MR, NR>()
//
// Bounds: every loop below is limited by the sizes in the argument block;
// partial vectors are staged through small local buffers, never read past
// the end of a row.

template <int DT>
static inline uint32_t sgn_mask_n(const void* p, int64_t n) {   // 0 < n <= 16
  alignas(64) unsigned char buf[64] = {0};
  __builtin_memcpy(buf, p, (size_t)(n * bie_esize(DT)));
  return sgn_mask16<DT>(buf) & ((n >= 16) ? 0xffffu : ((1u << n) - 1u));
}

static inline int64_t bie_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t bie_max(int64_t a, int64_t b) { return a > b ? a : b; }

// A compile-time int passed as a value: run(IntTag<V>()) instantiates run's body for V only, which
// turns a runtime dtype or row count into a template argument.
template <int V>
struct IntTag { static constexpr int value = V; };

// run(IntTag<DT>()) for the dtype of signs input (float32, float16, bfloat16 or int8);
// any other dtype is a bad argument.
template <class Run>
static inline int with_sign_input_dtype(int dtype, Run run) {
  switch (dtype) {
    case BIE_F32: return run(IntTag<BIE_F32>());
    case BIE_F16: return run(IntTag<BIE_F16>());
    case BIE_BF16: return run(IntTag<BIE_BF16>());
    case BIE_I8: return run(IntTag<BIE_I8>());
  }
  return BIE_EBADARG;
}

// run(IntTag<mr>()) for a tile of mr rows, 1 <= mr <= MAXR <= 6; only those row counts are instantiated.
template <int MAXR, class Run>
static inline void with_tile_rows(int64_t mr, Run run) {
  switch (mr) {
    case 1: run(IntTag<1>()); break;
    case 2: if constexpr (MAXR >= 2) run(IntTag<2>()); break;
    case 3: if constexpr (MAXR >= 3) run(IntTag<3>()); break;
    case 4: if constexpr (MAXR >= 4) run(IntTag<4>()); break;
    case 5: if constexpr (MAXR >= 5) run(IntTag<5>()); break;
    case 6: if constexpr (MAXR >= 6) run(IntTag<6>()); break;
  }
}

#if BIE_WITH_PACK
// ------------------------------------------------------------- pack_signs
template <int DT>
static int pack_rows(const bie_pack_args* p, int64_t r0, int64_t r1) {
  const int es = bie_esize(DT);
  const int64_t k = p->k, kb = (k + 7) / 8;
  for (int64_t r = r0; r < r1; ++r) {
    const char* x = (const char*)p->x + r * p->ldx * es;
    uint8_t* o = p->out + r * kb;
    int64_t j = 0;
    for (; j + 16 <= k; j += 16) {
      uint32_t m = sgn_mask16<DT>(x + j * es);
      o[j / 8] = (uint8_t)(m & 0xffu);
      o[j / 8 + 1] = (uint8_t)(m >> 8);
    }
    if (j < k) {
      int64_t n = k - j;
      uint32_t m = sgn_mask_n<DT>(x + j * es, n);
      o[j / 8] = (uint8_t)(m & 0xffu);
      if (n > 8) o[j / 8 + 1] = (uint8_t)(m >> 8);
    }
  }
  return BIE_OK;
}

static int drv_pack(const void* args, int64_t t0, int64_t t1) {
  const bie_pack_args* p = (const bie_pack_args*)args;
  return with_sign_input_dtype(p->dtype, [&](auto dt) { return pack_rows<decltype(dt)::value>(p, t0, t1); });
}

// ------------------------------------------- binary conv: signs -> bit map
// task t = (n, block of hrows input rows): writes xs[n, h + ph, pw + w, g*CW + cw]
// for those rows and every w, g, cw
template <int DT>
static int conv_pack_tasks(const bie_bconv_pack_args* p, int64_t t0, int64_t t1) {
  const int es = bie_esize(DT);
  const int64_t W = p->W, GCW = p->G * p->CW, nhb = (p->H + p->hrows - 1) / p->hrows;
  const char* x = (const char*)p->x;
  if (p->sW == 1) {                 // rows contiguous along W (NCHW-like)
    const bool merged = p->sH == W;  // and the rows of a channel one contiguous run
    const int64_t L16 = (p->hrows * W + 15) / 16 * 16;
    uint64_t* tmp = (uint64_t*)__builtin_malloc((size_t)(L16 + 16) * 8 + 64);
    if (!tmp) return BIE_ENOMEM;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / nhb, h0 = (t % nhb) * p->hrows, h1 = bie_min(p->H, h0 + p->hrows);
      const int64_t L = (h1 - h0) * W;
      for (int64_t g = 0; g < p->G; ++g) {
        for (int64_t cw = 0; cw < p->CW; ++cw) {
          for (int64_t e = 0; e < L16 + 16; ++e) tmp[e] = 0;
          const int64_t c_lo = cw * 64, c_hi = bie_min(p->Cg, c_lo + 64);
          for (int64_t c = c_lo; c < c_hi; ++c) {
            const uint64_t bit = 1ull << (c - c_lo);
            const char* chan = x + (n * p->sN + (g * p->Cg + c) * p->sC) * es;
            const int64_t hend = merged ? h0 + 1 : h1;   // one merged run, or row by row
            for (int64_t h = h0; h < hend; ++h) {
              const int64_t len = merged ? L : W;
              const char* run = chan + h * p->sH * es;
              uint64_t* tt = tmp + (h - h0) * W;    // lanes past len are left unchanged
              int64_t e = 0;
              for (; e + 16 <= len; e += 16) or_bit_lanes16(tt + e, sgn_mask16<DT>(run + e * es), bit);
              if (e < len) or_bit_lanes16(tt + e, sgn_mask_n<DT>(run + e * es, len - e), bit);
            }
          }
          for (int64_t h = h0; h < h1; ++h) {
            uint64_t* dst = p->xs + ((n * p->Hp + h + p->ph) * p->Wp + p->pw) * GCW + g * p->CW + cw;
            const uint64_t* src = tmp + (h - h0) * W;
            for (int64_t w = 0; w < W; ++w) dst[w * GCW] = src[w];
          }
        }
      }
    }
    __builtin_free(tmp);
  } else {                          // any other layout (channels_last: sC == 1)
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / nhb, h0 = (t % nhb) * p->hrows, h1 = bie_min(p->H, h0 + p->hrows);
      for (int64_t h = h0; h < h1; ++h) {
        for (int64_t w = 0; w < W; ++w) {
          const char* base = x + (n * p->sN + h * p->sH + w * p->sW) * es;
          uint64_t* dst = p->xs + ((n * p->Hp + h + p->ph) * p->Wp + w + p->pw) * GCW;
          for (int64_t g = 0; g < p->G; ++g) {
            for (int64_t cw = 0; cw < p->CW; ++cw) {
              const int64_t c0 = g * p->Cg + cw * 64, nb = bie_min(64, p->Cg - cw * 64);
              uint64_t word = 0;
              if (p->sC == 1) {
                int64_t q = 0;
                for (; q + 16 <= nb; q += 16) word |= (uint64_t)sgn_mask16<DT>(base + (c0 + q) * es) << q;
                if (q < nb) word |= (uint64_t)sgn_mask_n<DT>(base + (c0 + q) * es, nb - q) << q;
              } else {
                for (int64_t q = 0; q < nb; ++q)
                  word |= (uint64_t)bie_sign1<DT>(base + (c0 + q) * p->sC * es, 0) << q;
              }
              dst[g * p->CW + cw] = word;
            }
          }
        }
      }
    }
  }
  return BIE_OK;
}

static int drv_bconv_pack(const void* args, int64_t t0, int64_t t1) {
  const bie_bconv_pack_args* p = (const bie_bconv_pack_args*)args;
  return with_sign_input_dtype(p->dtype, [&](auto dt) { return conv_pack_tasks<decltype(dt)::value>(p, t0, t1); });
}

// ------------------------------------------------------------- quantize_int
#define BIE_QCHUNK 8192
// elements e0 .. e1 - 1, whose values start at src
template <int DT>
static void quant_span(const bie_quant_args* p, const char* src, int64_t e0, int64_t e1, float lo, float hi) {
  const int es = bie_esize(DT);
  if (!p->svec) {
    quant_block<DT>(src, e1 - e0, (float)p->scale, lo, hi, p->out + e0, nullptr);
  } else if (p->inner == 1) {                     // one scale per element
    quant_block<DT>(src, e1 - e0, 0.0f, lo, hi, p->out + e0, p->svec + e0);
  } else {                                        // runs of `inner` elements share a scale
    for (int64_t e = e0; e < e1;) {
      const int64_t end = bie_min(e1, (e / p->inner + 1) * p->inner);
      quant_block<DT>(src + (e - e0) * es, end - e, p->svec[e / p->inner], lo, hi, p->out + e, nullptr);
      e = end;
    }
  }
}

template <int DT>
static inline void bie_store_dt(unsigned char* p, int64_t i, float v) {
  if (DT == BIE_F32) {
    __builtin_memcpy(p + 4 * i, &v, 4);
  } else {
    const uint16_t h = DT == BIE_F16 ? bie_f32_to_f16(v) : bie_f32_to_bf16(v);
    __builtin_memcpy(p + 2 * i, &h, 2);
  }
}

// x + shift, rounded to x's dtype, staged a block at a time in a local buffer (no pass over memory of its own),
// then quantized. Along a block the shift is either constant over runs of sh_inner elements (a channel's plane of an
// NCHW tensor) or, with sh_inner 1, a contiguous slice of shift (the features of a row): each inner loop is a
// straight run the compiler can vectorize.
template <int DT>
static void quant_range_shifted(const bie_quant_args* p, const char* x, int64_t e0, int64_t e1, float lo, float hi) {
  constexpr int64_t T = 1024;
  alignas(64) unsigned char buf[T * 4];
  const int es = bie_esize(DT);
  const int64_t inner = p->sh_inner, period = p->sh_period;
  for (int64_t b0 = e0; b0 < e1; b0 += T) {
    const int64_t b1 = bie_min(e1, b0 + T);
    for (int64_t e = b0; e < b1;) {
      const int64_t run = e / inner, idx = run % period;
      int64_t end;
      if (inner == 1) {
        end = bie_min(b1, e + (period - idx));      // shift[idx ..] along the elements
        const char* sh = (const char*)p->shift + idx * es;   // the shift of element e, then e + 1, ...
        for (int64_t i = e; i < end; ++i)
          bie_store_dt<DT>(buf, i - b0, bie_load_f32<DT>(x, i) + bie_load_f32<DT>(sh, i - e));
      } else {
        end = bie_min(b1, (run + 1) * inner);       // one shift value for the run
        const float s = bie_load_f32<DT>(p->shift, idx);
        for (int64_t i = e; i < end; ++i) bie_store_dt<DT>(buf, i - b0, bie_load_f32<DT>(x, i) + s);
      }
      e = end;
    }
    quant_span<DT>(p, (const char*)buf, b0, b1, lo, hi);
  }
}

template <int DT>
static void quant_range(const bie_quant_args* p, const char* x, int64_t e0, int64_t e1, float lo, float hi) {
  if (p->shift) quant_range_shifted<DT>(p, x, e0, e1, lo, hi);
  else quant_span<DT>(p, x + e0 * bie_esize(DT), e0, e1, lo, hi);
}

static int drv_quant(const void* args, int64_t t0, int64_t t1) {
  const bie_quant_args* p = (const bie_quant_args*)args;
  const int64_t e0 = t0 * BIE_QCHUNK, e1 = bie_min(p->n, t1 * BIE_QCHUNK);
  if (e0 >= e1) return BIE_OK;
  if ((p->svec && p->inner < 1) || (p->shift && (p->sh_inner < 1 || p->sh_period < 1))) return BIE_EBADARG;
  const float lo = (float)p->lo, hi = (float)p->hi;
  const char* x = (const char*)p->x;
  switch (p->dtype) {
    case BIE_F32: quant_range<BIE_F32>(p, x, e0, e1, lo, hi); return BIE_OK;
    case BIE_F16: quant_range<BIE_F16>(p, x, e0, e1, lo, hi); return BIE_OK;
    case BIE_BF16: quant_range<BIE_BF16>(p, x, e0, e1, lo, hi); return BIE_OK;
  }
  return BIE_EBADARG;
}
// ------------------------------------------------- sign_embedding (+ bag)
// Rows are expanded on the bit patterns of the two output values (+s, -s),
// so the inner loop is a select on integers (vectorised by the compiler).
template <typename T>
static inline void semb_expand(const uint8_t* row, int64_t D, T pos, T neg, T* o) {
  int64_t j = 0;
  for (; j + 8 <= D; j += 8) {
    const uint32_t byte = row[j >> 3];
    for (int q = 0; q < 8; ++q) {
      const T m = (T)(0u - ((byte >> q) & 1u));
      o[j + q] = (T)((pos & m) | (neg & (T)~m));
    }
  }
  for (; j < D; ++j) o[j] = ((row[j >> 3] >> (j & 7)) & 1u) ? pos : neg;
}

static inline void semb_values(float s, int out_type, uint32_t* pos, uint32_t* neg) {
  switch (out_type) {
    case BIE_F16: *pos = bie_f32_to_f16(s); *neg = bie_f32_to_f16(-s); break;
    case BIE_BF16: *pos = bie_f32_to_bf16(s); *neg = bie_f32_to_bf16(-s); break;
    default: *pos = bie_f32_bits(s); *neg = bie_f32_bits(-s); break;
  }
}

static inline int64_t semb_index(const bie_semb_args* p, int64_t e) {
  return p->idx64 ? ((const int64_t*)p->idx)[e] : (int64_t)((const int32_t*)p->idx)[e];
}

static int drv_semb(const void* args, int64_t t0, int64_t t1) {
  const bie_semb_args* p = (const bie_semb_args*)args;
  const int64_t D = p->D;
  const int osz = p->out_type == BIE_F32 ? 4 : 2;
  if (p->out_type != BIE_F32 && p->out_type != BIE_F16 && p->out_type != BIE_BF16) return BIE_EBADARG;
  if (p->scale) {                                   // sign_embedding
    for (int64_t l = t0; l < t1; ++l) {
      const int64_t i = semb_index(p, l);
      if (i < 0 || i >= p->V) return BIE_EINDEX;
      float s;
      switch (p->scale_dtype) {
        case BIE_F32: s = bie_load_f32<BIE_F32>(p->scale, i); break;
        case BIE_F16: s = bie_load_f32<BIE_F16>(p->scale, i); break;
        case BIE_BF16: s = bie_load_f32<BIE_BF16>(p->scale, i); break;
        default: return BIE_EBADARG;
      }
      uint32_t pos, neg;
      semb_values(s, (int)p->out_type, &pos, &neg);
      const uint8_t* row = p->bits + i * p->ldb;
      char* o = (char*)p->out + l * D * osz;
      if (osz == 4) semb_expand<uint32_t>(row, D, pos, neg, (uint32_t*)o);
      else semb_expand<uint16_t>(row, D, (uint16_t)pos, (uint16_t)neg, (uint16_t*)o);
    }
    return BIE_OK;
  }
  // sign_embedding_bag: counts of set bits per column, majority with ties to +1
  int32_t* cnt = (int32_t*)__builtin_malloc((size_t)(D + 16) * 4);
  if (!cnt) return BIE_ENOMEM;
  uint32_t pos, neg;
  semb_values(1.0f, (int)p->out_type, &pos, &neg);
  int rc = BIE_OK;
  for (int64_t b = t0; b < t1 && rc == BIE_OK; ++b) {
    for (int64_t j = 0; j < D; ++j) cnt[j] = 0;
    for (int64_t l = 0; l < p->per; ++l) {
      const int64_t i = semb_index(p, b * p->per + l);
      if (i < 0 || i >= p->V) { rc = BIE_EINDEX; break; }
      const uint8_t* row = p->bits + i * p->ldb;
      for (int64_t j = 0; j < D; ++j) cnt[j] += (row[j >> 3] >> (j & 7)) & 1;
    }
    char* o = (char*)p->out + b * D * osz;
    for (int64_t j = 0; j < D; ++j) {
      const uint32_t v = 2 * (int64_t)cnt[j] >= p->per ? pos : neg;
      if (osz == 4) ((uint32_t*)o)[j] = v; else ((uint16_t*)o)[j] = (uint16_t)v;
    }
  }
  __builtin_free(cnt);
  return rc;
}
#endif  // BIE_WITH_PACK

static inline int out_size(int64_t t) { return t == BIE_F16 || t == BIE_BF16 ? 2 : 4; }

#if BIE_WITH_BINARY || BIE_WITH_INT
// The task loop of the GEMM drivers on prepared weights (binary and int): task t is (row block
// t / ntn of mb rows, panel block t % ntn of pb panels), ntn = ceil(P / pb). The panel blocks of a
// row block are consecutive tasks, so a worker stages a row block once: stage(i0, i1) runs when
// the row block changes, then block(i0, i1, q0, q1) computes rows [i0, i1) x panels [q0, q1).
template <class Args, class Stage, class Block>
static inline void for_gemm_tasks(const Args* p, int64_t t0, int64_t t1, Stage stage, Block block) {
  const int64_t ntn = (p->P + p->pb - 1) / p->pb;
  int64_t have_ti = -1;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t ti = t / ntn, tj = t % ntn;
    const int64_t i0 = ti * p->mb, i1 = bie_min(p->M, i0 + p->mb);
    if (ti != have_ti) {
      stage(i0, i1);
      have_ti = ti;
    }
    block(i0, i1, tj * p->pb, bie_min(p->P, tj * p->pb + p->pb));
  }
}
#endif

#if BIE_WITH_BINARY
// ------------------------------------------------------------- binary GEMM
template <int NR>
static inline void btile_rows(int64_t mr, const uint64_t* A, int64_t lda, const uint64_t* B,
                              int64_t pstride, int64_t KW, int32_t* tile) {
  with_tile_rows<BMR>(mr, [&](auto r) { btile<decltype(r)::value, NR>(A, lda, B, pstride, KW, tile); });
}

// tile of mr rows x nr panels (nr <= BNR): full panel groups at once, the
// remainder one panel at a time
static inline void btile_any(int64_t mr, int64_t nr, const uint64_t* A, int64_t lda, const uint64_t* B,
                             int64_t pstride, int64_t KW, int32_t* tile) {
  if (nr == BNR) { btile_rows<BNR>(mr, A, lda, B, pstride, KW, tile); return; }
  alignas(64) int32_t t1[BMR * BNR * 8];
  for (int64_t q = 0; q < nr; ++q) {
    btile_rows<1>(mr, A, lda, B + q * pstride, pstride, KW, t1);
    for (int64_t r = 0; r < mr; ++r)
      for (int c = 0; c < 8; ++c) tile[r * BNR * 8 + q * 8 + c] = t1[r * BNR * 8 + c];
  }
}

static int drv_bgemm(const void* args, int64_t t0, int64_t t1) {
  const bie_bgemm_args* p = (const bie_bgemm_args*)args;
  const int64_t KW = p->KW, KB = p->KB;
  const uint8_t lastmask = (p->K % 8) ? (uint8_t)((1u << (p->K % 8)) - 1u) : (uint8_t)0xffu;
  uint64_t* As = (uint64_t*)__builtin_malloc((size_t)(p->mb * KW * 8) + 64);
  if (!As) return BIE_ENOMEM;
  alignas(64) int32_t tile[BMR * BNR * 8];
  alignas(64) int32_t dots[BNR * 8];
  const int osz = out_size(p->out_type);
  const int fl = (int)p->flags;
  const float ss = (fl & BIE_EPI_SCALE) ? p->scale[0] : 1.0f;
  auto stage = [&](int64_t i0, int64_t i1) {   // the rows as zero-padded words, pad bits cleared
    for (int64_t r = i0; r < i1; ++r) {
      uint8_t* d = (uint8_t*)(As + (r - i0) * KW);
      __builtin_memcpy(d, p->a + r * p->lda, (size_t)KB);
      d[KB - 1] &= lastmask;
      for (int64_t b = KB; b < KW * 8; ++b) d[b] = 0;
    }
  };
  for_gemm_tasks(p, t0, t1, stage, [&](int64_t i0, int64_t i1, int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; q += BNR) {
      const int64_t nr = bie_min(BNR, q1 - q);
      const int64_t j0 = q * 8, nc = bie_min(nr * 8, p->N - j0);
      for (int64_t i = i0; i < i1; i += BMR) {
        const int64_t mr = bie_min(BMR, i1 - i);
        btile_any(mr, nr, As + (i - i0) * KW, KW, p->bp + q * KW * 8, KW * 8, KW, tile);
        for (int64_t r = 0; r < mr; ++r) {
          for (int64_t c = 0; c < nc; ++c) dots[c] = (int32_t)(p->K - 2 * (int64_t)tile[r * BNR * 8 + c]);
          finish_row(dots, nc, (int)p->out_type, fl,
                     (fl & BIE_EPI_SCALE_VEC) ? p->scale + j0 : nullptr, ss,
                     (fl & BIE_EPI_BIAS) ? p->bias + j0 : nullptr, 0.0f,
                     (char*)p->out + ((i + r) * p->N + j0) * osz);
        }
      }
    }
  });
  __builtin_free(As);
  return BIE_OK;
}

// ------------------------------------------------------------- binary conv
// task t = (n, block of p->pix output pixels); A = weight rows of a group,
// B = im2col panels of 8 pixels built from the bit map.
static int drv_bconv(const void* args, int64_t t0, int64_t t1) {
  const bie_bconv_args* p = (const bie_bconv_args*)args;
  const int64_t HoWo = p->Ho * p->Wo, tpi = (HoWo + p->pix - 1) / p->pix;
  const int64_t CW = p->CW, GCW = p->G * CW, taps = p->KH * p->KWk, KWc = taps * CW;
  const int64_t maxpan = p->pix / 8;
  uint64_t* pan = (uint64_t*)__builtin_malloc((size_t)(maxpan * KWc * 8 * 8) + 64);
  if (!pan) return BIE_ENOMEM;
  alignas(64) int32_t tile[BMR * BNR * 8];
  alignas(64) int32_t dots[BNR * 8];
  const int osz = out_size(p->out_type);
  const int fl = (int)p->flags;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / tpi, blk = t % tpi;
    const int64_t p0 = blk * p->pix, p1 = bie_min(HoWo, p0 + p->pix), np = p1 - p0;
    const int64_t npan = (np + 7) / 8;
    for (int64_t g = 0; g < p->G; ++g) {
      // im2col into panels (lanes past the last pixel are zero)
      if (np % 8) {
        uint64_t* lastp = pan + (npan - 1) * KWc * 8;
        for (int64_t e = 0; e < KWc * 8; ++e) lastp[e] = 0;
      }
      for (int64_t pl = p0; pl < p1; ++pl) {
        const int64_t oh = pl / p->Wo, ow = pl % p->Wo;
        uint64_t* dst = pan + ((pl - p0) >> 3) * KWc * 8 + ((pl - p0) & 7);
        for (int64_t i = 0; i < p->KH; ++i) {
          const uint64_t* rowp = p->xs + ((n * p->Hp + oh * p->sh + i * p->dh) * p->Wp + ow * p->sw) * GCW + g * CW;
          for (int64_t j = 0; j < p->KWk; ++j) {
            const uint64_t* src = rowp + j * p->dw * GCW;
            uint64_t* d = dst + (i * p->KWk + j) * CW * 8;
            for (int64_t cw = 0; cw < CW; ++cw) d[cw * 8] = src[cw];
          }
        }
      }
      const int64_t o0 = g * p->Og, o1 = o0 + p->Og;
      for (int64_t q = 0; q < npan; q += BNR) {
        const int64_t nr = bie_min(BNR, npan - q);
        const int64_t j0 = q * 8, nc = bie_min(nr * 8, np - j0);
        for (int64_t o = o0; o < o1; o += BMR) {
          const int64_t mr = bie_min(BMR, o1 - o);
          btile_any(mr, nr, p->w + o * KWc, KWc, pan + q * KWc * 8, KWc * 8, KWc, tile);
          for (int64_t r = 0; r < mr; ++r) {
            const int64_t oo = o + r;
            for (int64_t c = 0; c < nc; ++c) dots[c] = (int32_t)(p->K - 2 * (int64_t)tile[r * BNR * 8 + c]);
            if (p->padmul) {          // padded taps: add (pad_value + 1) * sum of sgn(W) there
              const int32_t* T = p->taps + oo * taps;
              for (int64_t c = 0; c < nc; ++c) {
                const int64_t pl = p0 + j0 + c, oh = pl / p->Wo, ow = pl % p->Wo;
                const int64_t ih0 = oh * p->sh - p->ph, iw0 = ow * p->sw - p->pw;
                const int64_t ihl = ih0 + (p->KH - 1) * p->dh, iwl = iw0 + (p->KWk - 1) * p->dw;
                if (ih0 >= 0 && iw0 >= 0 && ihl < p->H && iwl < p->W) continue;
                int64_t corr = 0;
                for (int64_t i = 0; i < p->KH; ++i) {
                  const int64_t ih = ih0 + i * p->dh;
                  const bool row_out = ih < 0 || ih >= p->H;
                  for (int64_t j = 0; j < p->KWk; ++j) {
                    const int64_t iw = iw0 + j * p->dw;
                    if (row_out || iw < 0 || iw >= p->W) corr += T[i * p->KWk + j];
                  }
                }
                dots[c] += (int32_t)(p->padmul * corr);
              }
            }
            const float so = (fl & BIE_EPI_SCALE) ? p->scale[(fl & BIE_EPI_SCALE_VEC) ? oo : 0] : 1.0f;
            const float bo = (fl & BIE_EPI_BIAS) ? p->bias[oo] : 0.0f;
            if (!p->out_nhwc) {
              finish_row(dots, nc, (int)p->out_type, fl & (BIE_EPI_SCALE | BIE_EPI_BIAS), nullptr, so, nullptr, bo,
                         (char*)p->out + ((n * p->O + oo) * HoWo + p0 + j0) * osz);
            } else {   // a channels_last output: the channel's values land O elements apart
              alignas(64) char row[BNR * 8 * 4];
              finish_row(dots, nc, (int)p->out_type, fl & (BIE_EPI_SCALE | BIE_EPI_BIAS), nullptr, so, nullptr, bo,
                         row);
              char* dst = (char*)p->out + ((n * HoWo + p0 + j0) * p->O + oo) * osz;
              for (int64_t c = 0; c < nc; ++c) __builtin_memcpy(dst + c * p->O * osz, row + c * osz, (size_t)osz);
            }
          }
        }
      }
    }
  }
  __builtin_free(pan);
  return BIE_OK;
}
#endif  // BIE_WITH_BINARY

#ifndef BIE_WITH_ICONV
#define BIE_WITH_ICONV BIE_WITH_INT
#endif

#if BIE_WITH_INT || BIE_WITH_ICONV
// ------------------------------------------------------------- int tiles
template <int NR>
static inline void itile_rows(int64_t mr, const iscalar_t* A, int64_t lda, const void* B,
                              int64_t pstride, int64_t steps, int32_t* tile) {
  with_tile_rows<IMR>(mr, [&](auto r) { itile<decltype(r)::value, NR>(A, lda, B, pstride, steps, tile); });
}
#endif  // BIE_WITH_INT || BIE_WITH_ICONV

#if BIE_WITH_INT
// ------------------------------------------------------------- int GEMM
static int drv_igemm(const void* args, int64_t t0, int64_t t1) {
  const bie_igemm_args* p = (const bie_igemm_args*)args;
  const int64_t Kp = p->Kp, steps = Kp / IKSTEP;
  const int64_t pstride = steps * IPW * IKSTEP * IBSIZE;  // bytes per panel
  iscalar_t* As = (iscalar_t*)__builtin_malloc((size_t)(p->mb * Kp) * sizeof(iscalar_t) + 64);
  if (!As) return BIE_ENOMEM;
  alignas(64) int32_t tile[IMR * INR * IPW];
  alignas(64) int32_t dots[INR * IPW];
  alignas(64) float comb[INR * IPW];
  const int osz = out_size(p->out_type);
  const int fl = (int)p->flags;
  const float ss = (fl & BIE_EPI_SCALE) ? p->scale[0] : 1.0f;
  auto stage = [&](int64_t i0, int64_t i1) {
    for (int64_t r = i0; r < i1; ++r) iprep_row(p->a + r * p->lda, p->K, Kp, As + (r - i0) * Kp);
  };
  for_gemm_tasks(p, t0, t1, stage, [&](int64_t i0, int64_t i1, int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; q += INR) {
      const int64_t nr = bie_min(INR, q1 - q);
      const int64_t j0 = q * IPW, nc = bie_min(nr * IPW, p->N - j0);
      for (int64_t i = i0; i < i1; i += IMR) {
        const int64_t mr = bie_min(IMR, i1 - i);
        const iscalar_t* A = As + (i - i0) * Kp;
        const char* B = (const char*)p->bl + q * pstride;
        if (nr == INR) {
          itile_rows<INR>(mr, A, Kp, B, pstride, steps, tile);
        } else {
          alignas(64) int32_t t1b[IMR * INR * IPW];
          for (int64_t qq = 0; qq < nr; ++qq) {
            itile_rows<1>(mr, A, Kp, B + qq * pstride, pstride, steps, t1b);
            for (int64_t r = 0; r < mr; ++r)
              for (int c = 0; c < IPW; ++c) tile[r * INR * IPW + qq * IPW + c] = t1b[r * INR * IPW + c];
          }
        }
        for (int64_t r = 0; r < mr; ++r) {
          for (int64_t c = 0; c < nc; ++c) {
            int32_t v = tile[r * INR * IPW + c];
            if (IVNNI) v = (int32_t)((uint32_t)v - 128u * (uint32_t)p->colsum[j0 + c]);  // wraps exactly
            if (p->ccorr) v = (int32_t)((uint32_t)v + (uint32_t)p->cmul * (uint32_t)p->ccorr[j0 + c]);
            dots[c] = v;
          }
          const float* sv = (fl & BIE_EPI_SCALE_VEC) ? p->scale + j0 : nullptr;
          int rfl = fl;
          if (p->rscale) {          // the row's scale times the column's, one float32 rounding (the op's order)
            const float rs = p->rscale[(i + r) * p->rs_stride];
            for (int64_t c = 0; c < nc; ++c) comb[c] = rs * (sv ? sv[c] : ss);
            sv = comb;
            rfl |= BIE_EPI_SCALE | BIE_EPI_SCALE_VEC;
          }
          finish_row(dots, nc, (int)p->out_type, rfl, sv, ss,
                     (fl & BIE_EPI_BIAS) ? p->bias + j0 : nullptr, 0.0f,
                     (char*)p->out + ((i + r) * p->N + j0) * osz);
        }
      }
    }
  });
  __builtin_free(As);
  return BIE_OK;
}
// ------------------------------------------------------------- dynamic activation quantization
// task = one row. Vector extensions (compiled for this variant's ISA) for the min/max and abs-max
// reductions, the variant's quant_block for the per-token codes; the affine codes' loop is plain code the
// compiler vectorises (rint and fma are exact IEEE).
typedef float bie_v8f __attribute__((vector_size(32)));
typedef int32_t bie_v8i __attribute__((vector_size(32)));

// eight consecutive activations of a row as float32 (one 32-byte copy when they already are)
template <int DT>
static inline bie_v8f dquant_load8(const char* x, int64_t k) {
  bie_v8f v;
  if constexpr (DT == BIE_F32) {
    __builtin_memcpy(&v, x + 4 * k, 32);
  } else {
    for (int e = 0; e < 8; ++e) v[e] = bie_load_f32<DT>(x, k + e);
  }
  return v;
}

template <int DT>
static void dquant_rows(const bie_dquant_args* p, int64_t r0, int64_t r1) {
  const int es = bie_esize(DT);
  const int64_t K = p->K;
  for (int64_t r = r0; r < r1; ++r) {
    const char* x = (const char*)p->x + r * p->ldx * es;
    int8_t* o = p->out + r * K;
    if (p->mode == 2) {          // the row's min and max (NaN if it holds one) for the per-tensor range
      bie_v8f lo8, hi8;
      bie_v8i nan8 = {0, 0, 0, 0, 0, 0, 0, 0};
      float lo = __builtin_inff(), hi = -__builtin_inff();
      for (int e = 0; e < 8; ++e) lo8[e] = lo, hi8[e] = hi;
      int64_t k = 0;
      for (; k + 8 <= K; k += 8) {
        const bie_v8f v = dquant_load8<DT>(x, k);
        nan8 |= (v != v);
        lo8 = v < lo8 ? v : lo8;
        hi8 = v > hi8 ? v : hi8;
      }
      int bad = 0;
      for (int e = 0; e < 8; ++e) {
        lo = lo8[e] < lo ? lo8[e] : lo;
        hi = hi8[e] > hi ? hi8[e] : hi;
        bad |= nan8[e] != 0;
      }
      for (; k < K; ++k) {
        const float v = bie_load_f32<DT>(x, k);
        bad |= v != v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
      }
      p->rscale[2 * r] = bad ? __builtin_nanf("") : lo;
      p->rscale[2 * r + 1] = bad ? __builtin_nanf("") : hi;
      continue;
    }
    if (p->mode == 0) {
      const float inv = (float)p->inv, zp = (float)p->zp, qm = (float)p->qmax;
      for (int64_t k = 0; k < K; ++k) {
        float t = __builtin_rintf(__builtin_fmaf(bie_load_f32<DT>(x, k), inv, zp));
        t = t == t ? t : 0.0f;
        t = t < 0.0f ? 0.0f : t;
        t = t > qm ? qm : t;
        o[k] = (int8_t)((int32_t)t - 128);
      }
      continue;
    }
    bie_v8f m8 = {0, 0, 0, 0, 0, 0, 0, 0};
    bie_v8i nan8 = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      const bie_v8f v = dquant_load8<DT>(x, k);
      const bie_v8f a = v < 0 ? -v : v;
      nan8 |= (a != a);
      m8 = a > m8 ? a : m8;
    }
    float amax = 0.0f;
    int bad = 0;
    for (int e = 0; e < 8; ++e) {
      amax = m8[e] > amax ? m8[e] : amax;
      bad |= nan8[e] != 0;
    }
    for (; k < K; ++k) {
      const float a = __builtin_fabsf(bie_load_f32<DT>(x, k));
      bad |= a != a;
      amax = a > amax ? a : amax;
    }
    float s = bad ? __builtin_nanf("") : amax / 127.0f;
    if (s == 0.0f) s = 1.0f;
    p->rscale[r] = s;
    // the variant's quantize_int block: rint(x / s), NaN -> 0, clamped to [-127, 127]
    quant_block<DT>(x, K, s, -127.0f, 127.0f, o, nullptr);
  }
}

static int drv_dquant(const void* args, int64_t t0, int64_t t1) {
  const bie_dquant_args* p = (const bie_dquant_args*)args;
  switch (p->dtype) {
    case BIE_F32: dquant_rows<BIE_F32>(p, t0, t1); return BIE_OK;
    case BIE_F16: dquant_rows<BIE_F16>(p, t0, t1); return BIE_OK;
    case BIE_BF16: dquant_rows<BIE_BF16>(p, t0, t1); return BIE_OK;
  }
  return BIE_EBADARG;
}
#endif  // BIE_WITH_INT

#if BIE_WITH_ICONV
// ------------------------------------------------------------- int conv2d
// task t = (image n, block of p->pix output pixels). Per group: the block's
// im2col in B panels (IPW pixels each; k = (i*KW + j)*Cgp + c with Cg channels
// padded to Cgp, a multiple of IKSTEP; zeros for the padding, the pad channels
// and lanes past the last pixel), with VNNI the per-pixel column sums (a row of
// ones times the panels); then weight rows (A) x panels, epilogue per output
// channel, written straight into NCHW rows.
template <int S> struct ib_sel;
template <> struct ib_sel<1> { typedef int8_t t; };
template <> struct ib_sel<2> { typedef int16_t t; };
typedef typename ib_sel<IBSIZE>::t ib_t;

static int drv_iconv(const void* args, int64_t t0, int64_t t1) {
  const bie_iconv_args* p = (const bie_iconv_args*)args;
  const int64_t HoWo = p->Ho * p->Wo, tpi = (HoWo + p->pix - 1) / p->pix;
  const int64_t Kp = p->Kp, steps = Kp / IKSTEP, pel = Kp * IPW;   // elements per panel
  const int64_t pstride = pel * IBSIZE;                              // bytes per panel
  const int64_t maxpan = (p->pix + IPW - 1) / IPW;
  const int64_t W = p->W, sw = p->sw, Cg = p->Cg;
  const int64_t Cgp = (Cg + IKSTEP - 1) / IKSTEP * IKSTEP;          // channels per tap in K
  ib_t* pan = (ib_t*)__builtin_malloc((size_t)(maxpan * pstride) + 64);
  // output-row segments of a block: first lane, oh, first ow, length
  int64_t* seg = (int64_t*)__builtin_malloc((size_t)((p->pix + 2) * 4 * 8) + 64);
  iscalar_t* ones = (iscalar_t*)__builtin_malloc((size_t)Kp * sizeof(iscalar_t) + 64);
  // channels-last output: a block's sums for every channel of the group, (pixels, Og), finished pixel by pixel
  int32_t* obuf = p->out_nhwc ? (int32_t*)__builtin_malloc((size_t)(p->pix * p->Og) * sizeof(int32_t) + 64) : nullptr;
  if (!pan || !seg || !ones || (p->out_nhwc && !obuf)) {
    __builtin_free(pan); __builtin_free(seg); __builtin_free(ones); __builtin_free(obuf);
    return BIE_ENOMEM;
  }
  for (int64_t k = 0; k < Kp; ++k) ones[k] = 1;   // VNNI: 1 x panels = the per-pixel column sums
  alignas(64) int32_t tile[IMR * INR * IPW];
  alignas(64) int32_t t1b[IMR * INR * IPW];
  alignas(64) int32_t dots[INR * IPW];
  alignas(64) int32_t csum[INR * IPW];
  const int osz = out_size(p->out_type);
  const int fl = (int)p->flags;
  const iscalar_t* Wt = (const iscalar_t*)p->wl;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / tpi, blk = t % tpi;
    const int64_t p0 = blk * p->pix, p1 = bie_min(HoWo, p0 + p->pix), np = p1 - p0;
    const int64_t npan = (np + IPW - 1) / IPW;
    int64_t nseg = 0;
    for (int64_t l = 0; l < np; ++nseg) {
      const int64_t oh = (p0 + l) / p->Wo, ow = (p0 + l) % p->Wo, len = bie_min(np - l, p->Wo - ow);
      seg[4 * nseg] = l; seg[4 * nseg + 1] = oh * p->sh - p->ph; seg[4 * nseg + 2] = ow * sw - p->pw;
      seg[4 * nseg + 3] = len;
      l += len;
    }
    const int8_t* xn = p->x + n * p->sN;
    for (int64_t g = 0; g < p->G; ++g) {
      for (int64_t e = 0; e < npan * pel; ++e) pan[e] = 0;
      // implicit im2col from channels-last x: for each tap (i, j) and
      // output-row segment, the lanes whose input pixel is inside the image
      // (computed, not tested per element) get the group's Cg channels, IKSTEP
      // consecutive channels per store; everything else stays zero (padding)
      const int8_t* xg = xn + g * p->Cg;
      for (int64_t i = 0; i < p->KH; ++i) {
        for (int64_t j = 0; j < p->KWk; ++j) {
          ib_t* tb = pan + (i * p->KWk + j) * (Cgp / IKSTEP) * IPW * IKSTEP;
          const int64_t di = i * p->dh, dj = j * p->dw;
          for (int64_t sgi = 0; sgi < nseg; ++sgi) {
            const int64_t ih = seg[4 * sgi + 1] + di;
            if ((uint64_t)ih >= (uint64_t)p->H) continue;
            const int64_t l0 = seg[4 * sgi], len = seg[4 * sgi + 3], iwb = seg[4 * sgi + 2] + dj;
            // lanes u in [u0, u1) have 0 <= iwb + u*sw < W
            const int64_t u0 = iwb >= 0 ? 0 : (-iwb + sw - 1) / sw;
            const int64_t u1 = iwb > W - 1 ? 0 : bie_min(len, (W - 1 - iwb) / sw + 1);
            const int8_t* src = xg + ih * p->sH + (iwb + u0 * sw) * p->sW;
            const int64_t step = sw * p->sW;
            for (int64_t u = u0; u < u1; ++u, src += step) {
              const int64_t lane = l0 + u;
              ib_t* d = tb + (lane / IPW) * pel + (lane % IPW) * IKSTEP;
              int64_t c = 0;
              for (; c + IKSTEP <= Cg; c += IKSTEP, d += IPW * IKSTEP) {
                if constexpr (IBSIZE == 1) {
                  __builtin_memcpy(d, src + c, IKSTEP);
                } else {
                  for (int e = 0; e < IKSTEP; ++e) d[e] = (ib_t)src[c + e];
                }
              }
              for (int e = 0; c < Cg; ++c, ++e) d[e] = (ib_t)src[c];
            }
          }
        }
      }
      const int64_t o0 = g * p->Og, o1 = o0 + p->Og;
      for (int64_t q = 0; q < npan; q += INR) {
        const int64_t nr = bie_min(INR, npan - q);
        const int64_t j0 = q * IPW, nc = bie_min(nr * IPW, np - j0);
        const char* B = (const char*)pan + q * pstride;
        if (IVNNI) {
          for (int64_t qq = 0; qq < nr; ++qq) {
            itile_rows<1>(1, ones, Kp, B + qq * pstride, pstride, steps, t1b);
            for (int c = 0; c < IPW; ++c) csum[qq * IPW + c] = t1b[c];
          }
        }
        for (int64_t o = o0; o < o1; o += IMR) {
          const int64_t mr = bie_min(IMR, o1 - o);
          const iscalar_t* A = Wt + o * Kp;
          if (nr == INR) {
            itile_rows<INR>(mr, A, Kp, B, pstride, steps, tile);
          } else {
            for (int64_t qq = 0; qq < nr; ++qq) {
              itile_rows<1>(mr, A, Kp, B + qq * pstride, pstride, steps, t1b);
              for (int64_t r = 0; r < mr; ++r)
                for (int c = 0; c < IPW; ++c) tile[r * INR * IPW + qq * IPW + c] = t1b[r * INR * IPW + c];
            }
          }
          if (p->out_nhwc) {   // the sums into the block's (pixels, Og) buffer, finished below
            for (int64_t r = 0; r < mr; ++r)
              for (int64_t c = 0; c < nc; ++c) {
                int32_t v = tile[r * INR * IPW + c];
                if (IVNNI) v = (int32_t)((uint32_t)v - 128u * (uint32_t)csum[c]);  // wraps exactly
                obuf[(j0 + c) * p->Og + (o - o0) + r] = v;
              }
            continue;
          }
          for (int64_t r = 0; r < mr; ++r) {
            const int64_t oo = o + r;
            for (int64_t c = 0; c < nc; ++c) {
              int32_t v = tile[r * INR * IPW + c];
              if (IVNNI) v = (int32_t)((uint32_t)v - 128u * (uint32_t)csum[c]);  // wraps exactly
              dots[c] = v;
            }
            const float so = (fl & BIE_EPI_SCALE) ? p->scale[(fl & BIE_EPI_SCALE_VEC) ? oo : 0] : 1.0f;
            const float bo = (fl & BIE_EPI_BIAS) ? p->bias[oo] : 0.0f;
            finish_row(dots, nc, (int)p->out_type, fl & (BIE_EPI_SCALE | BIE_EPI_BIAS), nullptr, so, nullptr, bo,
                       (char*)p->out + ((n * p->O + oo) * HoWo + p0 + j0) * osz);
          }
        }
      }
      if (p->out_nhwc) {
        // channels last: each pixel's Og channels of the group are one contiguous run of the output
        const float* sv = (fl & BIE_EPI_SCALE_VEC) ? p->scale + o0 : nullptr;
        const float ss = ((fl & BIE_EPI_SCALE) && !sv) ? p->scale[0] : 1.0f;
        const float* bv = (fl & BIE_EPI_BIAS) ? p->bias + o0 : nullptr;
        for (int64_t l = 0; l < np; ++l)
          finish_row(obuf + l * p->Og, p->Og, (int)p->out_type, fl & (BIE_EPI_SCALE | BIE_EPI_BIAS), sv, ss, bv,
                     0.0f, (char*)p->out + ((n * HoWo + p0 + l) * p->O + o0) * osz);
      }
    }
  }
  __builtin_free(pan);
  __builtin_free(seg);
  __builtin_free(ones);
  __builtin_free(obuf);
  return BIE_OK;
}
#endif  // BIE_WITH_ICONV

// ------------------------------------------------------------------ lsq_backward
#if BIE_WITH_PACK   // (the variants with the element-wise quantization drivers)
// Element-wise exactly as the op's definition (bie_core/ops/integer.py, lsq_backward_math): v + shift rounded to v's
// dtype, float32 division, round half to even; the sums in double, as the definition accumulates them (lsq_sums),
// per task here and added in task order by bie_lsq (the order of the additions is the only difference).
template <int VT, int PT>
static int lsq_tasks(const bie_lsq_args* p, int64_t t0, int64_t t1) {
  const int64_t C = p->C, rpt = p->rows_per_task;
  const float lo = (float)p->lo, hi = (float)p->hi, f = (float)p->factor;
  const int ves = bie_esize(VT), pes = bie_esize(PT), ces = bie_esize((int)p->codes_dtype);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t r0 = t * rpt, r1 = bie_min(p->R, r0 + rpt);
    double* psh = p->part_shift ? p->part_shift + t * C : nullptr;
    if (psh)
      for (int64_t c = 0; c < C; ++c) psh[c] = 0.0;
    double task_sum = 0.0;
    for (int64_t r = r0; r < r1; ++r) {
      const float s = p->rowwise ? p->scale[r] : p->scale[0];
      const char* v = (const char*)p->v + r * C * ves;
      const char* g_row = (const char*)p->prod + r * C * pes;
      unsigned char* gv = (unsigned char*)p->grad_v + r * C * ves;
      unsigned char* cd = p->codes ? (unsigned char*)p->codes + r * C * ces : nullptr;
      double row_sum = 0.0;
      for (int64_t c = 0; c < C; ++c) {
        float x = bie_load_f32<VT>(v, c);
        if (p->shift) {   // the sum rounded to v's dtype, as the definition adds in it
          unsigned char sum[4];
          bie_store_dt<VT>(sum, 0, x + bie_load_f32<VT>(p->shift, c));
          x = bie_load_f32<VT>(sum, 0);
        }
        const float q = x / s;
        const bool inside = q >= lo && q <= hi;
        float code = __builtin_nearbyintf(q);
        if (code != code) code = 0.0f;
        code = code < lo ? lo : (code > hi ? hi : code);
        float g = bie_load_f32<PT>(g_row, c);
        if (p->has_factor) g = g * f;
        bie_store_dt<VT>(gv, c, inside ? g : 0.0f);
        row_sum += (double)(g * (code - (inside ? q : 0.0f)));
        if (psh) psh[c] += (double)bie_load_f32<VT>(gv, c);
        if (cd) {
          switch (p->codes_dtype) {
            case BIE_F32: bie_store_dt<BIE_F32>(cd, c, code); break;
            case BIE_F16: bie_store_dt<BIE_F16>(cd, c, code); break;
            default: bie_store_dt<BIE_BF16>(cd, c, code); break;
          }
        }
      }
      if (p->rowwise) p->part_scale[r] = row_sum;
      else task_sum += row_sum;
    }
    if (!p->rowwise) p->part_scale[t] = task_sum;
  }
  return BIE_OK;
}

template <int VT>
static int lsq_for_prod(const bie_lsq_args* p, int64_t t0, int64_t t1) {
  switch (p->prod_dtype) {
    case BIE_F32: return lsq_tasks<VT, BIE_F32>(p, t0, t1);
    case BIE_F16: return lsq_tasks<VT, BIE_F16>(p, t0, t1);
    case BIE_BF16: return lsq_tasks<VT, BIE_BF16>(p, t0, t1);
  }
  return BIE_EBADARG;
}

static int drv_lsq(const void* args, int64_t t0, int64_t t1) {
  const bie_lsq_args* p = (const bie_lsq_args*)args;
  if (p->codes && p->codes_dtype != BIE_F32 && p->codes_dtype != BIE_F16 && p->codes_dtype != BIE_BF16)
    return BIE_EBADARG;
  switch (p->v_dtype) {
    case BIE_F32: return lsq_for_prod<BIE_F32>(p, t0, t1);
    case BIE_F16: return lsq_for_prod<BIE_F16>(p, t0, t1);
    case BIE_BF16: return lsq_for_prod<BIE_BF16>(p, t0, t1);
  }
  return BIE_EBADARG;
}
#endif  // BIE_WITH_PACK (lsq_backward)
