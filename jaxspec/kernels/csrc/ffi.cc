// The XLA FFI handlers of jaxspec's CPU kernels (loaded by jaxspec/kernels/library.py):
// argument checks, the split of a call's work over XLA's CPU thread pool, and the choice of
// the instruction set's table (common.h). One setting of the instruction set and one cap on
// threads govern every kernel.
//
//   JaxspecFloatMatmul  x f32[N, K] . w [K, M] (or w [M, K] with transpose_w), w f32 / bf16
//   JaxspecInt4Matmul   x f32[N, K] . int4 w in the tiled layout, with scale and offset
//   JaxspecInt8Matmul   x f32[N, K] . int8 q [K, M] with a scale per group of k
//   JaxspecAttention    grouped-query attention over a KV cache
//   JaxspecAttentionCache  the same over the model's stacked cache (float32 or bfloat16), read
//                          in place

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>


#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxspec {
namespace {

int DetectIsa() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return kAvx512;
  if (avx2) return kAvx2;
#endif
  return kScalar;
}

const int g_best = DetectIsa();
std::atomic<int> g_isa{g_best};
std::atomic<int> g_max_threads{0};  // 0: as many as XLA's pool has

const KernelTable& Table() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  switch (g_isa.load(std::memory_order_relaxed)) {
    case kAvx512: return isa_avx512::kTable;
    case kAvx2: return isa_avx2::kTable;
    default: break;
  }
#endif
  return isa_scalar::kTable;
}

void Relax(int spins) {
#if defined(__x86_64__)
  if (spins < 256) return _mm_pause();  // a few microseconds, then give the core away
#endif
  std::this_thread::yield();
}

// Threads for a call of about `ns` nanoseconds of one thread's work over `units` units:
// helpers pay off from ~8 us;
// never more threads than units, nor than the cap.
int64_t Threads(ffi::ThreadPool& pool, int64_t units, double ns) {
  if (units < 2 || ns < 8000) return 1;
  const int64_t cap = g_max_threads.load(std::memory_order_relaxed);
  const int64_t n = cap > 0 ? cap : pool.num_threads();
  return std::max<int64_t>(1, std::min(n, units));
}

// One thread's rough speed on each kind of work (a 2-core AMD EPYC): streaming float weights
// at ~20 GB/s; int4 at ~15 weights/ns; multiply-adds in registers at ~20/ns.
double StreamNs(double bytes) { return bytes / 20.0; }
double Int4Ns(double weights) { return weights / 15.0; }
double MacNs(double macs) { return macs / 20.0; }
// Attention over a short cache: ~55 multiply-adds/ns on one thread (SmolLM2's decode step,
// 3 kv heads over 256 positions: 5 us alone, 12 us split over two threads).
double AttnNs(double macs) { return macs / 55.0; }

// A thread's scratch for the units it runs, kept between calls (grown, never shrunk): a fresh
// zero-filled vector per call cost the int4 kernel ~110 KB of allocation and memset per thread
// per call, a few microseconds of a 30 us matmul. No kernel reads scratch it has not written.
float* Scratch(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(floats);
  return buf.empty() ? nullptr : buf.data();
}

// The work of one call: units taken in turn by every thread that joins, each with its own
// scratch. A thread that joins late finds nothing left and touches only the counters, which
// live as long as it holds the job.
struct Job {
  std::atomic<int64_t> next{0}, done{0};
  int64_t units = 0, scratch = 0;
  const std::function<void(int64_t, float*)>* fn = nullptr;
  void Work() {
    float* buf = Scratch(scratch);
    int64_t finished = 0;
    for (int64_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < units; ++finished)
      (*fn)(u, buf);
    if (finished) done.fetch_add(finished, std::memory_order_release);
  }
};

// Runs fn(unit, scratch) for every unit in [0, units) on the calling thread and threads - 1
// helpers of XLA's pool, each taking the next unclaimed unit; returns when
// all are done. `scratch` is `scratch_floats` floats of the running thread's own.
void ParallelFor(ffi::ThreadPool& pool, int64_t units, int64_t threads, int64_t scratch_floats,
                 const std::function<void(int64_t, float*)>& fn) {
  auto job = std::make_shared<Job>();
  job->units = units, job->scratch = scratch_floats, job->fn = &fn;
  for (int64_t h = 1; h < threads; ++h) pool.Schedule([job] { job->Work(); });
  job->Work();
  for (int spins = 0; job->done.load(std::memory_order_acquire) < units; ++spins) Relax(spins);
}

bool ToDt(ffi::DataType t, Dt* out) {
  switch (t) {
    case ffi::DataType::F32: *out = Dt::kF32; return true;
    case ffi::DataType::BF16: *out = Dt::kBf16; return true;
    case ffi::DataType::F16: *out = Dt::kF16; return true;
    default: return false;
  }
}

// ---------------------------------------------------------------------------- float matmul

// The split of a contraction-parts kernel (float NN, int8): units are (part of k, span of
// columns in whole vectors of 16); part 0 sums into out, the others into their own buffers,
// added to out in order once every unit is done. `run(part, c0, c1, y, scratch)` with
// scratch of 4 * (c1 - c0) floats.
void RunParts(ffi::ThreadPool& pool, int64_t N, int64_t M, double work,
              const std::function<void(int, int64_t, int64_t, float*, float*)>& run,
              float* out) {
  const int64_t vecs = (M + 15) / 16;
  const int64_t spans =
      std::max<int64_t>(1, std::min(vecs, (Threads(pool, 64, work) + kParts - 1) / kParts));
  const int64_t units = kParts * spans;
  std::vector<float> parts((kParts - 1) * N * M);
  const int64_t widest = (vecs + spans - 1) / spans * 16;
  ParallelFor(pool, units, Threads(pool, units, work), 4 * widest, [&](int64_t u, float* s) {
    const int part = static_cast<int>(u / spans);
    const int64_t span = u % spans;
    const int64_t c0 = vecs * span / spans * 16, c1 = std::min(M, vecs * (span + 1) / spans * 16);
    float* y = part == 0 ? out : parts.data() + (part - 1) * N * M;
    if (c0 < c1) run(part, c0, c1, y, s);
  });
  for (int part = 1; part < kParts; ++part) {
    const float* y = parts.data() + (part - 1) * N * M;
    for (int64_t i = 0; i < N * M; ++i) out[i] = out[i] + y[i];
  }
}

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
  const int64_t N = xd[0], K = xd[1], M = transpose_w ? wd[0] : wd[1];
  if ((transpose_w ? wd[1] : wd[0]) != K)
    return ffi::Error::InvalidArgument("float matmul: contracted dimensions differ");
  if (rd[0] != N || rd[1] != M) return ffi::Error::InvalidArgument("float matmul: out is not [N, M]");
  if (N == 0 || M == 0) return ffi::Error::Success();
  const FloatMM p{x.typed_data(), w.untyped_data(), bf16, out->typed_data(), N, K, M};
  if (K == 0) {
    std::memset(p.out, 0, sizeof(float) * N * M);
    return ffi::Error::Success();
  }
  const KernelTable& table = Table();
  const double work = std::max(StreamNs(double(M) * K * (bf16 ? 2 : 4)), MacNs(double(N) * M * K));
  if (transpose_w) {  // units: blocks of 64 table rows, taken in turn
    const int64_t units = (M + kTile - 1) / kTile;
    ParallelFor(pool, units, Threads(pool, units, work), 0, [&](int64_t u, float*) {
      table.float_nt(p, u * kTile, std::min(M, (u + 1) * kTile));
    });
    return ffi::Error::Success();
  }
  RunParts(
      pool, N, M, work,
      [&](int part, int64_t c0, int64_t c1, float* y, float*) { table.float_nn(p, part, c0, c1, y); },
      p.out);
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------- int4 matmul

ffi::Error Int4MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w,
                          ffi::AnyBuffer scale, ffi::AnyBuffer offset,
                          ffi::ResultBuffer<ffi::F32> out, int64_t K, int64_t M, int64_t group,
                          int64_t has_offset) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  auto sd = scale.dimensions();
  auto od = offset.dimensions();
  auto rd = out->dimensions();
  if (K < 1 || M < 1 || group < 1) return ffi::Error::InvalidArgument("int4: K, M, group >= 1");
  const int64_t G = (K + group - 1) / group, T = (M + kTile - 1) / kTile;
  if (xd.size() != 2 || xd[1] != K) return ffi::Error::InvalidArgument("int4: x must be [N, K]");
  const int64_t N = xd[0];
  if (wd.size() != 3 || wd[0] != T || wd[1] != K || wd[2] != kTileBytes)
    return ffi::Error::InvalidArgument("int4: prepared weight must be [ceil(M/64), K, 32]");
  Dt scale_type, offset_type = Dt::kF32;
  if (sd.size() != 2 || sd[0] != G || sd[1] != M || !ToDt(scale.element_type(), &scale_type))
    return ffi::Error::InvalidArgument("int4: scale must be [G, M] of bf16, f16 or f32");
  if (has_offset < 0 || has_offset > 2)
    return ffi::Error::InvalidArgument("int4: has_offset is 0 (none), 1 (offset), 2 (minimum)");
  if (has_offset && (od.size() != 2 || od[0] != G || od[1] != M ||
                     !ToDt(offset.element_type(), &offset_type)))
    return ffi::Error::InvalidArgument("int4: offset must be [G, M] of bf16, f16 or f32");
  if (rd.size() != 2 || rd[0] != N || rd[1] != M)
    return ffi::Error::InvalidArgument("int4: out must be [N, M]");
  if (N == 0) return ffi::Error::Success();

  std::vector<float> xsum(N * G, 0.0f);  // each row's sum of x over each group, in order
  const float* xp = x.typed_data();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) xsum[n * G + k / group] += xp[n * K + k];
  const Int4MM p{xp, w.typed_data(), scale.untyped_data(),
                 has_offset ? offset.untyped_data() : nullptr, scale_type, offset_type,
                 out->typed_data(), N, K, M, G, group, T, has_offset == 2 ? 0.0f : 8.0f,
                 xsum.data()};
  const KernelTable& table = Table();
  const double work = Int4Ns(double(N) * K * T * kTile);
  // units: one balanced range of tiles per thread (each gathers its own tiles' scales)
  const int64_t threads = Threads(pool, T, work);
  const int64_t most = (T + threads - 1) / threads;
  ParallelFor(pool, threads, threads, N * kTile + 2 * most * G * kTile, [&](int64_t u, float* s) {
    const int64_t t0 = T * u / threads, t1 = T * (u + 1) / threads;
    if (t0 < t1) table.int4(p, t0, t1, s);
  });
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------- int8 matmul

ffi::Error Int8MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> q,
                          ffi::AnyBuffer scale, ffi::ResultBuffer<ffi::F32> out, int64_t group) {
  auto xd = x.dimensions();
  auto qd = q.dimensions();
  auto sd = scale.dimensions();
  auto rd = out->dimensions();
  if (xd.size() != 2 || qd.size() != 2 || rd.size() != 2 || qd[0] != xd[1] || group < 1)
    return ffi::Error::InvalidArgument("int8: x [N, K], q [K, M], group >= 1");
  const int64_t N = xd[0], K = xd[1], M = qd[1], G = (K + group - 1) / group;
  Dt scale_type;
  if (sd.size() != 2 || sd[0] != G || sd[1] != M || !ToDt(scale.element_type(), &scale_type))
    return ffi::Error::InvalidArgument("int8: scale must be [G, M] of bf16, f16 or f32");
  if (rd[0] != N || rd[1] != M) return ffi::Error::InvalidArgument("int8: out is not [N, M]");
  if (N == 0 || M == 0) return ffi::Error::Success();
  const Int8MM p{x.typed_data(), q.typed_data(), scale.untyped_data(), scale_type,
                 out->typed_data(), N, K, M, G, group};
  RunParts(pool, N, M, std::max(StreamNs(double(K) * M), MacNs(double(N) * M * K)),
           [&](int part, int64_t c0, int64_t c1, float* y, float* scratch) {
             Table().int8(p, part, c0, c1, y, scratch);
           },
           p.out);
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------- attention

void RunAttention(ffi::ThreadPool& pool, const Attn& a) {
  const int64_t units = a.B * a.T * a.H;
  if (units == 0) return;
  const KernelTable& table = Table();
  const double work = AttnNs(2.0 * a.B * a.T * a.H * a.G * a.S * a.D);
  ParallelFor(pool, units, Threads(pool, units, work), a.S, [&](int64_t u, float* p) {
    table.attention(a, u / (a.T * a.H), (u / a.H) % a.T, u % a.H, p);
  });
}

ffi::Error AttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                         ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> pos,
                         ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions();
  auto kd = k.dimensions();
  auto vd = v.dimensions();
  auto pd = pos.dimensions();
  if (qd.size() != 5 || kd.size() != 4 || pd.size() != 2)
    return ffi::Error::InvalidArgument("attention: q [B,T,H,G,D], k/v [B,S,H,D], pos [B,T]");
  const int64_t B = qd[0], T = qd[1], H = qd[2], G = qd[3], D = qd[4], S = kd[1];
  if (kd[0] != B || kd[2] != H || kd[3] != D || pd[0] != B || pd[1] != T)
    return ffi::Error::InvalidArgument("attention: shapes disagree");
  if (vd.size() != 4 || vd[0] != B || vd[1] != S || vd[2] != H || vd[3] != D)
    return ffi::Error::InvalidArgument("attention: v must match k");
  const Attn a{q.typed_data(), k.typed_data(), v.typed_data(), false, pos.typed_data(), nullptr,
               out->typed_data(), B, T, H, G, D, S, S, 0,
               1.0f / std::sqrt(static_cast<float>(D))};
  RunAttention(pool, a);
  return ffi::Error::Success();
}

// The same attention reading the model's stacked cache in place: k_all, v_all [L, N, Smax, H,
// D], layer `layer`, batch row b's slot rows[b], the first S positions.
ffi::Error AttentionCacheImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                              ffi::AnyBuffer k, ffi::AnyBuffer v,
                              ffi::Buffer<ffi::S32> rows, ffi::Buffer<ffi::S32> pos,
                              ffi::ResultBuffer<ffi::F32> out, int64_t layer, int64_t S,
                              int64_t window) {
  auto qd = q.dimensions();
  auto kd = k.dimensions();
  auto vd = v.dimensions();
  auto rd = rows.dimensions();
  auto pd = pos.dimensions();
  if (qd.size() != 5 || kd.size() != 5 || rd.size() != 1 || pd.size() != 2)
    return ffi::Error::InvalidArgument(
        "attention: q [B,T,H,G,D], k/v [L,N,Smax,H,D], rows [B], pos [B,T]");
  const int64_t B = qd[0], T = qd[1], H = qd[2], G = qd[3], D = qd[4];
  const int64_t L = kd[0], N = kd[1], Smax = kd[2];
  if (kd[3] != H || kd[4] != D || rd[0] != B || pd[0] != B || pd[1] != T)
    return ffi::Error::InvalidArgument("attention: shapes disagree");
  for (size_t i = 0; i < 5; ++i)
    if (vd.size() != 5 || vd[i] != kd[i]) return ffi::Error::InvalidArgument("attention: v must match k");
  if (layer < 0 || layer >= L || S < 1 || S > Smax || window < 0)
    return ffi::Error::InvalidArgument("attention: layer, S or window out of range");
  const ffi::DataType kt = k.element_type();
  if ((kt != ffi::DataType::F32 && kt != ffi::DataType::BF16) || v.element_type() != kt)
    return ffi::Error::InvalidArgument("attention: k and v must both be float32 or bfloat16");
  const int32_t* r = rows.typed_data();
  for (int64_t b = 0; b < B; ++b)
    if (r[b] < 0 || r[b] >= N) return ffi::Error::InvalidArgument("attention: a slot out of range");
  const Attn a{q.typed_data(), k.untyped_data(), v.untyped_data(), kt == ffi::DataType::BF16,
               pos.typed_data(), r, out->typed_data(), B, T, H, G, D, S, Smax, layer * N,
               1.0f / std::sqrt(static_cast<float>(D)), window};
  RunAttention(pool, a);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxspec

// The handlers' signatures: every kernel takes XLA's CPU thread pool first.
namespace jaxspec {
using F32 = ffi::Buffer<ffi::F32>;
using S32 = ffi::Buffer<ffi::S32>;
inline auto Bind() { return ffi::Ffi::Bind().Ctx<ffi::ThreadPool>(); }
}  // namespace jaxspec

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxspecFloatMatmul, jaxspec::FloatMatmulImpl,
    jaxspec::Bind().Arg<jaxspec::F32>().Arg<ffi::AnyBuffer>().Ret<jaxspec::F32>().Attr<int64_t>(
        "transpose_w"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxspecInt4Matmul, jaxspec::Int4MatmulImpl,
    jaxspec::Bind().Arg<jaxspec::F32>().Arg<ffi::Buffer<ffi::U8>>().Arg<ffi::AnyBuffer>()
        .Arg<ffi::AnyBuffer>().Ret<jaxspec::F32>().Attr<int64_t>("K").Attr<int64_t>("M")
        .Attr<int64_t>("group").Attr<int64_t>("has_offset"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxspecInt8Matmul, jaxspec::Int8MatmulImpl,
    jaxspec::Bind().Arg<jaxspec::F32>().Arg<ffi::Buffer<ffi::S8>>().Arg<ffi::AnyBuffer>()
        .Ret<jaxspec::F32>().Attr<int64_t>("group"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxspecAttention, jaxspec::AttentionImpl,
    jaxspec::Bind().Arg<jaxspec::F32>().Arg<jaxspec::F32>().Arg<jaxspec::F32>()
        .Arg<jaxspec::S32>().Ret<jaxspec::F32>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxspecAttentionCache, jaxspec::AttentionCacheImpl,
    jaxspec::Bind().Arg<jaxspec::F32>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
        .Arg<jaxspec::S32>().Arg<jaxspec::S32>().Ret<jaxspec::F32>().Attr<int64_t>("layer")
        .Attr<int64_t>("S").Attr<int64_t>("window"));

// One instruction set and one thread cap for every kernel (jaxspec.kernels).
// Codes: 0 scalar, 2 AVX2 (+FMA, F16C), 3 AVX-512 (F, DQ, BW, VL).
extern "C" int jaxspec_kernels_best_isa() { return jaxspec::g_best; }
extern "C" int jaxspec_kernels_isa() { return jaxspec::g_isa.load(); }

// Forces a path, only as far as this CPU has it; returns the path now in use.
extern "C" int jaxspec_kernels_set_isa(int isa) {
  const int best = jaxspec::g_best;
  jaxspec::g_isa.store(isa <= jaxspec::kScalar ? jaxspec::kScalar
                       : isa == jaxspec::kAvx2 ? std::min(best, int(jaxspec::kAvx2))
                                               : best);
  return jaxspec::g_isa.load();
}

// Caps the threads one call uses (the calling one included); 0 = the size of XLA's pool.
extern "C" int jaxspec_kernels_set_threads(int n) {
  jaxspec::g_max_threads.store(n < 0 ? 0 : n);
  return jaxspec::g_max_threads.load();
}

extern "C" int jaxspec_kernels_threads() { return jaxspec::g_max_threads.load(); }

// The machine's read bandwidth as the kernels see it: `gib` GiB (touched first) read front to
// back by `threads` threads (0: every CPU this process may run on), each its own contiguous
// part, with this ISA's streaming loop; the best of `repeats` passes, in bytes per second.
extern "C" double jaxspec_kernels_read_bandwidth(double gib, int threads, int repeats) {
  const int64_t n = static_cast<int64_t>(gib * (1 << 30) / sizeof(float)) / 1024 * 1024;
  if (n <= 0) return 0.0;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::unique_ptr<float[]> buf(new float[n]);
  for (int64_t i = 0; i < n; ++i) buf[i] = 1.0f;
  const jaxspec::KernelTable& table = jaxspec::Table();
  double best = 0.0;
  std::vector<float> sums(threads);
  for (int r = 0; r < std::max(repeats, 1); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const int64_t a = n / 1024 * t / threads * 1024, b = n / 1024 * (t + 1) / threads * 1024;
        sums[t] = table.stream_sum(buf.get() + a, b - a);
      });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, n * sizeof(float) / s);
  }
  return sums[0] > -1.0f ? best : 0.0;  // the sums are read, so the loop is never dropped
}
