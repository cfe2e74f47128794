// Shape inference for a given input shape (the planner's first step; also run at load time
// when the file fixes every dimension but the batch, so bad shapes fail early).
#include <algorithm>

#include "infer/graph.h"

namespace dpar::infer::detail {

namespace {

Shape broadcast(const Shape& a, const Shape& b, bool& ok) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  ok = true;
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    ok = ok && (x == y || x == 1 || y == 1);
    out[i] = std::max(x, y);
  }
  return out;
}

}  // namespace

Shapes infer_shapes(const Program& program, const Shape& input_dims) {
  Shapes out;
  out.dims.resize(program.value_names.size());
  out.dims[static_cast<size_t>(program.input)] = input_dims;
  for (size_t v = 0; v < out.dims.size(); ++v) {
    const Tensor& c = program.constants[v];
    // A 0-d constant is one value; oneDNN descriptors need at least one dimension.
    if (c.defined()) out.dims[v] = c.dim() == 0 ? Shape{1} : c.shape();
  }
  out.conv_pads.assign(program.ops.size(), {0, 0, 0, 0});
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const Op& op = program.ops[i];
    const std::string where = program.path + ": " + op.nodes[0];
    const Shape x = out.dims[static_cast<size_t>(op.src)];
    Shape y = x;
    switch (op.kind) {
      case OpKind::Conv: {
        const Shape& w = op.weight.shape();
        DPAR_CHECK(x.size() == 4, where, ": expected a 4-D input [N,C,H,W], got ", x);
        DPAR_CHECK(x[1] == w[1] * op.groups, where, ": input ", x, " has ", x[1],
                   " channels, weight ", w, " with group ", op.groups, " needs ", w[1] * op.groups);
        y = {x[0], w[0], 0, 0};
        for (size_t d = 0; d < 2; ++d) {
          const int64_t in = x[2 + d], s = op.stride[d];
          const int64_t k = (w[2 + d] - 1) * op.dilation[d] + 1;
          int64_t lo = op.pads[d], hi = op.pads[d + 2];
          if (op.auto_pad == "VALID") {
            lo = hi = 0;
          } else if (op.auto_pad != "NOTSET") {
            const int64_t total = std::max<int64_t>(0, ((in + s - 1) / s - 1) * s + k - in);
            lo = op.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
            hi = total - lo;
          }
          DPAR_CHECK(in + lo + hi >= k, where, ": input ", x, " is smaller than the kernel ", w);
          y[2 + d] = (in + lo + hi - k) / s + 1;
          out.conv_pads[i][d] = lo;
          out.conv_pads[i][d + 2] = hi;
        }
        break;
      }
      case OpKind::Gemm:
        DPAR_CHECK(x.size() == 2 && x[1] == op.weight.size(1), where, ": expected input [M,",
                   op.weight.size(1), "], got ", x);
        y = {x[0], op.weight.size(0)};
        break;
      case OpKind::Eltwise:
        break;
      case OpKind::Binary: {
        const Shape& b = out.dims[static_cast<size_t>(op.src2)];
        bool ok = false;
        y = broadcast(x, b, ok);
        DPAR_CHECK(ok, where, ": shapes ", x, " and ", b, " do not broadcast");
        DPAR_CHECK(y == x || y == b, where, ": broadcasting ", x, " with ", b, " gives ", y,
                   "; only one operand may be broadcast");
        break;
      }
      case OpKind::GlobalAvgPool:
        DPAR_CHECK(x.size() == 4, where, ": expected a 4-D input [N,C,H,W], got ", x);
        y = {x[0], x[1], 1, 1};
        break;
      case OpKind::Flatten: {
        const int64_t r = static_cast<int64_t>(x.size());
        const int64_t axis = op.axis < 0 ? op.axis + r : op.axis;
        DPAR_CHECK(axis >= 0 && axis <= r, where, ": axis ", op.axis, " is out of range for ", x);
        y = {1, 1};
        for (int64_t d = 0; d < r; ++d) y[d < axis ? 0 : 1] *= x[static_cast<size_t>(d)];
        break;
      }
      case OpKind::Softmax: {
        const int64_t r = static_cast<int64_t>(x.size());
        DPAR_CHECK(op.axis >= -r && op.axis < r, where, ": axis ", op.axis, " is out of range for ",
                   x);
        break;
      }
    }
    out.dims[static_cast<size_t>(op.dst)] = y;
  }
  return out;
}

}  // namespace dpar::infer::detail
