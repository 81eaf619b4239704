// The kernels for x86-64 with AVX-512 (F, DQ, BW, VL), FMA and F16C. The whole file is
// compiled for that target; ffi.cc calls it only where the CPU has it.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Every header before the target pragma: their inline functions stay generic (an AVX-512
// copy must never be the one another file links to).
#include "common.h"
#include <immintrin.h>
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")
// GCC 12 warns that _mm512_undefined_* values are uninitialized (they are meant to be)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define JS_ISA 3
#define JS_NS isa_avx512
#include "isa.inc"
#endif
