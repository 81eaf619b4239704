// What every jaxspec CPU kernel shares: the problems they solve, the instruction sets they are
// built for, the table one instruction set fills, and the bits of arithmetic that must be the
// same in every build (conversions, the 8-lane tree).
//
// The kernels are written once (body_*.inc) over a few vector operations (simd.h) and built
// once per instruction set: isa_scalar.cc, isa_avx2.cc and isa_avx512.cc each set their target
// with `#pragma GCC target` and include the bodies inside their own namespace, so a function
// compiled for AVX-512 is never merged with (or called in place of) its scalar twin. ffi.cc
// holds the XLA FFI handlers: argument checks, the thread split, and the choice of table.
//
// Exactness: every output is one fixed sequence of fused multiply-adds, the same in every
// table (a vector lane does what the scalar twin does with std::fma), so the three builds give
// the same bits. The library is compiled with -ffp-contract=off: the compiler never fuses a
// plain a * b + c on its own.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace jaxspec {

enum Isa : int { kScalar = 0, kAvx2 = 2, kAvx512 = 3 };

// Scale and weight dtypes a kernel reads (the FFI's own codes are mapped to these in ffi.cc).
enum class Dt : int { kF32 = 0, kBf16 = 1, kF16 = 2 };

// Output columns per tile of the prepared int4 layout ([T, K, 32] bytes, see int4.py).
constexpr int kTile = 64;
constexpr int kTileBytes = 32;

inline float Bf16ToF32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float F16ToF32(uint16_t h) {  // exact, as F16C's vcvtph2ps
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0 && man == 0) {
    bits = sign;
  } else if (exp == 0) {  // subnormal: normalize
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400) == 0);
    bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The fixed tree over eight lanes used by every 8-lane dot: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
inline float HsumLanes(const float* l) {
  const float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  return (a0 + a2) + (a1 + a3);
}

// ---------------------------------------------------------------------------- the problems

// out[n, m] = sum_k x[n, k] * W[k, m] (NN: W [K, M], a Dense kernel) or W[m, k] (NT: W [M, K],
// a tied table). NN sums each output over kParts fixed parts of k (Part below): within a part
// one fma chain over its k in order from 0, then the parts' sums added left to right. NT sums
// 64 k-lanes (lane l: k = l, l+64, ... below K64 = K - K % 64), folds them by halving, then
// adds the tail k >= K64 in order (body_float.inc). Both orders depend on K alone: never on N, the batch mates or the threads.
constexpr int kParts = 2;
inline int64_t Part(int64_t K, int part) { return K * part / kParts; }  // first k of a part

struct FloatMM {
  const float* x;  // [N, K]
  const void* w;   // f32 or bf16
  bool bf16;
  float* out;      // [N, M]
  int64_t N, K, M;
};

// out[n, m] = sum_k x[n, k] * W[k, m], W[k, m] = scale[g, m] * (u - shift) + offset[g, m] with
// u = q + 8 the stored nibble and g = k / group. Per (row, group, column): acc = fma chain of
// x[k] * u over the group; then out = fma(scale, acc - xs * shift, out); out = fma(offset,
// xs, out), xs the row's sum of x over the group (xsum). The same for one row or many.
struct Int4MM {
  const float* x;      // [N, K]
  const uint8_t* w;    // [T, K, 32]
  const void* scale;   // [G, M]
  const void* offset;  // [G, M] or null
  Dt scale_type, offset_type;
  float* out;          // [N, M]
  int64_t N, K, M, G, group, T;
  float shift;         // 8: W = scale * q + offset; 0: W = scale * u + minimum
  const float* xsum;   // [N, G]
};

// out[n, m] = sum_g scale[g, m] * (sum_{k in group g} x[n, k] * q[k, m]), q int8 [K, M] (a
// symmetric grid, as GGUF's Q8_0). Per (row, column): over the groups of each part (the
// parts split k at group boundaries, Part8), acc = fma chain of x[k] * q[k, m] over the
// group, then y = fma(scale, acc, y); the parts' y added left to right. The same for one row
// or many, on every ISA.
struct Int8MM {
  const float* x;     // [N, K]
  const int8_t* q;    // [K, M]
  const void* scale;  // [G, M]
  Dt scale_type;
  float* out;         // [N, M]
  int64_t N, K, M, G, group;
};
inline int64_t Part8(const Int8MM& p, int part) {  // first k of a part: a group boundary
  const int64_t k = p.G * part / kParts * p.group;
  return k < p.K ? k : p.K;
}

// Grouped-query attention over a cache: query (b, t) sees cache indices s <= pos[b, t], s < S.
// Batch row b reads cache row row0 + (rows ? rows[b] : b) of k, v [rows, Sc, H, D] (a plain
// [B, S, H, D] input is rows = null, row0 = 0, Sc = S; the model's whole stacked cache
// [L, N, Smax, H, D] is row0 = layer * N, rows = the batch's slots, Sc = Smax). k and v are
// float32 or (kv_bf16) bfloat16, read as float32 (exactly) where they lie.
struct Attn {
  const float* q;          // [B, T, H, G, D]
  const void *k, *v;       // see above
  bool kv_bf16;
  const int32_t* pos;      // [B, T]
  const int32_t* rows;     // [B] or null
  float* out;              // [B, T, H, G, D]
  int64_t B, T, H, G, D, S, Sc, row0;
  float scale;
  int64_t window = 0;  // > 0: a query at pos sees only pos - window + 1 .. pos (sliding window)
  int64_t KeyAt(int64_t b, int64_t s, int64_t h) const {  // index of (b, s, h, 0) in k and v
    const int64_t row = row0 + (rows != nullptr ? rows[b] : b);
    return ((row * Sc + s) * H + h) * D;
  }
};

// What one instruction set provides. Ranges are half-open; scratch is per calling thread.
struct KernelTable {
  Isa isa;
  // NN, all rows, contraction part `part`, output columns [c0, c1) (c0 a multiple of 16), the
  // part's partial sums into y [N, M].
  void (*float_nn)(const FloatMM& p, int part, int64_t c0, int64_t c1, float* y);
  // NT, all rows, table rows [m0, m1).
  void (*float_nt)(const FloatMM& p, int64_t m0, int64_t m1);
  // int4, all rows, tiles [t0, t1); scratch holds N * kTile + 2 * (t1 - t0) * G * kTile floats.
  void (*int4)(const Int4MM& p, int64_t t0, int64_t t1, float* scratch);
  // one (b, t, kv head); scratch holds S floats.
  void (*attention)(const Attn& a, int64_t b, int64_t t, int64_t h, float* scratch);
  // int8, all rows, contraction part `part`, columns [c0, c1) (c0 a multiple of 16), into y
  // [N, M]; scratch holds N * (c1 - c0) floats.
  void (*int8)(const Int8MM& p, int part, int64_t c0, int64_t c1, float* y, float* scratch);
  // the bandwidth probe: the sum of n floats read front to back (n a multiple of 64).
  float (*stream_sum)(const float* x, int64_t n);
};

namespace isa_scalar {
extern const KernelTable kTable;
}
namespace isa_avx2 {
extern const KernelTable kTable;
}
namespace isa_avx512 {
extern const KernelTable kTable;
}

}  // namespace jaxspec
