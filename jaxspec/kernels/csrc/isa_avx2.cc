// The kernels for x86-64 with AVX2, FMA and F16C. The whole file is compiled for that target;
// ffi.cc calls it only where the CPU has it.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Every header before the target pragma: their inline functions stay generic (an AVX-512
// copy must never be the one another file links to).
#include "common.h"
#include <immintrin.h>
#pragma GCC target("avx2,fma,f16c")
#define JS_ISA 2
#define JS_NS isa_avx2
#include "isa.inc"
#endif
