#pragma once
// Differentiable tensor operations (free functions in namespace dpar). Every op checks its
// arguments and throws dpar::Error naming the op and the offending shapes; every op has a
// finite-difference gradient test and a PyTorch parity test (tests/unit, tests/parity).
#include <cstdint>
#include <optional>
#include <vector>

#include "dpar/core/random.h"
#include "dpar/tensor/tensor.h"

namespace dpar {

// ---- elementwise, with NumPy/PyTorch broadcasting -------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor erf(const Tensor& x);  // the error function (absolute error ~1e-7 on the CPU)
// Elementwise min(max(x, min), max); either bound may be left out. The gradient passes where
// min <= x <= max (PyTorch's convention at the bounds).
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max = {});
Tensor pow(const Tensor& x, double exponent);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return add(a, -b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator-(const Tensor& x) { return neg(x); }

// ---- activations ----------------------------------------------------------------------------
Tensor relu(const Tensor& x);
Tensor hardswish(const Tensor& x);    // x * relu6(x + 3) / 6
Tensor hardsigmoid(const Tensor& x);  // relu6(x + 3) / 6
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
// GELU: x * Phi(x) with the normal CDF (none, PyTorch's default), or its tanh approximation.
enum class GeluApproximation : uint8_t { none, tanh };
Tensor gelu(const Tensor& x, GeluApproximation approximate = GeluApproximation::none);
Tensor silu(const Tensor& x);  // x * sigmoid(x)
// log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (PyTorch's defaults).
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
// Inverted dropout: zeroes with probability p and scales survivors by 1/(1-p) when training.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());

// ---- reductions -----------------------------------------------------------------------------
Tensor sum(const Tensor& x);  // all elements -> one-element tensor of shape []
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim);  // i64, not differentiable
// Indices (i64, [N,k]) of the k largest entries of each row of a 2-D tensor, largest first.
Tensor topk_indices(const Tensor& x, int64_t k);

// ---- joining and splitting ------------------------------------------------------------------
// Concatenation along an existing dim (shapes equal elsewhere; same dtype and device);
// channels-last inputs give a channels-last result. Differentiable for float dtypes.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// A broadcasting view of x with `shape` (size-1 dims repeated with stride 0, -1 keeps a dim,
// new leading dims allowed), as torch's expand; its gradient sums over the repeats. Do not
// write through it.
Tensor expand(const Tensor& x, const Shape& shape);
// Joins equal shapes along a new dim (0..rank).
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Views of consecutive pieces along dim: of split_size each (the last may be shorter), of the
// given sizes (summing to the dim), or `chunks` pieces of ceil(n / chunks) (torch.chunk).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// ---- comparisons, selection and indexing -----------------------------------------------------
// Elementwise comparisons with broadcasting: u8 tensors of 0 and 1 (PyTorch's bool); NaN
// compares unequal to everything. Not differentiable.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);
// cond ? a : b elementwise, all three broadcast together; cond is u8 (a comparison's result).
// Gradients flow to the chosen side only.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, double b);
// x with `value` where mask (u8, broadcast to x) is 1, e.g. -inf over masked attention scores.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// out[i][j][k] = x[i][index[i][j][k]][k] for dim 1 (torch.gather); index i64 of x's rank,
// no larger than x outside dim. An out-of-range index is an error naming it.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// The entries of x at the 1-D i64 `index` along dim (torch.index_select); repeats allowed.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// Rows of weight [num_embeddings, D] at indices (i64, any shape) -> indices.shape + [D]. The
// padding_idx row (negative counts from the end) gets no gradient, as in torch's Embedding.
Tensor embedding(const Tensor& weight, const Tensor& indices,
                 std::optional<int64_t> padding_idx = std::nullopt);
// Largest (smallest) values along dim and their positions (i64, the first among equals; NaN
// counts as the largest), as torch.max(x, dim). The gradient goes to those positions.
struct MaxResult {
  Tensor values;
  Tensor indices;
};
MaxResult max(const Tensor& x, int64_t dim, bool keepdim = false);
MaxResult min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // over all elements: a 0-d tensor
Tensor min(const Tensor& x);

// ---- linear algebra -------------------------------------------------------------------------
// torch.matmul: [M,K] x [K,N]; [..., M, K] x [..., K, N] with the batch dims broadcast (a
// 2-D second operand folds the first one's batch into M: one product); a 1-D operand is a row
// or column vector whose dim is dropped from the result.
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x W^T + b; x [..., in] (any leading dims), weight [out,in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// linear(x, weight, bias) + residual (the output's shape) as one op with the same results: the
// residual is added as the product writes each tile (CPU), instead of a pass of its own. For
// residual connections, as in x + attention(x) (MultiheadAttention::forward_add) or
// x + mlp(x) (Sequential::forward_add).
Tensor linear_add(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& residual);

// ---- convolution and normalisation (oneDNN on CPU) -------------------------------------------
struct Conv2dOptions {
  std::vector<int64_t> stride{1, 1};
  std::vector<int64_t> padding{0, 0};
  std::vector<int64_t> dilation{1, 1};
  int64_t groups = 1;
};
// x [N,C,H,W] (any layout, channels-last preferred), weight [O,C/groups,kH,kW], bias [O] or
// undefined. Output is channels-last.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
              const Conv2dOptions& options = {});

// x [N,C,H,W], or [N,C] / [N,C,L] (BatchNorm1d). Training: normalises with batch statistics
// and updates running stats in place
// (running = (1-momentum)*running + momentum*batch, unbiased variance, PyTorch convention).
// Eval: uses the running statistics. weight/bias may be undefined (affine=false).
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor running_mean,
                  Tensor running_var, bool training, double momentum, double eps);
// batch_norm followed by an activation, as one op with the same results: it keeps only the
// normalised y for its backward (the activation's input) and forms the activation's gradient
// inside the batch-norm backward, saving a pass over the activation. nn::Sequential uses it
// for a BatchNorm2d followed by ReLU or Hardswish.
enum class Activation : uint8_t { none, relu, hardswish };
Tensor batch_norm_act(const Tensor& x, const Tensor& weight, const Tensor& bias,
                      Tensor running_mean, Tensor running_var, bool training, double momentum,
                      double eps, Activation act);

// Normalises over the last dims (normalized_shape) of x with the biased variance, then
// weight * x_hat + bias (each [normalized_shape] or undefined), as torch's layer_norm.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
// x [N,C,...]: each sample's channels in num_groups groups, normalised per (sample, group),
// then weight[c] * x_hat + bias[c] (each [C] or undefined), as torch's group_norm.
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);

Tensor global_avg_pool2d(const Tensor& x);  // [N,C,H,W] -> [N,C,1,1]
// Pooling over k x k windows of x [N,C,H,W], as torch's max_pool2d / avg_pool2d: sizes are
// {k} or {kH, kW}; the stride defaults to the kernel size; padding at most half the kernel;
// ceil_mode rounds the output size up (a window must still start inside the input or the
// left padding). Max ignores padding (NaN wins); the average divides by the window size
// including padding unless count_include_pad is false. The output keeps x's layout
// (channels-last stays channels-last).
Tensor max_pool2d(const Tensor& x, const std::vector<int64_t>& kernel_size,
                  const std::vector<int64_t>& stride = {},
                  const std::vector<int64_t>& padding = {0}, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& x, const std::vector<int64_t>& kernel_size,
                  const std::vector<int64_t>& stride = {},
                  const std::vector<int64_t>& padding = {0}, bool ceil_mode = false,
                  bool count_include_pad = true);
// Average over torch's adaptive windows to an output_size ({n} or {h, w}) grid.
Tensor adaptive_avg_pool2d(const Tensor& x, const std::vector<int64_t>& output_size);

// ---- classification -------------------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// Mean cross-entropy of logits [N,K] against class indices (i64 [N]), with label smoothing
// as in torch.nn.functional.cross_entropy.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0.0);
// The same with rows whose target is ignore_index left out (the mean runs over the others),
// as torch's ignore_index (e.g. padding tokens).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing,
                     std::optional<int64_t> ignore_index);

// ---- losses ---------------------------------------------------------------------------------
enum class Reduction : uint8_t { mean, sum, none };
// -log_probs[i, target[i]] over rows i of [N,C] (log_softmax's output), rows with target ==
// ignore_index left out of the loss and of the mean.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target,
                std::optional<int64_t> ignore_index = std::nullopt,
                Reduction reduction = Reduction::mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);
// Binary cross-entropy of sigmoid(logits) against targets in [0, 1], computed stably from
// the logits (torch's binary_cross_entropy_with_logits).
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction = Reduction::mean);

// ---- attention ------------------------------------------------------------------------------
// torch's scaled_dot_product_attention: softmax(q k^T * scale + mask) v over query [..., Lq, E],
// key [..., Lk, E], value [..., Lk, Ev] (the same leading batch/head dims). attn_mask
// broadcasts to [..., Lq, Lk]: u8 keeps the 1 positions (torch's True), f32 is added;
// is_causal lets query i see keys j <= i; scale defaults to 1/sqrt(E). dropout_p > 0 drops
// attention weights (pass 0 in eval, as torch's modules do). On the CPU one fused kernel
// computes each (batch, head) slice while it is in cache (two small products around a row
// softmax, keeping the softmax for the backward); elsewhere the same maths runs as an op chain.
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = {}, double dropout_p = 0.0,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt,
                                    Generator& gen = default_generator());
// Self-attention from one packed projection, as MultiheadAttention runs it: qkv [N, L, 3E]
// holds q, k and v side by side (each E = num_heads * D wide, heads outermost within each), the
// result is [N, L, E] with the heads concatenated - scaled_dot_product_attention on the heads
// of q, k, v, transposed back and merged. On the CPU the fused kernel reads the heads straight
// out of qkv and writes the merged result and the packed gradient, so no head is copied;
// attn_mask broadcasts to [N, num_heads, L, L].
Tensor packed_self_attention(const Tensor& qkv, int64_t num_heads, const Tensor& attn_mask = {},
                             double dropout_p = 0.0, bool is_causal = false,
                             Generator& gen = default_generator());

// ---- in-place updates, not recorded (optimizers, init) ---------------------------------------
Tensor& add_(Tensor& self, const Tensor& other, double alpha = 1.0);  // self += alpha * other
Tensor& mul_(Tensor& self, double value);

}  // namespace dpar
