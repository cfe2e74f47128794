#pragma once
// Elementwise reductions for the Gloo collectives, for every dtype dpar reduces (f32, f16,
// bf16, i64). Gloo ships no bf16 type and its float16 math is scalar, so dpar supplies its
// own functions: the 16-bit types are widened to f32, combined and rounded back (round to
// nearest even) at each step of the ring, as PyTorch's Gloo backend does.
#include <cstddef>

#include "dpar/core/dtype.h"
#include "dpar/distributed/process_group.h"

namespace dpar::dist::detail {

// out[i] = a[i] (op) b[i]; out may alias a or b. Avg reduces as Sum (see divide_in_place).
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

bool is_reducible(DType dtype);
// Throws a dpar::Error naming `what` (the collective) for a dtype that cannot be reduced.
ReduceFn reduce_function(DType dtype, ReduceOp op, const char* what);

// The Avg post-pass: data[i] /= divisor. Integers truncate toward zero (C++ division), so an
// i64 average of {1, 2} is 1 and of {-1, -2} is -1.
void divide_in_place(void* data, size_t n, DType dtype, int64_t divisor);

}  // namespace dpar::dist::detail
