#pragma once
// Kernel slots for the ops that pick elements by index or by condition: where, comparisons,
// gather / scatter_add (index_select, embedding, nll_loss and the max/min backward use them)
// and max/min over a dim.
#include <cstdint>

#include "dpar/tensor/tensor.h"
#include "tensor/dispatch.h"

namespace dpar::kernels {

enum class CompareOp : uint8_t { eq, ne, lt, le, gt, ge };

// out (u8, 0 or 1) = a (op) b; a and b f32, already expanded to out's shape (stride 0 where
// broadcast). NaN compares unequal to everything, as in IEEE and PyTorch.
DPAR_KERNEL(compare, void(CompareOp op, const Tensor& a, const Tensor& b, Tensor& out));
// out = cond ? a : b; cond u8, a and b f32, all expanded to out's shape.
DPAR_KERNEL(where, void(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out));
// out[p] = x[p with coordinate `dim` replaced by index[p]]; index i64 with out's shape (an
// expanded view is fine), x f32 with out's shape except along dim. An index outside
// [0, x.size(dim)) is a dpar::Error on the CPU and a deferred error on CUDA ("<op>: index v is
// outside [0, n)"), op naming the caller.
DPAR_KERNEL(gather,
            void(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out, const char* op));
// self[p with coordinate `dim` replaced by index[p]] += src[p] for every p of src's shape;
// duplicates accumulate (in index order on the CPU, so the sum is deterministic there). Indices
// are those gather checked.
DPAR_KERNEL(scatter_add, void(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src));
// values (f32) and indices (i64), both x's shape with size 1 at dim: the largest (is_min: the
// smallest) entry of x along dim and its position, the first among equals; NaN wins, as in
// PyTorch.
DPAR_KERNEL(max_dim,
            void(const Tensor& x, int64_t dim, bool is_min, Tensor& values, Tensor& indices));

}  // namespace dpar::kernels
