#pragma once
#include "dpar/tensor/tensor.h"

namespace dpar::detail {

// The broadcast shape of a and b (NumPy rules); throws naming op and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// A stride-0 view of t expanded to shape (t must be broadcastable to it). Not recorded.
Tensor expand_to(const Tensor& t, const Shape& shape);
// Sums g over broadcast dims so the result has `shape` (the inverse of broadcasting).
Tensor sum_to_shape(const Tensor& g, const Shape& shape);

}  // namespace dpar::detail
