// int4 x float32 matmul for XLA:CPU, as an XLA FFI custom call (jaxspec/int4kernel.py).
//
//   out[n, m] = sum_k x[n, k] * W[k, m],
//   W[k, m]   = scale[k / group, m] * q[k, m] + offset[k / group, m]   (offset optional), or
//   W[k, m]   = scale[k / group, m] * (q[k, m] + 8) + minimum[k / group, m]   (has_offset = 2:
//               the asymmetric grids as stored, so no float32 offset is built per call)
//
// q is int4 in [-8, 7], stored by jaxspec.int4kernel.prepare in a tiled layout:
//   w[t][k][32 bytes], t = tile of 64 output columns (M padded to a multiple of 64).
//   The 32 bytes of (t, k) are 8 little-endian uint32 words; word j holds, in its nibble i
//   (bits 4i..4i+3), u = q + 8 (0..15) of column 64 t + 8 i + j.
// So one 256-bit load of a row gives all 64 columns; nibble i of the 8 words is
// (v >> 4i) & 15: columns 8i..8i+7 of the tile, contiguous, with no shuffle. A tile is
// K * 32 contiguous bytes, read front to back (a row-major [K, M] matrix has a row stride of
// M/2 bytes, 24 KB for a 49152-wide head, which defeats the prefetcher).
//
// One row (drafting): per group of rows the kernel sums x[k] * u straight from the nibbles
// into float32 registers and then adds
//   scale * (acc - 8 * xsum) + offset * xsum,   xsum = sum of x[k] over the group,
// (scale * acc + minimum * xsum with a minimum; float16 scales are widened with F16C)
// to the output: no float weight is written anywhere. Two rows or more (verify blocks): each
// chunk of 32 rows of a tile is dequantized once (scale * u + offset - 8 * scale) into a 8 KB
// buffer that stays in L1, and a register-blocked float kernel runs over it for every block of
// up to 6 rows. Output tiles are split over the thread pool XLA hands the handler (the calling
// thread works too).
//
// Two code paths, chosen at run time: AVX2+FMA (function target attributes, so the library is
// built with generic flags and loads on any x86-64), and a portable scalar one.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define JAXSPEC_X86 1
#else
#define JAXSPEC_X86 0
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kTile = 64;       // output columns per tile
constexpr int kRowBytes = 32;   // bytes per (tile, k)

enum Isa : int { kScalar = 0, kAvx2 = 2 };

int DetectIsa() {
#if JAXSPEC_X86 && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return kAvx2;
  }
#endif
  return kScalar;
}

std::atomic<int> g_isa{DetectIsa()};
std::atomic<int> g_max_threads{0};  // 0: as many as XLA's pool has

// ------------------------------------------------------------------ scale conversion

float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

#if JAXSPEC_X86 && (defined(__GNUC__) || defined(__clang__))
bool HasF16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
}
const bool g_f16c = HasF16c();

// Converts the first multiple-of-8 values with the F16C instruction (exact, as F16ToF32);
// returns how many it converted.
__attribute__((target("f16c,avx"))) int F16RowF16c(const uint16_t* p, int count, float* dst) {
  int c = 0;
  for (; c + 8 <= count; c += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + c));
    _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(h));
  }
  return c;
}
#endif

// Reads `count` values of a [G, M] scale/offset row (dtype BF16, F16 or F32) as float32,
// zero-filling up to kTile.
void LoadRow(const void* base, ffi::DataType dtype, int64_t index, int count, float* dst) {
  switch (dtype) {
    case ffi::DataType::F32:
      std::memcpy(dst, static_cast<const float*>(base) + index, count * sizeof(float));
      break;
    case ffi::DataType::BF16: {
      const uint16_t* p = static_cast<const uint16_t*>(base) + index;
      for (int c = 0; c < count; ++c) dst[c] = Bf16ToF32(p[c]);
      break;
    }
    default: {  // F16 (checked by the handler)
      const uint16_t* p = static_cast<const uint16_t*>(base) + index;
      int c = 0;
#if JAXSPEC_X86 && (defined(__GNUC__) || defined(__clang__))
      if (g_f16c) c = F16RowF16c(p, count, dst);
#endif
      for (; c < count; ++c) dst[c] = F16ToF32(p[c]);
      break;
    }
  }
  for (int c = count; c < kTile; ++c) dst[c] = 0.0f;
}

// ------------------------------------------------------------------ the problem

struct Problem {
  const float* x;      // [N, K]
  const uint8_t* w;    // [T, K, 32]
  const void* scale;   // [G, M]
  const void* offset;  // [G, M] or null
  ffi::DataType scale_type, offset_type;
  float* out;          // [N, M]
  int64_t N, K, M, G, group, T;
  float shift;         // 8 (W = scale * q + offset, q = u - 8); 0 (W = scale * u + minimum)
  std::vector<float> xsum;  // [N, G]: sum of x over each group
};

// ------------------------------------------------------------------ scalar path

// Adds rows [n0, n0 + rows) x the 64 columns of one tile, over k in [k0, k1), into out_tile.
void GroupScalar(const Problem& p, const uint8_t* wt, int64_t k0, int64_t k1, int64_t g,
                 const float* sc, const float* of, float* out_tile) {
  for (int64_t n = 0; n < p.N; ++n) {
    float acc[kTile] = {0};
    const float* xr = p.x + n * p.K;
    for (int64_t k = k0; k < k1; ++k) {
      const float xv = xr[k];
      const uint8_t* row = wt + k * kRowBytes;
      for (int j = 0; j < 8; ++j) {
        uint32_t word;
        std::memcpy(&word, row + 4 * j, 4);
        for (int i = 0; i < 8; ++i) {
          acc[8 * i + j] += xv * static_cast<float>((word >> (4 * i)) & 15u);
        }
      }
    }
    const float xs = p.xsum[n * p.G + g];
    float* o = out_tile + n * kTile;
    for (int c = 0; c < kTile; ++c) o[c] += sc[c] * (acc[c] - p.shift * xs) + of[c] * xs;
  }
}

// ------------------------------------------------------------------ AVX2 path

#if JAXSPEC_X86 && (defined(__GNUC__) || defined(__clang__))
#define JAXSPEC_AVX2 __attribute__((target("avx2,fma")))

// Rows [n0, n0 + R) x column vectors [c0, c0 + C) (8 columns each) of one tile, k in [k0, k1).
template <int R, int C>
JAXSPEC_AVX2 void BlockAvx2(const Problem& p, const uint8_t* wt, int64_t k0, int64_t k1,
                            int64_t g, int64_t n0, int c0, const float* sc, const float* of,
                            float* out_tile) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi32(15);
  const __m128i pre = _mm_cvtsi32_si128(4 * c0);
  const float* xr = p.x + n0 * p.K;
  for (int64_t k = k0; k < k1; ++k) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + k * kRowBytes));
    if (C != 8) v = _mm256_srl_epi32(v, pre);
    __m256 xb[R];
    for (int r = 0; r < R; ++r) xb[r] = _mm256_broadcast_ss(xr + r * p.K + k);
    for (int c = 0; c < C; ++c) {
      __m256i u = c == 0 ? v : _mm256_srli_epi32(v, 4 * c);
      __m256 wf = _mm256_cvtepi32_ps(_mm256_and_si256(u, mask));
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xb[r], wf, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m256 xs = _mm256_set1_ps(p.xsum[(n0 + r) * p.G + g]);
    const __m256 xs8 = _mm256_mul_ps(xs, _mm256_set1_ps(p.shift));
    float* o = out_tile + (n0 + r) * kTile;
    for (int c = 0; c < C; ++c) {
      const int col = 8 * (c0 + c);
      __m256 s = _mm256_loadu_ps(sc + col);
      __m256 f = _mm256_loadu_ps(of + col);
      __m256 y = _mm256_loadu_ps(o + col);
      y = _mm256_fmadd_ps(s, _mm256_sub_ps(acc[r][c], xs8), y);
      y = _mm256_fmadd_ps(f, xs, y);
      _mm256_storeu_ps(o + col, y);
    }
  }
}

// Register budget (16 ymm): R * C accumulators + R broadcasts + 2 temporaries.
template <int R, int C>
JAXSPEC_AVX2 void RowsAvx2(const Problem& p, const uint8_t* wt, int64_t k0, int64_t k1, int64_t g,
                           int64_t n0, const float* sc, const float* of, float* out_tile) {
  for (int c0 = 0; c0 < 8; c0 += C) BlockAvx2<R, C>(p, wt, k0, k1, g, n0, c0, sc, of, out_tile);
}

// Rows n0.. of x (R of them) x column vectors [c0, c0 + C) of a float weight chunk `buf`
// ([kc][64], already scaled), accumulated into out_tile.
template <int R, int C>
JAXSPEC_AVX2 void MicroAvx2(const float* buf, int64_t kc, const float* xr, int64_t ldx, int c0,
                            float* o) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_loadu_ps(o + r * kTile + 8 * (c0 + c));
  for (int64_t k = 0; k < kc; ++k) {
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm256_load_ps(buf + k * kTile + 8 * (c0 + c));
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_broadcast_ss(xr + r * ldx + k);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xb, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(o + r * kTile + 8 * (c0 + c), acc[r][c]);
}

template <int R, int C>
JAXSPEC_AVX2 void MicroRowsAvx2(const float* buf, int64_t kc, const float* xr, int64_t ldx,
                                float* o) {
  for (int c0 = 0; c0 < 8; c0 += C) MicroAvx2<R, C>(buf, kc, xr, ldx, c0, o);
}

// Many rows: dequantize (with scale and offset) chunks of up to kChunk rows of the tile into
// an L1 buffer once, then run a float register-blocked kernel over it for every row block.
constexpr int64_t kChunk = 32;

JAXSPEC_AVX2 void GroupBufferedAvx2(const Problem& p, const uint8_t* wt, int64_t k0, int64_t k1,
                                    const float* sc, const float* of, float* out_tile) {
  alignas(32) float buf[kChunk * kTile];
  alignas(32) float bias[kTile];  // offset - 8 * scale (u = q + 8), or the minimum
  for (int c = 0; c < kTile; ++c) bias[c] = of[c] - p.shift * sc[c];
  __m256 s[8];
  for (int i = 0; i < 8; ++i) s[i] = _mm256_load_ps(sc + 8 * i);
  const __m256i mask = _mm256_set1_epi32(15);
  for (int64_t kb = k0; kb < k1; kb += kChunk) {
    const int64_t kc = k1 - kb < kChunk ? k1 - kb : kChunk;
    for (int64_t k = 0; k < kc; ++k) {
      const __m256i v =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + (kb + k) * kRowBytes));
      for (int i = 0; i < 8; ++i) {
        const __m256i u = i == 0 ? v : _mm256_srli_epi32(v, 4 * i);
        const __m256 wf = _mm256_cvtepi32_ps(_mm256_and_si256(u, mask));
        _mm256_store_ps(buf + k * kTile + 8 * i,
                        _mm256_fmadd_ps(wf, s[i], _mm256_load_ps(bias + 8 * i)));
      }
    }
    int64_t n0 = 0;
    while (n0 < p.N) {
      const int64_t left = p.N - n0;
      const float* xr = p.x + n0 * p.K + kb;
      float* o = out_tile + n0 * kTile;
      if (left >= 6) {
        MicroRowsAvx2<6, 2>(buf, kc, xr, p.K, o);
        n0 += 6;
      } else if (left == 5) {
        MicroRowsAvx2<5, 2>(buf, kc, xr, p.K, o);
        n0 += 5;
      } else if (left == 4) {
        MicroRowsAvx2<4, 2>(buf, kc, xr, p.K, o);
        n0 += 4;
      } else if (left == 3) {
        MicroRowsAvx2<3, 2>(buf, kc, xr, p.K, o);
        n0 += 3;
      } else if (left == 2) {
        MicroRowsAvx2<2, 4>(buf, kc, xr, p.K, o);
        n0 += 2;
      } else {
        MicroRowsAvx2<1, 8>(buf, kc, xr, p.K, o);
        n0 += 1;
      }
    }
  }
}

// One row: no buffer; nibbles go from the load straight into FMAs.
JAXSPEC_AVX2 void GroupAvx2(const Problem& p, const uint8_t* wt, int64_t k0, int64_t k1,
                            int64_t g, const float* sc, const float* of, float* out_tile) {
  if (p.N >= 2) return GroupBufferedAvx2(p, wt, k0, k1, sc, of, out_tile);
  RowsAvx2<1, 8>(p, wt, k0, k1, g, 0, sc, of, out_tile);
}
#endif

// ------------------------------------------------------------------ one output tile

void RunTile(const Problem& p, int64_t t, int isa, float* out_tile) {
  std::memset(out_tile, 0, sizeof(float) * p.N * kTile);
  const uint8_t* wt = p.w + t * p.K * kRowBytes;
  const int64_t m0 = t * kTile;
  const int count = static_cast<int>(p.M - m0 < kTile ? p.M - m0 : kTile);
  alignas(32) float sc[kTile];
  alignas(32) float of[kTile];
  if (p.offset == nullptr) std::memset(of, 0, sizeof(of));
  for (int64_t g = 0; g < p.G; ++g) {
    const int64_t k0 = g * p.group;
    const int64_t k1 = k0 + p.group < p.K ? k0 + p.group : p.K;
    LoadRow(p.scale, p.scale_type, g * p.M + m0, count, sc);
    if (p.offset != nullptr) LoadRow(p.offset, p.offset_type, g * p.M + m0, count, of);
#if JAXSPEC_X86 && (defined(__GNUC__) || defined(__clang__))
    if (isa == kAvx2) {
      GroupAvx2(p, wt, k0, k1, g, sc, of, out_tile);
      continue;
    }
#endif
    GroupScalar(p, wt, k0, k1, g, sc, of, out_tile);
  }
  for (int64_t n = 0; n < p.N; ++n) {
    std::memcpy(p.out + n * p.M + m0, out_tile + n * kTile, sizeof(float) * count);
  }
}

// Work shared by the calling thread and the pool's helpers. A helper that starts late (after
// every tile was claimed) touches only the counters, so the job lives in a shared_ptr.
struct Job {
  Problem p;
  int isa = kScalar;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Work() {
    std::vector<float> out_tile(p.N * kTile);
    int64_t finished = 0;
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < p.T;) {
      RunTile(p, t, isa, out_tile.data());
      ++finished;
    }
    if (finished) done.fetch_add(finished, std::memory_order_release);
  }
};

bool IsScaleType(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::BF16 || t == ffi::DataType::F16;
}

ffi::Error Int4MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                          ffi::Buffer<ffi::U8> w, ffi::AnyBuffer scale, ffi::AnyBuffer offset,
                          ffi::ResultBuffer<ffi::F32> out, int64_t K, int64_t M, int64_t group,
                          int64_t has_offset) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  auto sd = scale.dimensions();
  auto od = offset.dimensions();
  auto rd = out->dimensions();
  if (K < 1 || M < 1 || group < 1) return ffi::Error::InvalidArgument("int4: K, M, group >= 1");
  const int64_t G = (K + group - 1) / group;
  const int64_t T = (M + kTile - 1) / kTile;
  if (xd.size() != 2 || xd[1] != K) return ffi::Error::InvalidArgument("int4: x must be [N, K]");
  const int64_t N = xd[0];
  if (wd.size() != 3 || wd[0] != T || wd[1] != K || wd[2] != kRowBytes)
    return ffi::Error::InvalidArgument("int4: prepared weight must be [ceil(M/64), K, 32]");
  if (sd.size() != 2 || sd[0] != G || sd[1] != M || !IsScaleType(scale.element_type()))
    return ffi::Error::InvalidArgument("int4: scale must be [G, M] of bf16, f16 or f32");
  if (has_offset < 0 || has_offset > 2)
    return ffi::Error::InvalidArgument("int4: has_offset is 0 (none), 1 (offset), 2 (minimum)");
  if (has_offset &&
      (od.size() != 2 || od[0] != G || od[1] != M || !IsScaleType(offset.element_type())))
    return ffi::Error::InvalidArgument("int4: offset must be [G, M] of bf16, f16 or f32");
  if (rd.size() != 2 || rd[0] != N || rd[1] != M)
    return ffi::Error::InvalidArgument("int4: out must be [N, M]");
  if (N == 0) return ffi::Error::Success();

  auto job = std::make_shared<Job>();
  Problem& p = job->p;
  p.x = x.typed_data();
  p.w = w.typed_data();
  p.scale = scale.untyped_data();
  p.offset = has_offset ? offset.untyped_data() : nullptr;
  p.scale_type = scale.element_type();
  p.offset_type = offset.element_type();
  p.out = out->typed_data();
  p.N = N, p.K = K, p.M = M, p.G = G, p.group = group, p.T = T;
  p.shift = has_offset == 2 ? 0.0f : 8.0f;
  p.xsum.assign(N * G, 0.0f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) p.xsum[n * G + k / group] += p.x[n * K + k];
  job->isa = g_isa.load(std::memory_order_relaxed);

  // Helpers only pay off with enough work: ~256 KB of weight to stream at one row; with many
  // rows the kernel is compute-bound and smaller weights are worth splitting too.
  int64_t helpers = 0;
  const int64_t work = T * K * kRowBytes * (N > 2 ? N / 2 : 1);
  if (T >= 2 && work >= (256 << 10)) {
    const int64_t cap = g_max_threads.load(std::memory_order_relaxed);
    helpers = (cap > 0 ? cap : pool.num_threads()) - 1;
    if (helpers > T - 1) helpers = T - 1;
    if (helpers < 0) helpers = 0;
  }
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([job] { job->Work(); });
  job->Work();
  // Wait for tiles that helpers claimed: spin briefly, then yield the core (on a busy machine
  // the helper may be waiting for this very core).
  for (int spins = 0; job->done.load(std::memory_order_acquire) < T; ++spins) {
#if JAXSPEC_X86
    if (spins < 256) {  // a few microseconds
      _mm_pause();
      continue;
    }
#endif
    std::this_thread::yield();
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecInt4Matmul, Int4MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("K")
                                  .Attr<int64_t>("M")
                                  .Attr<int64_t>("group")
                                  .Attr<int64_t>("has_offset"));

// The code path in use: 2 = AVX2+FMA, 0 = scalar.
extern "C" int jaxspec_int4_isa() { return g_isa.load(); }

// Forces a path (tests): 0 = scalar; 2 = AVX2 if this CPU has it. Returns the path now in use.
extern "C" int jaxspec_int4_set_isa(int isa) {
  g_isa.store(isa == kAvx2 ? DetectIsa() : kScalar);
  return g_isa.load();
}

// Caps the threads one call uses (caller included); 0 = the size of XLA's pool. Benchmarks.
extern "C" int jaxspec_int4_set_threads(int n) {
  g_max_threads.store(n < 0 ? 0 : n);
  return g_max_threads.load();
}
