// The vector operations the kernel bodies are written in, one mapping per instruction set
// (as ggml-cpu's simd-mappings.h). Included by isa_*.cc inside that build's namespace, after
// its `#pragma GCC target` (<immintrin.h> is included at the file's top), with JS_ISA set to
// 0 (scalar), 2 (AVX2) or 3 (AVX-512).
//
//   V  : kW float lanes (16 on AVX-512, 8 on AVX2, 8 emulated lanes on the scalar build)
//   V8 : 8 float lanes (the 8-lane dots of NT and attention)
//
// Every lane operation is the correctly rounded IEEE one (Fma is one fused multiply-add), so
// the scalar build's emulated lanes give the vector builds' bits.

#if JS_ISA == 3 || JS_ISA == 2
#if JS_ISA == 3
constexpr int kW = 16;
using V = __m512;
#define JS_PS(op) _mm512_##op##_ps
#else
constexpr int kW = 8;
using V = __m256;
#define JS_PS(op) _mm256_##op##_ps
#endif
inline V Zero() { return JS_PS(setzero)(); }
inline V Load(const float* p) { return JS_PS(loadu)(p); }
inline void Store(float* p, V v) { JS_PS(storeu)(p, v); }
inline V Bcast(float f) { return JS_PS(set1)(f); }
inline V Fma(V a, V b, V c) { return JS_PS(fmadd)(a, b, c); }
inline V Sub(V a, V b) { return JS_PS(sub)(a, b); }
inline V Add(V a, V b) { return JS_PS(add)(a, b); }
inline V Mul(V a, V b) { return JS_PS(mul)(a, b); }
#undef JS_PS
inline void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
inline void PrefetchL2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }
#endif

#if JS_ISA == 3 || JS_ISA == 2
#if JS_ISA == 3
#define JS_EPI(op) _mm512_##op
#define JS_CAST(v) _mm512_castsi512_ps(v)
#define JS_HALF(p) _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))    // 32 bytes
#define JS_QUARTER(p) _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))   // 16 bytes
#else
#define JS_EPI(op) _mm256_##op
#define JS_CAST(v) _mm256_castsi256_ps(v)
#define JS_HALF(p) _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))      // 16 bytes
#define JS_QUARTER(p) _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))   // 8 bytes
#endif
// bf16 -> f32: the 16 bits above 16 zero bits; f16 -> f32 by F16C; int8 -> f32: all exact
inline V LoadBf16(const uint16_t* p) {
  return JS_CAST(JS_EPI(slli_epi32)(JS_EPI(cvtepu16_epi32)(JS_HALF(p)), 16));
}
inline V LoadF16(const uint16_t* p) { return JS_EPI(cvtph_ps)(JS_HALF(p)); }
inline V LoadI8(const int8_t* p) { return JS_EPI(cvtepi32_ps)(JS_EPI(cvtepi8_epi32)(JS_QUARTER(p))); }
#undef JS_EPI
#undef JS_CAST
#undef JS_HALF
#undef JS_QUARTER
#endif

#if JS_ISA == 3
// Columns [16 c, 16 c + 16) of an int4 tile row (32 bytes, see common.h): nibble 2c of the
// eight words, then nibble 2c + 1, as floats 0..15. u -> float(u) by a 16-entry table: the
// permute reads only each index's low 4 bits, so no mask and no conversion.
inline V Nibbles(const uint8_t* row, int c) {
  const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
  const __m512i sh = _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(8 * c),
                                             _mm512_set1_epi32(8 * c + 4));
  const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm512_permutexvar_ps(_mm512_srlv_epi32(v, sh), table);
}
#endif

#if JS_ISA == 2
// Columns [8 c, 8 c + 8) of an int4 tile row: nibble c of the eight words.
inline V Nibbles(const uint8_t* row, int c) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
  const __m256i u = _mm256_srl_epi32(v, _mm_cvtsi32_si128(4 * c));
  return _mm256_cvtepi32_ps(_mm256_and_si256(u, _mm256_set1_epi32(15)));
}
#endif

#if JS_ISA == 3 || JS_ISA == 2
using V8 = __m256;
inline V8 Zero8() { return _mm256_setzero_ps(); }
inline V8 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline V8 Load8Bf16(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline V8 Fma8(V8 a, V8 b, V8 c) { return _mm256_fmadd_ps(a, b, c); }
inline V8 Bcast8(float f) { return _mm256_set1_ps(f); }
inline void Store8(float* p, V8 v) { _mm256_storeu_ps(p, v); }
#endif

#if JS_ISA == 0
constexpr int kW = 8;
struct V {
  float l[8];
};
inline V Zero() { return V{}; }
inline V Load(const float* p) {
  V v;
  std::memcpy(v.l, p, sizeof(v.l));
  return v;
}
inline V LoadBf16(const uint16_t* p) {
  V v;
  for (int i = 0; i < 8; ++i) v.l[i] = Bf16ToF32(p[i]);
  return v;
}
inline V LoadF16(const uint16_t* p) {
  V v;
  for (int i = 0; i < 8; ++i) v.l[i] = F16ToF32(p[i]);
  return v;
}
inline V LoadI8(const int8_t* p) {
  V v;
  for (int i = 0; i < 8; ++i) v.l[i] = static_cast<float>(p[i]);
  return v;
}
inline void Store(float* p, const V& v) { std::memcpy(p, v.l, sizeof(v.l)); }
inline V Bcast(float f) {
  V v;
  for (float& x : v.l) x = f;
  return v;
}
inline V Fma(const V& a, const V& b, const V& c) {
  V v;
  for (int i = 0; i < 8; ++i) v.l[i] = std::fma(a.l[i], b.l[i], c.l[i]);
  return v;
}
inline V Sub(const V& a, const V& b) {
  V v;
  for (int i = 0; i < 8; ++i) v.l[i] = a.l[i] - b.l[i];
  return v;
}
inline V Add(const V& a, const V& b) {
  V v;
  for (int i = 0; i < 8; ++i) v.l[i] = a.l[i] + b.l[i];
  return v;
}
inline V Mul(const V& a, const V& b) {
  V v;
  for (int i = 0; i < 8; ++i) v.l[i] = a.l[i] * b.l[i];
  return v;
}
inline V Nibbles(const uint8_t* row, int c) {
  V v;
  for (int j = 0; j < 8; ++j) {
    uint32_t word;
    std::memcpy(&word, row + 4 * j, 4);
    v.l[j] = static_cast<float>((word >> (4 * c)) & 15u);
  }
  return v;
}
inline void Prefetch(const void*) {}
inline void PrefetchL2(const void*) {}
using V8 = V;
inline V8 Zero8() { return Zero(); }
inline V8 Load8(const float* p) { return Load(p); }
inline V8 Load8Bf16(const uint16_t* p) { return LoadBf16(p); }
inline V8 Fma8(const V8& a, const V8& b, const V8& c) { return Fma(a, b, c); }
inline V8 Bcast8(float f) { return Bcast(f); }
inline void Store8(float* p, const V8& v) { Store(p, v); }
#endif

// Values at index i of `base`, stored float32 or (B16) bfloat16, as float32 (exact): a weight
// matrix (body_float.inc) or a KV cache (body_attention.inc) stored either way.
template <bool B16>
inline V LoadAs(const void* base, int64_t i) {
  if constexpr (B16) return LoadBf16(static_cast<const uint16_t*>(base) + i);
  return Load(static_cast<const float*>(base) + i);
}

template <bool B16>
inline V8 Load8As(const void* base, int64_t i) {
  if constexpr (B16) return Load8Bf16(static_cast<const uint16_t*>(base) + i);
  return Load8(static_cast<const float*>(base) + i);
}

template <bool B16>
inline float ValueAs(const void* base, int64_t i) {
  if constexpr (B16) return Bf16ToF32(static_cast<const uint16_t*>(base)[i]);
  return static_cast<const float*>(base)[i];
}
