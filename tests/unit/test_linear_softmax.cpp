// matmul / linear, softmax / log_softmax, cross-entropy, argmax and top-k: values against
// hand-computed numbers, gradients against finite differences, layouts and errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "gradcheck.h"

using namespace dpar;
using dpar::testing::gradcheck;
using dpar::testing::random_tensor;

namespace {

void check_close(const std::vector<float>& got, const std::vector<float>& want, double tol = 1e-5) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << " want " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= tol * std::max(1.0, std::abs(double(want[i]))));
  }
}

// Reference product in double, logical (row-major) order.
std::vector<float> naive_matmul(const Tensor& a, const Tensor& b) {
  const auto av = a.to_float_vector(), bv = b.to_float_vector();
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  std::vector<float> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += double(av[i * k + l]) * bv[l * n + j];
      c[i * n + j] = static_cast<float>(s);
    }
  }
  return c;
}

// Column sums of a 2-D tensor in double: a bias gradient's reference.
std::vector<float> naive_column_sums(const Tensor& g) {
  const auto gv = g.to_float_vector();
  const int64_t rows = g.size(0), cols = g.size(1);
  std::vector<float> sums(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    double s = 0;
    for (int64_t i = 0; i < rows; ++i) s += gv[static_cast<size_t>(i * cols + j)];
    sums[static_cast<size_t>(j)] = static_cast<float>(s);
  }
  return sums;
}

}  // namespace

TEST_CASE("matmul values and strided operands", "[linear]") {
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector(std::vector<float>{1, 0, -1, 2, 0.5, 1}, {3, 2});
  // [1 2 3; 4 5 6] x [1 0; -1 2; 0.5 1]
  CHECK(matmul(a, b).to_float_vector() == std::vector<float>{0.5, 7, 2, 16});

  Generator gen(21);
  Tensor x = random_tensor({37, 61}, gen), y = random_tensor({61, 29}, gen);
  const auto want = naive_matmul(x, y);
  check_close(matmul(x, y).to_float_vector(), want, 1e-4);
  // Transposed views (column-major) and sliced rows (leading dimension > width).
  Tensor xt = x.transpose(0, 1).contiguous().transpose(0, 1);
  Tensor yt = y.transpose(0, 1).contiguous().transpose(0, 1);
  check_close(matmul(xt, yt).to_float_vector(), want, 1e-4);
  Tensor wide = random_tensor({37, 80}, gen);
  Tensor xs = wide.slice(1, 5, 66);
  check_close(matmul(xs, y).to_float_vector(), naive_matmul(xs.contiguous(), y), 1e-4);
  // Every-other-column slice: neither row- nor column-major, copied internally.
  Tensor xe = random_tensor({37, 122}, gen).slice(1, 0, 122, 2);
  check_close(matmul(xe, y).to_float_vector(), naive_matmul(xe.contiguous(), y), 1e-4);
  // Vectors as matrices and an empty inner dimension.
  check_close(matmul(x.slice(0, 3, 4), y).to_float_vector(),
              naive_matmul(x.slice(0, 3, 4).contiguous(), y), 1e-4);
  CHECK(matmul(Tensor::ones({2, 0}), Tensor::ones({0, 3})).to_float_vector() ==
        std::vector<float>(6, 0.f));
}

TEST_CASE("matmul is deterministic", "[linear]") {
  Generator gen(22);
  Tensor x = random_tensor({256, 512}, gen), y = random_tensor({512, 300}, gen);
  CHECK(matmul(x, y).to_float_vector() == matmul(x, y).to_float_vector());
}

TEST_CASE("linear values", "[linear]") {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w = Tensor::from_vector(std::vector<float>{1, 0, 1, 0, 1, 0}, {2, 3});
  Tensor b = Tensor::from_vector(std::vector<float>{0.5, -1}, {2});
  CHECK(linear(x, w, b).to_float_vector() == std::vector<float>{4.5, 1, 10.5, 4});
  CHECK(linear(x, w).to_float_vector() == std::vector<float>{4, 2, 10, 5});
}

TEST_CASE("linear with a bias on a large batch: values, bias gradient, any thread count",
          "[linear]") {
  Generator gen(24);
  // Rows over several of the column-sum blocks, an input seen through a transposed view.
  const Tensor xt = random_tensor({37, 700}, gen);
  const Tensor x = xt.transpose(0, 1);
  const Tensor w = random_tensor({19, 37}, gen), bias = random_tensor({19}, gen);
  std::vector<float> want = naive_matmul(x.contiguous(), w.transpose(0, 1).contiguous());
  const auto bv = bias.to_float_vector();
  for (size_t i = 0; i < want.size(); ++i) want[i] += bv[i % 19];
  check_close(linear(x, w, bias).to_float_vector(), want, 1e-4);

  // d(sum(linear * g)) / d bias = column sums of g, the same bits with 1 or 2 threads.
  const Tensor g = random_tensor({700, 19}, gen);
  const int threads_before = get_num_threads();
  auto bias_grad = [&](int threads) {
    set_num_threads(threads);
    Tensor b = bias.detach().set_requires_grad();
    sum(mul(linear(x, w, b), g)).backward();
    set_num_threads(threads_before);
    return b.grad().to_float_vector();
  };
  const auto one = bias_grad(1);
  check_close(one, naive_column_sums(g), 1e-6);
  CHECK(bias_grad(2) == one);
}

TEST_CASE("linear's backward in row blocks: dX and the bias gradient, any thread count",
          "[linear]") {
  // A wide weight (dX = G W through sgemm), so dX is computed 256 rows per thread at a time
  // and the bias gradient summed from each block of G as the product reads it: rows over
  // several blocks and a short last one, with 1 and 2 threads.
  Generator gen(26);
  const Tensor x = random_tensor({1100, 64}, gen), w = random_tensor({24, 64}, gen);
  const Tensor bias = random_tensor({24}, gen), g = random_tensor({1100, 24}, gen);
  const std::vector<float> want_dx = naive_matmul(g, w);
  const std::vector<float> want_db = naive_column_sums(g);
  const int threads_before = get_num_threads();
  auto grads = [&](int threads) {
    set_num_threads(threads);
    Tensor xi = x.detach().set_requires_grad(), b = bias.detach().set_requires_grad();
    sum(mul(linear(xi, w, b), g)).backward();
    set_num_threads(threads_before);
    return std::make_pair(xi.grad().to_float_vector(), b.grad().to_float_vector());
  };
  const auto [dx1, db1] = grads(1);
  check_close(dx1, want_dx, 1e-4);
  check_close(db1, want_db, 1e-6);
  const auto [dx2, db2] = grads(2);
  check_close(dx2, want_dx, 1e-4);
  CHECK(db2 == db1);  // the same fixed blocks of rows, whatever the thread count
  // Without an input gradient the bias gradient comes from sum_to: the same bits.
  Tensor b = bias.detach().set_requires_grad();
  sum(mul(linear(x, w, b), g)).backward();
  CHECK(b.grad().to_float_vector() == db1);
  // An empty batch: an empty dX and a zero bias gradient.
  Tensor empty_x = Tensor::zeros({0, 64}).set_requires_grad(), empty_b = bias.detach();
  empty_b.set_requires_grad();
  sum(linear(empty_x, w, empty_b)).backward();
  CHECK(empty_x.grad().shape() == Shape{0, 64});
  CHECK(empty_b.grad().to_float_vector() == std::vector<float>(24, 0.f));
}

TEST_CASE("the weight gradient over a long batch, tall or wide, against a double product",
          "[linear]") {
  // dW = G^T X summed over many rows: a tall gradient (more outputs than inputs) goes through
  // oneDNN's matmul primitive, a wide one through sgemm; both against the product in double,
  // and the same bits on a second run.
  Generator gen(27);
  for (const auto& [out, in] : {std::pair<int64_t, int64_t>{40, 16}, {16, 40}}) {
    INFO("weight [" << out << ", " << in << "]");
    const Tensor x = random_tensor({1100, in}, gen), g = random_tensor({1100, out}, gen);
    const std::vector<float> want = naive_matmul(g.transpose(0, 1).contiguous(), x);
    auto weight_grad = [&] {
      Tensor w = random_tensor({out, in}, gen).set_requires_grad();
      sum(mul(linear(x, w), g)).backward();
      return w.grad().to_float_vector();
    };
    const auto first = weight_grad();
    check_close(first, want, 1e-4);
    CHECK(weight_grad() == first);
  }
}

TEST_CASE("linear's backward where only a few rows of the gradient are nonzero", "[linear]") {
  // A classifier that reads one token of a sequence (ViT's class token) leaves every other
  // row of the last layers' gradients exactly zero: only the nonzero rows enter the products.
  // Rows 3, 500 (its last element only) and 1099 are nonzero; row 7 holds -0.0, which counts
  // as zero. The input is a transposed view, so its rows are gathered with a stride.
  Generator gen(28);
  const Tensor x = random_tensor({40, 1100}, gen).transpose(0, 1);
  const Tensor w = random_tensor({24, 40}, gen), bias = random_tensor({24}, gen);
  std::vector<float> gv(1100 * 24, 0.f);
  const std::vector<float> dense = random_tensor({3, 24}, gen).to_float_vector();
  std::copy_n(dense.begin(), 24, gv.begin() + 3 * 24);
  gv[500 * 24 + 23] = dense[24];
  std::copy_n(dense.begin() + 48, 24, gv.begin() + 1099 * 24);
  for (int64_t j = 0; j < 24; ++j) gv[7 * 24 + j] = -0.f;
  const Tensor g = Tensor::from_vector(gv, {1100, 24});
  Tensor xg = x.detach().set_requires_grad(), wg = w.detach().set_requires_grad();
  Tensor bg = bias.detach().set_requires_grad();
  sum(mul(linear(xg, wg, bg), g)).backward();
  check_close(xg.grad().to_float_vector(), naive_matmul(g, w), 1e-5);
  check_close(wg.grad().to_float_vector(),
              naive_matmul(g.transpose(0, 1).contiguous(), x.contiguous()), 1e-5);
  check_close(bg.grad().to_float_vector(), naive_column_sums(g), 1e-6);
  const std::vector<float> dx = xg.grad().to_float_vector();
  for (const int64_t row : {0, 7, 501, 1098}) {
    INFO("dX row " << row);
    CHECK(std::all_of(dx.begin() + row * 40, dx.begin() + (row + 1) * 40,
                      [](float v) { return v == 0.f; }));
  }
  // A gradient with no nonzero row at all (a zero-initialised head's first step): zeros.
  Tensor xz = x.detach().set_requires_grad(), wz = w.detach().set_requires_grad();
  Tensor bz = bias.detach().set_requires_grad();
  sum(mul(linear(xz, wz, bz), Tensor::zeros({1100, 24}))).backward();
  for (const Tensor& grad : {xz.grad(), wz.grad(), bz.grad()}) {
    const std::vector<float> values = grad.to_float_vector();
    CHECK(std::all_of(values.begin(), values.end(), [](float v) { return v == 0.f; }));
  }
  // Finite differences through a head that reads two of six rows, with and without a bias.
  Tensor x6 = random_tensor({6, 5}, gen).set_requires_grad();
  Tensor w6 = random_tensor({4, 5}, gen).set_requires_grad();
  Tensor b6 = random_tensor({4}, gen).set_requires_grad();
  gradcheck(
      [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]).slice(0, 1, 3); },
      {x6, w6, b6});
  gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1]).slice(0, 4, 5); },
            {x6, w6});
}

TEST_CASE("linear on a tall input: weights in oneDNN's blocked layout, forward and dX",
          "[linear]") {
  // Many rows against small weights: the products whose weights are reordered into the
  // matmul's blocked layout first (forward with and without bias; dX = G W, narrow and wide).
  Generator gen(25);
  const Tensor x = random_tensor({1200, 48}, gen);
  for (const int64_t out : {20, 144}) {
    INFO("weight [" << out << ", 48]");
    const Tensor w = random_tensor({out, 48}, gen), bias = random_tensor({out}, gen);
    const Tensor wt = w.transpose(0, 1).contiguous();
    std::vector<float> want = naive_matmul(x, wt);
    check_close(linear(x, w).to_float_vector(), want, 1e-4);
    const auto bv = bias.to_float_vector();
    for (size_t i = 0; i < want.size(); ++i) want[i] += bv[i % static_cast<size_t>(out)];
    check_close(linear(x, w, bias).to_float_vector(), want, 1e-4);
    CHECK(linear(x, w, bias).to_float_vector() == linear(x, w, bias).to_float_vector());

    // dX = G W: [1200, out] x [out, 48] (out = 20: a wide W, which sgemm takes as it is).
    const Tensor g = random_tensor({1200, out}, gen);
    Tensor xg = x.detach().set_requires_grad();
    sum(mul(linear(xg, w, bias), g)).backward();
    check_close(xg.grad().to_float_vector(), naive_matmul(g, w), 1e-4);
  }
}

TEST_CASE("matmul and linear gradients", "[linear][gradcheck]") {
  Generator gen(23);
  Tensor a = random_tensor({3, 4}, gen).set_requires_grad();
  Tensor b = random_tensor({4, 5}, gen).set_requires_grad();
  gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {a, b});
  // Through transposed views: gradients flow back through the view.
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return matmul(in[1].transpose(0, 1), in[0].transpose(0, 1));
      },
      {a, b});

  Tensor x = random_tensor({6, 5}, gen).set_requires_grad();
  Tensor w = random_tensor({4, 5}, gen).set_requires_grad();
  Tensor bias = random_tensor({4}, gen).set_requires_grad();
  gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
            {x, w, bias});
  gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); }, {x, w});
  // A single-sample batch and a strided bias.
  Tensor x1 = random_tensor({1, 5}, gen).set_requires_grad();
  Tensor b2 = random_tensor({8}, gen).set_requires_grad();
  gradcheck(
      [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2].slice(0, 0, 8, 2)); },
      {x1, w, b2});
}

TEST_CASE("linear and matmul argument errors", "[linear][errors]") {
  Tensor a = Tensor::ones({2, 3});
  CHECK_THROWS_WITH(matmul(a, Tensor::ones({4, 2})),
                    Catch::Contains("matmul: inner dimensions differ: [2,3] x [4,2]"));
  // N-d operands broadcast their batch dims (tests/unit/test_shape_ops.cpp); the inner
  // dimensions must still agree.
  CHECK_THROWS_WITH(matmul(Tensor::ones({2, 3, 1}), a), Catch::Contains("inner dimensions differ"));
  CHECK_THROWS_WITH(matmul(a, Tensor::ones({3, 2}, DType::i64)),
                    Catch::Contains("matmul: operands must be f32"));
  CHECK_THROWS_WITH(linear(a, Tensor::ones({4, 5})),
                    Catch::Contains("linear: input [2,3] has 3 features but weight [4,5]"));
  CHECK_THROWS_WITH(linear(a, Tensor::ones({4, 3}), Tensor::ones({3})),
                    Catch::Contains("linear: bias shape [3] does not match weight [4,3]"));
  // Leading dims are batch dims, and a 1-D input is one sample (torch's rules).
  CHECK(linear(Tensor::ones({3}), Tensor::ones({4, 3})).shape() == Shape{4});
  CHECK_THROWS_WITH(linear(Tensor::ones({2, 5}), Tensor::ones({4, 3})),
                    Catch::Contains("has 5 features but weight [4,3]"));
}

TEST_CASE("softmax and log_softmax values", "[softmax]") {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 1000, 1001, 1002}, {2, 3});
  const std::vector<float> p{0.0900305732f, 0.244728471f, 0.665240956f};
  std::vector<float> want = p;
  want.insert(want.end(), p.begin(), p.end());
  check_close(softmax(x, 1).to_float_vector(), want);  // large logits stay finite
  std::vector<float> lwant;
  for (float v : want) lwant.push_back(std::log(v));
  check_close(log_softmax(x, -1).to_float_vector(), lwant);
  // Along dim 0: each column is a pair (a, a + 999).
  const auto s0 = softmax(x, 0).to_float_vector();
  for (size_t j = 0; j < 3; ++j) {
    CHECK(s0[j] < 1e-30f);
    CHECK(s0[3 + j] == Approx(1.0f));
  }
}

TEST_CASE("softmax on any dim and layout", "[softmax]") {
  Generator gen(31);
  Tensor x = random_tensor({2, 5, 3, 4}, gen, -3, 3, MemoryFormat::ChannelsLast);
  Tensor xc = x.contiguous();
  for (int64_t dim : {0, 1, 2, 3, -1}) {
    INFO("dim " << dim);
    Tensor y = softmax(x, dim);
    CHECK(y.is_contiguous(MemoryFormat::ChannelsLast));
    check_close(y.to_float_vector(), softmax(xc, dim).to_float_vector(), 1e-6);
    check_close(log_softmax(x, dim).to_float_vector(), log_softmax(xc, dim).to_float_vector(),
                1e-6);
    // Probabilities along dim sum to one.
    const auto total = sum(y, {dim}).to_float_vector();
    for (float t : total) CHECK(t == Approx(1.0f).epsilon(1e-5));
  }
  // Non-dense input (strided view).
  Tensor v = xc.slice(3, 0, 4, 2);
  check_close(softmax(v, 1).to_float_vector(), softmax(v.contiguous(), 1).to_float_vector(), 1e-6);
  // Large enough for the parallel path; blocks of lines give the same numbers as one row.
  Tensor big = random_tensor({64, 2000}, gen, -5, 5);
  Tensor bigt = big.transpose(0, 1).contiguous();
  check_close(softmax(big, 1).to_float_vector(),
              softmax(bigt, 0).transpose(0, 1).contiguous().to_float_vector(), 1e-6);
}

TEST_CASE("softmax gradients", "[softmax][gradcheck]") {
  Generator gen(32);
  Tensor x2 = random_tensor({3, 5}, gen, -2, 2).set_requires_grad();
  Tensor x4 =
      random_tensor({2, 3, 2, 3}, gen, -2, 2, MemoryFormat::ChannelsLast).set_requires_grad();
  for (int64_t dim : {0, 1}) {
    gradcheck([dim](const std::vector<Tensor>& in) { return softmax(in[0], dim); }, {x2});
    gradcheck([dim](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); }, {x2});
  }
  for (int64_t dim : {1, 3}) {
    gradcheck([dim](const std::vector<Tensor>& in) { return softmax(in[0], dim); }, {x4});
    gradcheck([dim](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); }, {x4});
  }
  // The incoming gradient has another layout than the output (transposed consumer).
  gradcheck([](const std::vector<Tensor>& in) { return softmax(in[0], 1).transpose(0, 1); }, {x2});
}

TEST_CASE("cross_entropy matches hand-computed values", "[softmax][loss]") {
  // Rows [1,2,3] -> target 2 and [1,0,-1] -> target 0: both have log-sum-exp minus the target
  // logit = log(1 + e^-1 + e^-2) = 0.40760596, and lse - mean(z) = 1.40760596.
  Tensor z = Tensor::from_vector(std::vector<float>{1, 2, 3, 1, 0, -1}, {2, 3}).set_requires_grad();
  Tensor t = Tensor::from_vector(std::vector<int64_t>{2, 0}, {2});
  Tensor loss = cross_entropy(z, t);
  CHECK(loss.shape().empty());
  CHECK(loss.item() == Approx(0.40760596).epsilon(1e-6));
  loss.backward();
  // (softmax - onehot) / N with softmax([1,2,3]) = [0.09003057, 0.24472847, 0.66524096]
  check_close(z.grad().to_float_vector(),
              {0.04501529f, 0.12236424f, -0.16737952f, -0.16737952f, 0.12236424f, 0.04501529f});

  // eps = 0.1: 0.9 * 0.40760596 + 0.1 * 1.40760596; target = 0.9 onehot + 0.1/3.
  z.set_grad(Tensor());
  Tensor smooth = cross_entropy(z, t, 0.1);
  CHECK(smooth.item() == Approx(0.50760596).epsilon(1e-6));
  smooth.backward();
  check_close(z.grad().to_float_vector(),
              {0.02834862f, 0.10569758f, -0.13404617f, -0.13404617f, 0.10569758f, 0.02834862f});
}

TEST_CASE("cross_entropy gradients and strided logits", "[softmax][loss][gradcheck]") {
  Generator gen(33);
  Tensor z = random_tensor({4, 6}, gen, -3, 3).set_requires_grad();
  Tensor t = Tensor::from_vector(std::vector<int64_t>{5, 0, 2, 2}, {4});
  for (double eps : {0.0, 0.1}) {
    gradcheck([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], t, eps); }, {z});
  }
  // Column-major logits give the same loss as a dense copy.
  Tensor zt = z.detach().transpose(0, 1).contiguous().transpose(0, 1);
  CHECK(cross_entropy(zt, t, 0.1).item() == Approx(cross_entropy(z, t, 0.1).item()));
  gradcheck(
      [&](const std::vector<Tensor>& in) { return cross_entropy(in[0].transpose(0, 1), t, 0.1); },
      {random_tensor({6, 4}, gen, -3, 3).set_requires_grad()});
  // Large logits stay finite.
  Tensor big = Tensor::from_vector(std::vector<float>{1000, 0, -1000, 50}, {2, 2});
  const double l = cross_entropy(big, Tensor::from_vector(std::vector<int64_t>{1, 0}, {2})).item();
  CHECK(l == Approx(1025.0));  // rows: 1000 - 0 and 50 - (-1000)
}

TEST_CASE("cross_entropy argument errors", "[softmax][loss][errors]") {
  Tensor z = Tensor::zeros({2, 3});
  CHECK_THROWS_WITH(cross_entropy(z, Tensor::from_vector(std::vector<int64_t>{0, 3}, {2})),
                    Catch::Contains("cross_entropy: target value 3 at position 1") &&
                        Catch::Contains("3 classes"));
  CHECK_THROWS_WITH(cross_entropy(z, Tensor::from_vector(std::vector<int64_t>{-1, 0}, {2})),
                    Catch::Contains("target value -1 at position 0"));
  CHECK_THROWS_WITH(cross_entropy(z, Tensor::zeros({2})),
                    Catch::Contains("cross_entropy: target must be i64"));
  CHECK_THROWS_WITH(cross_entropy(z, Tensor::zeros({3}, DType::i64)),
                    Catch::Contains("target shape [3] does not match logits [2,3]"));
  CHECK_THROWS_WITH(cross_entropy(Tensor::zeros({6}), Tensor::zeros({6}, DType::i64)),
                    Catch::Contains("cross_entropy: logits must be [N,K], got shape [6]"));
  CHECK_THROWS_WITH(cross_entropy(z, Tensor::zeros({2}, DType::i64), 1.5),
                    Catch::Contains("label_smoothing must be in [0, 1]"));
}

TEST_CASE("argmax and topk_indices", "[softmax][index]") {
  Tensor x =
      Tensor::from_vector(std::vector<float>{1, 5, 5, 2, 7, 0, 7, 3, -1, -2, -3, -1}, {3, 4});
  CHECK(argmax(x, 1).to_int_vector() == std::vector<int64_t>{1, 0, 0});  // ties: first index
  CHECK(argmax(x, 0).to_int_vector() == std::vector<int64_t>{1, 0, 1, 1});
  CHECK(argmax(x, -1).shape() == Shape{3});
  CHECK(argmax(x, 1).dtype() == DType::i64);

  Tensor top = topk_indices(x, 3);
  CHECK(top.shape() == Shape{3, 3});
  CHECK(top.to_int_vector() == std::vector<int64_t>{1, 2, 3, 0, 2, 3, 0, 3, 1});
  CHECK(topk_indices(x, 1).to_int_vector() == argmax(x, 1).to_int_vector());
  // Column-major input gives the same answer.
  Tensor xt = x.transpose(0, 1).contiguous().transpose(0, 1);
  CHECK(topk_indices(xt, 4).to_int_vector() == topk_indices(x, 4).to_int_vector());

  // argmax over the channel dim of a channels-last 4-D tensor equals the dense answer.
  Generator gen(34);
  Tensor cl = random_tensor({2, 6, 3, 2}, gen, -1, 1, MemoryFormat::ChannelsLast);
  for (int64_t d : {1, 2, 3}) {
    CHECK(argmax(cl, d).to_int_vector() == argmax(cl.contiguous(), d).to_int_vector());
  }
  // NaN counts as the largest value.
  Tensor n = Tensor::from_vector(std::vector<float>{1, std::nanf(""), 3}, {1, 3});
  CHECK(argmax(n, 1).to_int_vector() == std::vector<int64_t>{1});
  CHECK(topk_indices(n, 2).to_int_vector() == std::vector<int64_t>{1, 2});
}

TEST_CASE("softmax and index argument errors", "[softmax][errors]") {
  Tensor x = Tensor::zeros({2, 3});
  CHECK_THROWS_WITH(softmax(x, 2), Catch::Contains("dimension 2 out of range"));
  CHECK_THROWS_WITH(log_softmax(Tensor::zeros({2}, DType::i64), 0),
                    Catch::Contains("log_softmax: input must be f32"));
  CHECK_THROWS_WITH(argmax(x, -3), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(topk_indices(x, 4), Catch::Contains("topk_indices: k = 4 must be in [1, 3]"));
  CHECK_THROWS_WITH(topk_indices(x, 0), Catch::Contains("topk_indices: k = 0"));
  CHECK_THROWS_WITH(topk_indices(Tensor::zeros({6}), 1),
                    Catch::Contains("topk_indices: expects a 2-D tensor [N,K], got shape [6]"));
}
