// The kernels in portable C++ (any CPU): the bodies over simd.h's emulated 8-lane vectors,
// whose every lane operation is the one the vector builds perform (std::fma for a fused
// multiply-add), so this build gives their bits.
#define JS_ISA 0
#define JS_NS isa_scalar
#include "isa.inc"
