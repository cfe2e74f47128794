// The layer set of a model of one's own (issue 19) on CUDA against the CPU backend: the
// activations, pointwise maths and the rest, forward and backward, to 1e-4 relative (f32).
#include "dpar/infer/runtime.h"
#include "gpu/gpu_helpers.h"
#include "model/vision_transformer.h"
#include "model/vision_transformer_onnx.h"

using namespace dpar;

TEST_CASE("activations and pointwise maths match the CPU") {
  DPAR_REQUIRE_GPU();
  const Tensor wide = random_tensor({4, 3, 5}, 5, -5, 5);
  const Tensor positive = random_tensor({4, 3, 5}, 6, 0.5f, 3.f);
  compare_op("tanh", [](auto& t) { return dpar::tanh(t[0]); }, {wide});
  compare_op("gelu", [](auto& t) { return gelu(t[0]); }, {wide});
  compare_op("gelu tanh", [](auto& t) { return gelu(t[0], GeluApproximation::tanh); }, {wide});
  compare_op("silu", [](auto& t) { return silu(t[0]); }, {wide});
  compare_op("softplus", [](auto& t) { return softplus(t[0], 2.0, 3.0); }, {wide});
  compare_op("leaky_relu", [](auto& t) { return leaky_relu(t[0], 0.2); }, {wide});
  compare_op("abs", [](auto& t) { return dpar::abs(t[0]); }, {wide});
  compare_op("clamp", [](auto& t) { return clamp(t[0], -1.0, 2.0); }, {wide});
  compare_op("pow", [](auto& t) { return dpar::pow(t[0], 1.5); }, {positive});
  compare_op("erf", [](auto& t) { return dpar::erf(t[0]); }, {wide});
  compare_op("gelu on a transposed view", [](auto& t) { return gelu(t[0].transpose(0, 2)); },
             {wide});
}

TEST_CASE("comparisons, where, gather, index_select, embedding and max/min match the CPU") {
  DPAR_REQUIRE_GPU();
  const Tensor x = random_tensor({4, 6, 5}, 7, -3, 3), y = random_tensor({5}, 8, -3, 3);
  for (const auto& cmp : {eq(x, y), lt(x, y), ge(x, 0.5)}) CHECK(cmp.dtype() == DType::u8);
  CHECK(lt(x, y).to(DType::f32).to_float_vector() ==
        lt(x.to(kGpu), y.to(kGpu)).to(DType::f32).to_float_vector());
  const Tensor cond = gt(random_tensor({4, 6, 5}, 9), 0.0);
  compare_op("where", [&](auto& t) { return where(cond.to(t[0].device()), t[0], t[1]); }, {x, y});
  compare_op("masked_fill",
             [&](auto& t) { return masked_fill(t[0], cond.to(t[0].device()), -2.0); }, {x});
  const Tensor index = Tensor::from_vector(std::vector<int64_t>{0, 5, 5, 2, 1, 3, 3, 0}, {4, 2, 1});
  compare_op("gather", [](auto& t) { return gather(t[0], 1, t[1]); }, {x, index});
  const Tensor rows = Tensor::from_vector(std::vector<int64_t>{2, 2, 0, 5}, {4});
  compare_op("index_select (repeats accumulate)",
             [](auto& t) { return index_select(t[0], 1, t[1]); }, {x, rows});
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 3, 3, 0, 2, 1}, {2, 3});
  compare_op("embedding with padding", [](auto& t) { return embedding(t[0], t[1], 3); },
             {random_tensor({4, 8}, 10), ids});
  compare_op("max over dim 1", [](auto& t) { return max(t[0], 1).values; }, {x});
  compare_op("min over dim 2 keepdim", [](auto& t) { return min(t[0], 2, true).values; }, {x});
  CHECK(max(x, 1).indices.to_int_vector() == max(x.to(kGpu), 1).indices.to_int_vector());
}

TEST_CASE("an index outside its range on the GPU is an error at the next synchronisation") {
  DPAR_REQUIRE_GPU();
  const Tensor w = random_tensor({4, 3}, 11).to(kGpu);
  const Tensor bad = Tensor::from_vector(std::vector<int64_t>{1, 4}, {2}).to(kGpu);
  CHECK_THROWS_WITH(embedding(w, bad).to(Device::cpu()),
                    Catch::Contains("index 4 is outside [0, 4)"));
}

TEST_CASE(
    "cat, stack, batched matmul, linear (plain and with a residual) on [..., C] and "
    "BatchNorm1d match the CPU") {
  DPAR_REQUIRE_GPU();
  const Tensor a = random_tensor({2, 3, 4}, 12), b = random_tensor({2, 2, 4}, 13);
  compare_op("cat", [](auto& t) { return cat({t[0], t[1], t[0]}, 1); }, {a, b});
  compare_op("stack", [](auto& t) { return stack({t[0], t[0]}, 3); }, {a});
  compare_op("batched matmul with broadcasting",
             [](auto& t) { return matmul(t[0], t[1].transpose(-2, -1)); },
             {random_tensor({2, 1, 5, 8}, 14), random_tensor({3, 6, 8}, 15)});
  compare_op("linear on [B,T,C]", [](auto& t) { return linear(t[0], t[1], t[2]); },
             {random_tensor({2, 7, 8}, 16), random_tensor({5, 8}, 17), random_tensor({5}, 18)});
  // linear_add runs as linear then add on CUDA (the CPU fuses them).
  compare_op("linear_add on [B,T,C]", [](auto& t) { return linear_add(t[0], t[1], t[2], t[3]); },
             {random_tensor({2, 7, 8}, 16), random_tensor({5, 8}, 17), random_tensor({5}, 18),
              random_tensor({2, 7, 5}, 25)});
  compare_op(
      "batch_norm on [N,C,L]",
      [](auto& t) { return batch_norm(t[0], t[1], t[2], {}, {}, true, 0.1, 1e-5); },
      {random_tensor({4, 3, 6}, 19), random_tensor({3}, 20, 0.5f, 1.5f), random_tensor({3}, 21)});
}

TEST_CASE("layer_norm and group_norm match the CPU") {
  DPAR_REQUIRE_GPU();
  compare_op("layer_norm (ViT width)", [](auto& t) { return layer_norm(t[0], {192}, t[1], t[2]); },
             {random_tensor({2, 65, 192}, 22, -2, 3), random_tensor({192}, 23, 0.5f, 1.5f),
              random_tensor({192}, 24)});
  compare_op("layer_norm over two dims",
             [](auto& t) {
               return layer_norm(t[0], {4, 6});
             },
             {random_tensor({3, 4, 6}, 25)});
  compare_op("group_norm", [](auto& t) { return group_norm(t[0], 2, t[1], t[2]); },
             {random_tensor({2, 6, 5, 4}, 26), random_tensor({6}, 27, 0.5f, 1.5f),
              random_tensor({6}, 28)});
}

TEST_CASE("losses match the CPU") {
  DPAR_REQUIRE_GPU();
  const Tensor target = Tensor::from_vector(std::vector<int64_t>{3, -100, 0, 9, 4}, {5});
  compare_op("cross_entropy with ignore_index",
             [&](auto& t) { return cross_entropy(t[0], target.to(t[0].device()), 0.1, -100); },
             {random_tensor({5, 10}, 29, -3, 3)});
  compare_op("mse_loss", [](auto& t) { return mse_loss(t[0], t[1]); },
             {random_tensor({3, 7}, 30), random_tensor({3, 7}, 31)});
  compare_op("bce_with_logits",
             [](auto& t) { return binary_cross_entropy_with_logits(t[0], t[1]); },
             {random_tensor({4, 5}, 32, -5, 5), random_tensor({4, 5}, 33, 0, 1)});
}

TEST_CASE("max, average and adaptive pooling match the CPU in both layouts") {
  DPAR_REQUIRE_GPU();
  // Distinct values: max pooling's choice is the same on both devices.
  std::vector<float> v(2 * 3 * 9 * 8);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 37) % v.size()) * 0.01f;
  const Tensor x = Tensor::from_vector(v, {2, 3, 9, 8});
  for (const bool cl : {false, true}) {
    INFO("channels-last " << cl);
    const Tensor in = cl ? x.contiguous(MemoryFormat::ChannelsLast) : x;
    compare_op("max_pool2d 3x3 s2 p1", [](auto& t) { return max_pool2d(t[0], {3}, {2}, {1}); },
               {in});
    compare_op("max_pool2d ceil", [](auto& t) { return max_pool2d(t[0], {3}, {2}, {0}, true); },
               {in});
    compare_op("avg_pool2d exclude pad",
               [](auto& t) { return avg_pool2d(t[0], {3}, {2}, {1}, true, false); }, {in});
    compare_op("adaptive_avg_pool2d",
               [](auto& t) {
                 return adaptive_avg_pool2d(t[0], {3, 5});
               },
               {in});
  }
}

TEST_CASE("attention on the GPU (op chain) matches the CPU's fused kernel") {
  DPAR_REQUIRE_GPU();
  const Tensor q = random_tensor({2, 3, 17, 16}, 34), k = random_tensor({2, 3, 17, 16}, 35);
  const Tensor v = random_tensor({2, 3, 17, 16}, 36);
  compare_op("sdpa", [](auto& t) { return scaled_dot_product_attention(t[0], t[1], t[2]); },
             {q, k, v});
  compare_op("sdpa causal",
             [](auto& t) { return scaled_dot_product_attention(t[0], t[1], t[2], {}, 0.0, true); },
             {q, k, v});
  const Tensor mask = gt(random_tensor({17, 17}, 37), -0.5);
  compare_op("sdpa with a u8 mask",
             [&](auto& t) {
               return scaled_dot_product_attention(t[0], t[1], t[2], mask.to(t[0].device()));
             },
             {q, k, v});
}

TEST_CASE("a TransformerEncoderLayer on the GPU matches the CPU, forward and backward") {
  DPAR_REQUIRE_GPU();
  manual_seed(3);
  auto cpu = std::make_shared<nn::TransformerEncoderLayer>(
      nn::TransformerEncoderLayerOptions{.d_model = 32,
                                         .nhead = 4,
                                         .dim_feedforward = 64,
                                         .dropout = 0.0,
                                         .activation = nn::TransformerActivation::gelu,
                                         .batch_first = true,
                                         .norm_first = true});
  manual_seed(3);
  auto gpu = std::make_shared<nn::TransformerEncoderLayer>(cpu->options);
  gpu->to(kGpu);
  const Tensor x = random_tensor({2, 9, 32}, 38);
  Tensor xc = leaf_on(x, Device::cpu()), xg = leaf_on(x, kGpu);
  const Tensor yc = cpu->forward(xc), yg = gpu->forward(xg);
  CHECK(relative_error(yc, yg) <= 1e-4);
  const Tensor r = random_tensor(yc.shape(), 39);
  sum(yc * r).backward();
  sum(yg * r.to(kGpu)).backward();
  CHECK(relative_error(xc.grad(), xg.grad()) <= 1e-4);
  const auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
  for (size_t i = 0; i < pc.size(); ++i) {
    INFO(pc[i].first);
    CHECK(relative_error(pc[i].second.grad(), pg[i].second.grad()) <= 1e-4);
  }
}

TEST_CASE("dpar::infer runs the exported ViT node by node on the GPU as on the CPU") {
  DPAR_REQUIRE_GPU();
  manual_seed(4);
  models::VitConfig config = models::vit_tiny_config(10, 3);
  config.num_layers = 2;
  models::VisionTransformer vit(config);
  for (const Tensor& p : vit.parameters()) {  // the classifier starts at zero: move it
    NoGradGuard no_grad;
    Tensor q = p;
    q.copy_(add(q, random_tensor(p.shape(), 41, -0.05f, 0.05f)));
  }
  vit.eval();
  const std::string dir = "/tmp/dpar_gpu_vit_export";
  models::export_vision_transformer(vit, dir, /*softmax=*/false);
  infer::Model model = infer::Model::load(dir + "/inference.onnx");
  const Tensor x = random_tensor({3, 3, 32, 32}, 42);
  const Tensor cpu = model.run(x);
  model.set_device(kGpu);
  const Tensor gpu = model.run(x);
  REQUIRE(gpu.device() == kGpu);
  CHECK(relative_error(cpu, gpu) <= 1e-4);
  NoGradGuard no_grad;
  CHECK(relative_error(vit.forward(x), cpu) <= 1e-4);
}
