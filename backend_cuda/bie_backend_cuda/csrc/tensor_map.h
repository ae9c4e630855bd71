// Host side of the TMA engine's tiled copies: cuTensorMapEncodeTiled, fetched through the runtime's driver entry
// point so the extension does not link against libcuda. Shared by the wgmma kernels that load boxes of a
// row-major matrix (binary_wgmma.cu: the 1-bit activations; wq_wgmma.cu: the rows of x).
#pragma once
#include <cuda.h>   // CUtensorMap and its enums
#include <cuda_runtime.h>

namespace bie {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// nullptr where the driver does not provide it (the launchers then report cudaErrorNotSupported)
inline EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess)
      return (EncodeTiledFn) nullptr;
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

// A row-major matrix of `rows` rows of `row_bytes` bytes, `stride` bytes apart, read in boxes of box_rows rows x
// box_bytes bytes (at most 128 with the 128-byte swizzle) of 1-byte or 2-byte elements, in the 128-byte swizzle;
// rows and bytes past the matrix read as zeros.
inline cudaError_t make_tmap_rows_sw128(CUtensorMap* map, const void* base, int elem_bytes, uint64_t row_bytes,
                                        uint64_t rows, uint64_t stride, uint32_t box_bytes, uint32_t box_rows) {
  const EncodeTiledFn enc = encode_tiled();
  if (!enc) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {(cuuint64_t)(row_bytes / elem_bytes), (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)stride};
  const cuuint32_t box[2] = {(cuuint32_t)(box_bytes / elem_bytes), box_rows};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = enc(map, elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 2,
                         const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                         CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace bie
