// The kernels for x86-64 with AVX-512 (F, DQ, BW, VL), FMA and F16C (32 vector registers of 16
// floats). The whole file is compiled for that target; ffi.cc calls it only where the CPU
// has it.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")
// GCC 12 warns that _mm512_undefined_* values are uninitialized (they are meant to be)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define JS_ISA 3

namespace jaxspec {
namespace isa_avx512 {

#include "simd.h"

constexpr int kNnRows = 6, kNnVecs = 4;  // 24 accumulators + 6 broadcasts + 1 of 32
constexpr int kSweepRows = 6;       // 24 broadcasts + 4 rows of W + 1
constexpr int kNtRows = 6;          // 24 accumulators + 1 row vector of W
// R * C accumulators + R broadcasts + 1 unpacked vector <= 32 (a tile is 4 vectors).
constexpr int kInt4Cols[7] = {0, 4, 4, 4, 4, 4, 4};

#include "body_attention.inc"
#include "body_float.inc"
#include "body_int4.inc"

const KernelTable kTable = {kAvx512, &FloatNN, &FloatNT, &Int4Tiles, &AttentionQuery, &StreamSum};

}  // namespace isa_avx512
}  // namespace jaxspec
#endif
