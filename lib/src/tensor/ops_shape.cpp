// Joining and splitting along a dim (cat, stack, split, chunk) and broadcasting views (expand).
#include "dpar/autograd/function.h"
#include "dpar/autograd/grad_mode.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/broadcast.h"

namespace dpar {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  DPAR_PROFILE_SCOPE("cat");
  DPAR_CHECK(!tensors.empty(), "cat: expected at least one tensor");
  const Tensor& first = tensors[0];
  DPAR_CHECK(first.defined(), "cat: tensor 0 is undefined");
  DPAR_CHECK(first.dim() > 0, "cat: tensor 0 is 0-d; cat needs at least one dim");
  const int64_t d = normalize_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[static_cast<size_t>(d)] = 0;
  bool all_channels_last = first.dim() == 4;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    DPAR_CHECK(t.defined(), "cat: tensor ", i, " is undefined");
    DPAR_CHECK(t.dtype() == first.dtype() && t.device() == first.device(), "cat: tensor ", i,
               " is ", t.str(), " but tensor 0 is ", first.str());
    DPAR_CHECK(t.dim() == first.dim(), "cat: tensor ", i, " has shape ", t.shape(),
               ", tensor 0 has ", first.shape(), " (the same number of dims is needed)");
    for (int64_t k = 0; k < t.dim(); ++k) {
      DPAR_CHECK(k == d || t.size(k) == first.size(k), "cat: tensor ", i, " has shape ", t.shape(),
                 ", tensor 0 has ", first.shape(), ": they differ in dim ", k,
                 ", not only in the cat dim ", d);
    }
    shape[static_cast<size_t>(d)] += t.size(d);
    all_channels_last = all_channels_last && t.is_contiguous(MemoryFormat::ChannelsLast);
  }
  // Channels-last inputs (a CNN's activations) give a channels-last result.
  const MemoryFormat format =
      all_channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  Tensor out = Tensor::empty(shape, first.dtype(), first.device(), format);
  std::vector<int64_t> sizes;
  {
    NoGradGuard no_grad;
    int64_t offset = 0;
    for (const Tensor& t : tensors) {
      out.slice(d, offset, offset + t.size(d)).copy_(t);
      offset += t.size(d);
      sizes.push_back(t.size(d));
    }
  }
  if (is_floating(first.dtype()) && autograd::needs_grad(tensors)) {
    autograd::record("cat", tensors, {out},
                     [d, sizes](const autograd::GradList& g, const autograd::NeedsGrad& need) {
                       autograd::GradList grads(sizes.size());
                       int64_t offset = 0;
                       for (size_t i = 0; i < sizes.size(); ++i) {
                         if (need[i]) grads[i] = g[0].slice(d, offset, offset + sizes[i]);
                         offset += sizes[i];
                       }
                       return grads;
                     });
  }
  return out;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  DPAR_CHECK(x.defined(), "expand: input is undefined");
  DPAR_CHECK(shape.size() >= static_cast<size_t>(x.dim()), "expand: ", x.shape(),
             " has more dims than the target ", shape);
  Shape target = shape;
  const size_t lead = shape.size() - static_cast<size_t>(x.dim());
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t have = i < lead ? 1 : x.shape()[i - lead];
    if (target[i] == -1) {
      DPAR_CHECK(i >= lead, "expand: -1 is not allowed for the new leading dim ", i);
      target[i] = have;
    }
    DPAR_CHECK(have == target[i] || have == 1, "expand: ", x.shape(), " cannot be expanded to ",
               shape, " (dim ", i, " has size ", have, ")");
  }
  Tensor out = detail::expand_to(x, target);
  if (is_floating(x.dtype()) && autograd::needs_grad({x})) {
    autograd::record(
        "expand", {x}, {out},
        [in_shape = x.shape()](const autograd::GradList& g, const autograd::NeedsGrad&) {
          return autograd::GradList{detail::sum_to_shape(g[0], in_shape)};
        });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  DPAR_CHECK(!tensors.empty(), "stack: expected at least one tensor");
  DPAR_CHECK(tensors[0].defined(), "stack: tensor 0 is undefined");
  // The new dim may be one past the last (dim == rank), as in torch.stack.
  const int64_t d = normalize_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    DPAR_CHECK(tensors[i].defined() && tensors[i].shape() == tensors[0].shape(), "stack: tensor ",
               i, " has shape ", tensors[i].defined() ? tensors[i].shape() : Shape{},
               ", tensor 0 has ", tensors[0].shape(), " (stack needs equal shapes)");
    parts.push_back(tensors[i].unsqueeze(d));
  }
  return cat(parts, d);
}

namespace {

// The pieces of x along d as views recorded by ONE node, whose backward concatenates the
// pieces' gradients (zeros for a piece nothing used): separate slice nodes would each
// scatter into a zero tensor of x's full size and autograd would then add those up (an
// attention layer's q, k, v split of its packed projection paid three such passes).
std::vector<Tensor> split_views(const Tensor& x, const std::vector<int64_t>& sizes, int64_t d) {
  std::vector<Tensor> parts;
  {
    NoGradGuard no_grad;
    int64_t start = 0;
    for (int64_t size : sizes) {
      parts.push_back(x.slice(d, start, start + size));
      start += size;
    }
  }
  if (is_floating(x.dtype()) && autograd::needs_grad({x})) {
    autograd::record("split", {x}, parts,
                     [d](const autograd::GradList& g, const autograd::NeedsGrad&) {
                       return autograd::GradList{g.size() == 1 ? g[0] : cat(g, d)};
                     });
  }
  return parts;
}

}  // namespace

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  DPAR_CHECK(x.defined(), "split: input is undefined");
  DPAR_CHECK(split_size > 0, "split: split_size must be positive, got ", split_size);
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  if (x.size(d) == 0) return {x};  // an empty dim: one empty part, as torch.split
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < x.size(d); start += split_size) {
    sizes.push_back(std::min(split_size, x.size(d) - start));
  }
  return split_views(x, sizes, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  DPAR_CHECK(x.defined(), "split: input is undefined");
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    DPAR_CHECK(s >= 0, "split: sizes must be non-negative, got ", s);
    total += s;
  }
  DPAR_CHECK(total == x.size(d), "split: sizes sum to ", total, " but dim ", d, " of ", x.shape(),
             " has ", x.size(d));
  return split_views(x, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  DPAR_CHECK(x.defined(), "chunk: input is undefined");
  DPAR_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  const int64_t d = normalize_dim(dim, x.dim(), "chunk");
  // torch.chunk: pieces of ceil(n / chunks), so there may be fewer than `chunks`.
  return split(x, std::max<int64_t>(1, (x.size(d) + chunks - 1) / chunks), d);
}

}  // namespace dpar
