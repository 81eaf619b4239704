// float32 / bfloat16-weight matmul for XLA:CPU, as an XLA FFI custom call
// (jaxspec/floatkernel.py).
//
//   NN: out[n, m] = sum_k x[n, k] * W[k, m]     W stored [K, M] (a Dense kernel)
//   NT: out[n, m] = sum_k x[n, k] * W[m, k]     W stored [M, K] (a tied embedding table)
//
// x and out are float32; W is float32 or bfloat16 (widened exactly to float32 on load).
//
// Batch invariance. Each output is summed in ONE fixed order that depends on K alone, never on
// the number of rows N, on which rows share a call, or on the thread that computes it:
//   NN: acc = fma(x[k], W[k, m], acc) for k = 0, 1, ..., K-1, from acc = 0.
//   NT: eight lanes, lane l = fma chain over k = l, l+8, ... (k < K8 = K - K % 8), then one
//       fixed tree over the lanes (Hsum), then the tail k >= K8 added in order.
// Every code path (one row or many, register or buffered, AVX2 or its scalar twin with
// std::fma) performs exactly these operations, so a row's output is bit for bit the same
// whether it is alone (decode), one of a verify block, or one of a long prefill. This is what
// makes the verifier's K/V, and so resume after a restart, exact to the bit on the CPU.
//
// Bandwidth: the kernel reads each weight byte once per call whatever N is. NN splits the
// output into tiles of 64 columns; a tile's rows are streamed in chunks of 32 k (prefetched one
// chunk ahead), each chunk copied (widened) into an 8 KB L1 buffer that a register-blocked
// micro-kernel reuses for every block of up to 6 rows. NT splits the output into blocks of 64
// table rows, each read contiguously. Tiles and blocks are shared out over the thread pool XLA
// hands the handler (the calling thread works too).

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FK_X86 1
#else
#define FK_X86 0
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kTile = 64;    // NN: output columns per tile; NT: table rows per block
constexpr int kChunk = 32;   // NN: k rows per buffered chunk

enum Isa : int { kScalar = 0, kAvx2 = 2, kAvx512 = 3 };

int DetectIsa() {
#if FK_X86 && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) return kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return kAvx2;
#endif
  return kScalar;
}

std::atomic<int> g_isa{DetectIsa()};
std::atomic<int> g_max_threads{0};

inline float Bf16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct Problem {
  const float* x;   // [N, K]
  const void* w;    // NN [K, M] / NT [M, K]
  bool bf16;        // w's dtype: bfloat16 (else float32)
  bool nt;
  float* out;       // [N, M]
  int64_t N, K, M, T;  // T: tiles of 64 output columns (NN) or table rows (NT)
};

inline float WAt(const Problem& p, int64_t i) {
  return p.bf16 ? Bf16(static_cast<const uint16_t*>(p.w)[i]) : static_cast<const float*>(p.w)[i];
}

// ------------------------------------------------------------------ scalar twins

// NN, one tile [m0, m0 + cols): the fixed k order with std::fma.
void NnScalar(const Problem& p, int64_t m0, int cols) {
  std::vector<float> acc(cols);
  for (int64_t n = 0; n < p.N; ++n) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    const float* xr = p.x + n * p.K;
    for (int64_t k = 0; k < p.K; ++k)
      for (int c = 0; c < cols; ++c) acc[c] = std::fma(xr[k], WAt(p, k * p.M + m0 + c), acc[c]);
    std::memcpy(p.out + n * p.M + m0, acc.data(), sizeof(float) * cols);
  }
}

// The lane tree shared by every NT path: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
inline float HsumLanes(const float* l) {
  const float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  return (a0 + a2) + (a1 + a3);
}

float NtTail(const Problem& p, const float* xr, int64_t m, float s) {
  const int64_t K8 = p.K - p.K % 8;
  for (int64_t k = K8; k < p.K; ++k) s = std::fma(xr[k], WAt(p, m * p.K + k), s);
  return s;
}

void NtScalar(const Problem& p, int64_t m0, int rows) {
  const int64_t K8 = p.K - p.K % 8;
  for (int64_t n = 0; n < p.N; ++n) {
    const float* xr = p.x + n * p.K;
    for (int64_t m = m0; m < m0 + rows; ++m) {
      float lanes[8] = {0};
      for (int64_t k = 0; k < K8; k += 8)
        for (int l = 0; l < 8; ++l) lanes[l] = std::fma(xr[k + l], WAt(p, m * p.K + k + l), lanes[l]);
      p.out[n * p.M + m] = NtTail(p, xr, m, HsumLanes(lanes));
    }
  }
}

// ------------------------------------------------------------------ AVX2 + FMA

#if FK_X86 && (defined(__GNUC__) || defined(__clang__))
#define FK_AVX2 __attribute__((target("avx2,fma")))

FK_AVX2 inline __m256 Load8(const Problem& p, int64_t i) {
  if (p.bf16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
        static_cast<const uint16_t*>(p.w) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return _mm256_loadu_ps(static_cast<const float*>(p.w) + i);
}

FK_AVX2 inline void Prefetch(const Problem& p, int64_t i) {
  const char* base = static_cast<const char*>(p.w) + i * (p.bf16 ? 2 : 4);
  _mm_prefetch(base, _MM_HINT_T0);
  _mm_prefetch(base + 64, _MM_HINT_T0);
  if (!p.bf16) {
    _mm_prefetch(base + 128, _MM_HINT_T0);
    _mm_prefetch(base + 192, _MM_HINT_T0);
  }
}

// NN, one full tile, one row: the accumulators stay in registers over all of K.
FK_AVX2 void NnOneRow(const Problem& p, int64_t m0) {
  __m256 acc[8];
  for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < p.K; ++k) {
    if (k + 16 < p.K) Prefetch(p, (k + 16) * p.M + m0);
    const __m256 xb = _mm256_broadcast_ss(p.x + k);
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(xb, Load8(p, k * p.M + m0 + 8 * c), acc[c]);
  }
  for (int c = 0; c < 8; ++c) _mm256_storeu_ps(p.out + m0 + 8 * c, acc[c]);
}

// Rows [0, R) of xr (leading dim ldx) x column vectors [c0, c0 + C) of buf [kc][64],
// accumulated into o [R][64].
template <int R, int C>
FK_AVX2 void Micro(const float* buf, int64_t kc, const float* xr, int64_t ldx, int c0, float* o) {
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
FK_AVX2 void MicroRows(const float* buf, int64_t kc, const float* xr, int64_t ldx, float* o) {
  for (int c0 = 0; c0 < 8; c0 += C) Micro<R, C>(buf, kc, xr, ldx, c0, o);
}

// NN, one tile of `cols` columns, any number of rows, through the L1 buffer.
FK_AVX2 void NnBuffered(const Problem& p, int64_t m0, int cols, float* out_tile) {
  alignas(32) float buf[kChunk * kTile];
  std::memset(out_tile, 0, sizeof(float) * p.N * kTile);
  if (cols < kTile) std::memset(buf, 0, sizeof(buf));
  for (int64_t kb = 0; kb < p.K; kb += kChunk) {
    const int64_t kc = p.K - kb < kChunk ? p.K - kb : kChunk;
    for (int64_t k = 0; k < kc; ++k) {
      const int64_t row = (kb + k) * p.M + m0;
      if (kb + kChunk + k < p.K) Prefetch(p, row + kChunk * p.M);
      if (cols == kTile) {
        for (int c = 0; c < 8; ++c) _mm256_store_ps(buf + k * kTile + 8 * c, Load8(p, row + 8 * c));
      } else {
        for (int c = 0; c < cols; ++c) buf[k * kTile + c] = WAt(p, row + c);
      }
    }
    for (int64_t n0 = 0; n0 < p.N;) {
      const int64_t left = p.N - n0;
      const float* xr = p.x + n0 * p.K + kb;
      float* o = out_tile + n0 * kTile;
      if (left >= 6) {
        MicroRows<6, 2>(buf, kc, xr, p.K, o), n0 += 6;
      } else if (left == 5) {
        MicroRows<5, 2>(buf, kc, xr, p.K, o), n0 += 5;
      } else if (left == 4) {
        MicroRows<4, 2>(buf, kc, xr, p.K, o), n0 += 4;
      } else if (left == 3) {
        MicroRows<3, 2>(buf, kc, xr, p.K, o), n0 += 3;
      } else if (left == 2) {
        MicroRows<2, 4>(buf, kc, xr, p.K, o), n0 += 2;
      } else {
        MicroRows<1, 8>(buf, kc, xr, p.K, o), n0 += 1;
      }
    }
  }
  for (int64_t n = 0; n < p.N; ++n)
    std::memcpy(p.out + n * p.M + m0, out_tile + n * kTile, sizeof(float) * cols);
}

// The same lane tree as HsumLanes.
FK_AVX2 inline float Hsum(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return HsumLanes(l);
}

// NT: rows [n0, n0 + R) x table rows [m, m + C), lanes over k.
template <int R, int C>
FK_AVX2 void NtMicro(const Problem& p, int64_t n0, int64_t m) {
  const int64_t K8 = p.K - p.K % 8;
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = Load8(p, (m + c) * p.K + k);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(p.x + (n0 + r) * p.K + k);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      p.out[(n0 + r) * p.M + m + c] = NtTail(p, p.x + (n0 + r) * p.K, m + c, Hsum(acc[r][c]));
}

template <int R>
FK_AVX2 void NtRows(const Problem& p, int64_t n0, int64_t m0, int rows) {
  int64_t m = m0;
  for (; m + 4 <= m0 + rows; m += 4) NtMicro<R, 4>(p, n0, m);
  for (; m < m0 + rows; ++m) NtMicro<R, 1>(p, n0, m);
}

FK_AVX2 void NtAvx2(const Problem& p, int64_t m0, int rows) {
  int64_t n0 = 0;
  for (; n0 + 2 <= p.N; n0 += 2) NtRows<2>(p, n0, m0, rows);
  if (n0 < p.N) NtRows<1>(p, n0, m0, rows);
}

// ------------------------------------------------------------------ AVX-512
// The same operations as the AVX2 path, 16 lanes wide: NN's lanes are output columns (each
// still one fma chain over k), NT's zmm holds two outputs' eight k-lanes side by side.

#define FK_AVX512 __attribute__((target("avx512f,avx512dq,avx2,fma")))

FK_AVX512 inline __m512 Load16(const Problem& p, int64_t i) {
  if (p.bf16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
        static_cast<const uint16_t*>(p.w) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_loadu_ps(static_cast<const float*>(p.w) + i);
}

FK_AVX512 void NnOneRow512(const Problem& p, int64_t m0) {
  __m512 acc[4];
  for (int c = 0; c < 4; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < p.K; ++k) {
    if (k + 16 < p.K) Prefetch(p, (k + 16) * p.M + m0);
    const __m512 xb = _mm512_set1_ps(p.x[k]);
    for (int c = 0; c < 4; ++c) acc[c] = _mm512_fmadd_ps(xb, Load16(p, k * p.M + m0 + 16 * c), acc[c]);
  }
  for (int c = 0; c < 4; ++c) _mm512_storeu_ps(p.out + m0 + 16 * c, acc[c]);
}


template <int R>
FK_AVX512 void Micro512(const float* buf, int64_t kc, const float* xr, int64_t ldx, float* o) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_loadu_ps(o + r * kTile + 16 * c);
  for (int64_t k = 0; k < kc; ++k) {
    __m512 wv[4];
    for (int c = 0; c < 4; ++c) wv[c] = _mm512_load_ps(buf + k * kTile + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(xr[r * ldx + k]);
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(xb, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(o + r * kTile + 16 * c, acc[r][c]);
}

FK_AVX512 void NnBuffered512(const Problem& p, int64_t m0, int cols, float* out_tile) {
  alignas(64) float buf[kChunk * kTile];
  std::memset(out_tile, 0, sizeof(float) * p.N * kTile);
  if (cols < kTile) std::memset(buf, 0, sizeof(buf));
  for (int64_t kb = 0; kb < p.K; kb += kChunk) {
    const int64_t kc = p.K - kb < kChunk ? p.K - kb : kChunk;
    for (int64_t k = 0; k < kc; ++k) {
      const int64_t row = (kb + k) * p.M + m0;
      if (kb + kChunk + k < p.K) Prefetch(p, row + kChunk * p.M);
      if (cols == kTile) {
        for (int c = 0; c < 4; ++c) _mm512_store_ps(buf + k * kTile + 16 * c, Load16(p, row + 16 * c));
      } else {
        for (int c = 0; c < cols; ++c) buf[k * kTile + c] = WAt(p, row + c);
      }
    }
    int64_t n0 = 0;
    for (; n0 + 6 <= p.N; n0 += 6) Micro512<6>(buf, kc, p.x + n0 * p.K + kb, p.K, out_tile + n0 * kTile);
    const float* xr = p.x + n0 * p.K + kb;
    float* o = out_tile + n0 * kTile;
    switch (p.N - n0) {
      case 5: Micro512<5>(buf, kc, xr, p.K, o); break;
      case 4: Micro512<4>(buf, kc, xr, p.K, o); break;
      case 3: Micro512<3>(buf, kc, xr, p.K, o); break;
      case 2: Micro512<2>(buf, kc, xr, p.K, o); break;
      case 1: Micro512<1>(buf, kc, xr, p.K, o); break;
      default: break;
    }
  }
  for (int64_t n = 0; n < p.N; ++n)
    std::memcpy(p.out + n * p.M + m0, out_tile + n * kTile, sizeof(float) * cols);
}

// Two table rows' eight k-lanes in one zmm: [W[m, k..k+7] | W[m+1, k..k+7]].
FK_AVX512 inline __m512 LoadPair(const Problem& p, int64_t m, int64_t k) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(Load8(p, m * p.K + k)),
                            Load8(p, (m + 1) * p.K + k), 1);
}

// NT: rows [n0, n0 + R) x table rows [m, m + 2C).
template <int R, int C>
FK_AVX512 void NtMicro512(const Problem& p, int64_t n0, int64_t m) {
  const int64_t K8 = p.K - p.K % 8;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    __m512 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = LoadPair(p, m + 2 * c, k);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(p.x + (n0 + r) * p.K + k));
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const float* xr = p.x + (n0 + r) * p.K;
      const int64_t mm = m + 2 * c;
      p.out[(n0 + r) * p.M + mm] = NtTail(p, xr, mm, Hsum(_mm512_castps512_ps256(acc[r][c])));
      p.out[(n0 + r) * p.M + mm + 1] =
          NtTail(p, xr, mm + 1, Hsum(_mm512_extractf32x8_ps(acc[r][c], 1)));
    }
}

template <int R>
FK_AVX512 void NtRows512(const Problem& p, int64_t n0, int64_t m0, int rows) {
  int64_t m = m0;
  for (; m + 8 <= m0 + rows; m += 8) NtMicro512<R, 4>(p, n0, m);
  for (; m + 2 <= m0 + rows; m += 2) NtMicro512<R, 1>(p, n0, m);
  for (; m < m0 + rows; ++m) NtMicro<R, 1>(p, n0, m);
}

FK_AVX512 void Nt512(const Problem& p, int64_t m0, int rows) {
  int64_t n0 = 0;
  for (; n0 + 4 <= p.N; n0 += 4) NtRows512<4>(p, n0, m0, rows);
  for (; n0 + 2 <= p.N; n0 += 2) NtRows512<2>(p, n0, m0, rows);
  if (n0 < p.N) NtRows512<1>(p, n0, m0, rows);
}
#endif

void RunTile(const Problem& p, int64_t t, int isa, float* out_tile) {
  const int64_t m0 = t * kTile;
  const int cols = static_cast<int>(p.M - m0 < kTile ? p.M - m0 : kTile);
#if FK_X86 && (defined(__GNUC__) || defined(__clang__))
  if (isa == kAvx512) {
    if (p.nt) return Nt512(p, m0, cols);
    if (p.N == 1 && cols == kTile) return NnOneRow512(p, m0);
    return NnBuffered512(p, m0, cols, out_tile);
  }
  if (isa == kAvx2) {
    if (p.nt) return NtAvx2(p, m0, cols);
    if (p.N == 1 && cols == kTile) return NnOneRow(p, m0);
    return NnBuffered(p, m0, cols, out_tile);
  }
#endif
  if (p.nt) return NtScalar(p, m0, cols);
  NnScalar(p, m0, cols);
}

struct Job {
  Problem p;
  int isa = kScalar;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Work() {
    std::vector<float> out_tile(p.nt ? 0 : p.N * kTile);
    int64_t finished = 0;
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < p.T;) {
      RunTile(p, t, isa, out_tile.data());
      ++finished;
    }
    if (finished) done.fetch_add(finished, std::memory_order_release);
  }
};

ffi::Error FloatMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer w,
                           ffi::ResultBuffer<ffi::F32> out, int64_t transpose_w) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  auto rd = out->dimensions();
  const bool bf16 = w.element_type() == ffi::DataType::BF16;
  if (!bf16 && w.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("float matmul: w must be float32 or bfloat16");
  if (xd.size() != 2 || wd.size() != 2 || rd.size() != 2)
    return ffi::Error::InvalidArgument("float matmul: x, w and out must be 2-D");
  const int64_t N = xd[0], K = xd[1];
  const int64_t M = transpose_w ? wd[0] : wd[1];
  if ((transpose_w ? wd[1] : wd[0]) != K)
    return ffi::Error::InvalidArgument("float matmul: contracted dimensions differ");
  if (rd[0] != N || rd[1] != M) return ffi::Error::InvalidArgument("float matmul: out is not [N, M]");
  if (N == 0 || M == 0) return ffi::Error::Success();

  auto job = std::make_shared<Job>();
  Problem& p = job->p;
  p = Problem{x.typed_data(), w.untyped_data(), bf16, transpose_w != 0, out->typed_data(),
              N, K, M, (M + kTile - 1) / kTile};
  if (K == 0) {
    std::memset(p.out, 0, sizeof(float) * N * M);
    return ffi::Error::Success();
  }
  job->isa = g_isa.load(std::memory_order_relaxed);
  // Helpers pay off above ~256 KB of weight (or the same in multiply-adds at many rows).
  int64_t helpers = 0;
  const int64_t work = M * K * (bf16 ? 2 : 4) * (N > 2 ? N / 2 : 1);
  if (p.T >= 2 && work >= (256 << 10)) {
    const int64_t cap = g_max_threads.load(std::memory_order_relaxed);
    helpers = (cap > 0 ? cap : pool.num_threads()) - 1;
    if (helpers > p.T - 1) helpers = p.T - 1;
    if (helpers < 0) helpers = 0;
  }
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([job] { job->Work(); });
  job->Work();
  for (int spins = 0; job->done.load(std::memory_order_acquire) < p.T; ++spins) {
#if FK_X86
    if (spins < 256) {
      _mm_pause();
      continue;
    }
#endif
    std::this_thread::yield();
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecFloatMatmul, FloatMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("transpose_w"));

// The code path in use: 3 = AVX-512, 2 = AVX2+FMA, 0 = scalar.
extern "C" int jaxspec_float_isa() { return g_isa.load(); }

// Forces a path (tests): 0 = scalar, 2 = AVX2, 3 = AVX-512, each only where this CPU has it.
// Returns the path now in use.
extern "C" int jaxspec_float_set_isa(int isa) {
  const int best = DetectIsa();
  g_isa.store(isa <= kScalar ? kScalar : (isa >= best ? best : isa));
  return g_isa.load();
}

// Caps the threads one call uses (caller included); 0 = the size of XLA's pool.
extern "C" int jaxspec_float_set_threads(int n) {
  g_max_threads.store(n < 0 ? 0 : n);
  return g_max_threads.load();
}
