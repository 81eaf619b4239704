// The kernels in portable C++ (any CPU): the bodies over simd.h's emulated 8-lane vectors,
// whose every lane operation is the one the vector builds perform (std::fma for a fused
// multiply-add), so this build gives their bits.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"

#define JS_ISA 0

namespace jaxspec {
namespace isa_scalar {

#include "simd.h"

constexpr int kNnRows = 4, kNnVecs = 2;
constexpr int kSweepRows = 2;
constexpr int kNtRows = 1;
constexpr int kInt4Cols[7] = {0, 8, 8, 8, 8, 8, 8};

#include "body_attention.inc"
#include "body_float.inc"
#include "body_int4.inc"

const KernelTable kTable = {kScalar, &FloatNN, &FloatNT, &Int4Tiles, &AttentionQuery, &StreamSum};

}  // namespace isa_scalar
}  // namespace jaxspec
