// Grouped-query attention over a KV cache for XLA:CPU, as an XLA FFI custom call
// (jaxspec/floatkernel.py: attention).
//
//   q     [B, T, Kh, G, D]  float32  queries (RoPE applied)
//   keys  [B, S, Kh, D]     float32  the rows' cache slots (the first S positions)
//   vals  [B, S, Kh, D]     float32
//   pos   [B, T]            int32    each query's position: it sees cache indices s <= pos
//   out   [B, T, Kh, G, D]  float32  softmax(q . k / sqrt(D)) . v
//
// Batch invariance (see float_matmul.cc): every number is computed in one fixed order that
// depends on D and on the query's own position only, never on T, B, S (the KV bucket) or the
// thread: a score is an 8-lane dot over D with a fixed lane tree; the softmax's maximum and sum
// run over s = 0..pos in order; the output is a fused multiply-add chain over s = 0..pos per
// d. Indices past a query's position are never read. So a position's attention output is the
// same bits in a prefill, a verify block, a decode step, alone or with batch mates.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Attn {
  const float *q, *k, *v;
  const int32_t* pos;
  float* out;
  int64_t B, T, H, G, D, S;
  float scale;
};

// The 8-lane dot: lane l sums d = l, l+8, ... in order; lanes combined by a fixed tree; the
// tail (D % 8) added in order. Written in scalar code the compiler may vectorize across lanes
// (each lane's chain stays sequential: no reassociation without -ffast-math).
inline float Dot(const float* a, const float* b, int64_t D) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t D8 = D - D % 8;
  for (int64_t d = 0; d < D8; d += 8)
    for (int i = 0; i < 8; ++i) l[i] = std::fma(a[d + i], b[d + i], l[i]);
  float s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
  for (int64_t d = D8; d < D; ++d) s = std::fma(a[d], b[d], s);
  return s;
}

// One (b, t, kv head): its G query heads, in plain C++ (any CPU). `Dot` above and the
// AVX2 twin below perform the same fused multiply-adds in the same order: the same bits.
void QueryScalar(const Attn& a, int64_t b, int64_t t, int64_t h, float* p) {
  const int64_t n = std::min<int64_t>(a.pos[b * a.T + t], a.S - 1) + 1;  // visible positions
  for (int64_t g = 0; g < a.G; ++g) {
    const float* qv = a.q + (((b * a.T + t) * a.H + h) * a.G + g) * a.D;
    float* o = a.out + (((b * a.T + t) * a.H + h) * a.G + g) * a.D;
    std::memset(o, 0, sizeof(float) * a.D);
    if (n <= 0) continue;
    float mx = -INFINITY;
    for (int64_t s = 0; s < n; ++s) {
      p[s] = Dot(qv, a.k + ((b * a.S + s) * a.H + h) * a.D, a.D) * a.scale;
      mx = std::max(mx, p[s]);
    }
    float sum = 0.0f;
    for (int64_t s = 0; s < n; ++s) {
      p[s] = std::exp(p[s] - mx);
      sum += p[s];
    }
    for (int64_t s = 0; s < n; ++s) {
      const float w = p[s] / sum;
      const float* vv = a.v + ((b * a.S + s) * a.H + h) * a.D;
      for (int64_t d = 0; d < a.D; ++d) o[d] = std::fma(w, vv[d], o[d]);
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTN_AVX2 __attribute__((target("avx2,fma")))

ATTN_AVX2 inline float DotAvx2(const float* a, const float* b, int64_t D) {
  const int64_t D8 = D - D % 8;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t d = 0; d < D8; d += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
  alignas(32) float l[8];
  _mm256_store_ps(l, acc);
  float s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
  for (int64_t d = D8; d < D; ++d) s = std::fma(a[d], b[d], s);
  return s;
}

// D a multiple of 8 and at most 256 (checked by the caller); the output row in registers.
ATTN_AVX2 void QueryAvx2(const Attn& a, int64_t b, int64_t t, int64_t h, float* p) {
  const int64_t n = std::min<int64_t>(a.pos[b * a.T + t], a.S - 1) + 1;
  const int nv = static_cast<int>(a.D / 8);
  for (int64_t g = 0; g < a.G; ++g) {
    const float* qv = a.q + (((b * a.T + t) * a.H + h) * a.G + g) * a.D;
    float* o = a.out + (((b * a.T + t) * a.H + h) * a.G + g) * a.D;
    std::memset(o, 0, sizeof(float) * a.D);
    if (n <= 0) continue;
    float mx = -INFINITY;
    for (int64_t s = 0; s < n; ++s) {
      p[s] = DotAvx2(qv, a.k + ((b * a.S + s) * a.H + h) * a.D, a.D) * a.scale;
      mx = std::max(mx, p[s]);
    }
    float sum = 0.0f;
    for (int64_t s = 0; s < n; ++s) {
      p[s] = std::exp(p[s] - mx);
      sum += p[s];
    }
    __m256 acc[32];
    for (int i = 0; i < nv; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t s = 0; s < n; ++s) {
      const __m256 w = _mm256_set1_ps(p[s] / sum);
      const float* vv = a.v + ((b * a.S + s) * a.H + h) * a.D;
      for (int i = 0; i < nv; ++i) acc[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vv + 8 * i), acc[i]);
    }
    for (int i = 0; i < nv; ++i) _mm256_storeu_ps(o + 8 * i, acc[i]);
  }
}

bool HasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
bool HasAvx2() { return false; }
#endif

std::atomic<bool> g_avx2{HasAvx2()};

void Query(const Attn& a, int64_t b, int64_t t, int64_t h, float* p) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (g_avx2.load(std::memory_order_relaxed) && a.D % 8 == 0 && a.D <= 256) return QueryAvx2(a, b, t, h, p);
#endif
  QueryScalar(a, b, t, h, p);
}

struct Job {
  Attn a;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t units = 0;  // B * T * H

  void Work() {
    std::vector<float> p(a.S > 0 ? a.S : 1);
    int64_t finished = 0;
    for (int64_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < units;) {
      Query(a, u / (a.T * a.H), (u / a.H) % a.T, u % a.H, p.data());
      ++finished;
    }
    if (finished) done.fetch_add(finished, std::memory_order_release);
  }
};

ffi::Error AttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                         ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> pos,
                         ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions();
  auto kd = k.dimensions();
  auto pd = pos.dimensions();
  if (qd.size() != 5 || kd.size() != 4 || pd.size() != 2)
    return ffi::Error::InvalidArgument("attention: q [B,T,H,G,D], k/v [B,S,H,D], pos [B,T]");
  const int64_t B = qd[0], T = qd[1], H = qd[2], G = qd[3], D = qd[4], S = kd[1];
  if (kd[0] != B || kd[2] != H || kd[3] != D || pd[0] != B || pd[1] != T)
    return ffi::Error::InvalidArgument("attention: shapes disagree");
  auto vd = v.dimensions();
  if (vd.size() != 4 || vd[0] != B || vd[1] != S || vd[2] != H || vd[3] != D)
    return ffi::Error::InvalidArgument("attention: v must match k");
  auto job = std::make_shared<Job>();
  job->a = Attn{q.typed_data(), k.typed_data(), v.typed_data(), pos.typed_data(),
                out->typed_data(), B, T, H, G, D, S, 1.0f / std::sqrt(static_cast<float>(D))};
  job->units = B * T * H;
  if (job->units == 0) return ffi::Error::Success();
  // Threads pay off from ~64K multiply-adds.
  int64_t helpers = 0;
  if (job->units >= 2 && B * T * H * G * S * D >= (64 << 10)) {
    helpers = std::min<int64_t>(pool.num_threads() - 1, job->units - 1);
    if (helpers < 0) helpers = 0;
  }
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([job] { job->Work(); });
  job->Work();
  while (job->done.load(std::memory_order_acquire) < job->units) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecAttention, AttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// Forces a path (tests): 0 = scalar; 2 = AVX2 if this CPU has it. Returns the path now in use.
extern "C" int jaxspec_attention_set_isa(int isa) {
  g_avx2.store(isa == 2 && HasAvx2());
  return g_avx2.load() ? 2 : 0;
}
