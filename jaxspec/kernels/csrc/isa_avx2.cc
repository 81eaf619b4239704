// The kernels for x86-64 with AVX2, FMA and F16C (16 vector registers of 8 floats). The whole
// file is compiled for that target; ffi.cc calls it only where the CPU has it.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#pragma GCC target("avx2,fma,f16c")
#define JS_ISA 2

namespace jaxspec {
namespace isa_avx2 {

#include "simd.h"

constexpr int kNnRows = 4, kNnVecs = 2;  // 8 accumulators + 4 broadcasts + 1 of 16
constexpr int kSweepRows = 2;  // 8 broadcasts + 4 rows of W + 1
constexpr int kNtRows = 1;     // 8 accumulators + 1 row vector of W
// R * C accumulators + R broadcasts + 1 unpacked vector <= 16.
constexpr int kInt4Cols[7] = {0, 8, 4, 2, 2, 1, 1};

#include "body_attention.inc"
#include "body_float.inc"
#include "body_int4.inc"

const KernelTable kTable = {kAvx2, &FloatNN, &FloatNT, &Int4Tiles, &AttentionQuery, &StreamSum};

}  // namespace isa_avx2
}  // namespace jaxspec
#endif
