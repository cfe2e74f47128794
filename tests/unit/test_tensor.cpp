#include <catch2/catch.hpp>
#include <cstring>

#include "dpar/dpar.h"
#include "gradcheck.h"

using namespace dpar;

TEST_CASE("tensor factories and metadata", "[tensor]") {
  Tensor t = Tensor::zeros({2, 3, 4});
  CHECK(t.numel() == 24);
  CHECK(t.strides() == Shape{12, 4, 1});
  CHECK(t.is_contiguous());
  CHECK(t.size(-1) == 4);
  CHECK(Tensor::ones({3}).to_float_vector() == std::vector<float>{1, 1, 1});
  CHECK(Tensor::full({2}, 2.5).to_float_vector() == std::vector<float>{2.5, 2.5});
  Tensor e = Tensor::empty({0, 3});
  CHECK(e.numel() == 0);
  CHECK_THROWS_WITH(Tensor::empty({-1}), Catch::Contains("negative dimension"));
  CHECK_THROWS_WITH(Tensor::from_vector(std::vector<float>{1, 2}, {3}),
                    Catch::Contains("do not fill"));
}

TEST_CASE("channels-last layout round trip", "[tensor]") {
  std::vector<float> v(2 * 3 * 2 * 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  Tensor x = Tensor::from_vector(v, {2, 3, 2, 2});
  Tensor cl = x.contiguous(MemoryFormat::ChannelsLast);
  CHECK(cl.is_contiguous(MemoryFormat::ChannelsLast));
  CHECK_FALSE(cl.is_contiguous());
  CHECK(cl.is_dense());
  CHECK(cl.strides() == Shape{12, 1, 6, 3});
  CHECK(cl.to_float_vector() == v);  // logical order preserved
  CHECK(cl.contiguous().to_float_vector() == v);
}

TEST_CASE("views share storage and follow strides", "[tensor]") {
  Tensor x = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor t = x.transpose(0, 1);
  CHECK(t.shape() == Shape{3, 2});
  CHECK(t.to_float_vector() == std::vector<float>{0, 3, 1, 4, 2, 5});
  CHECK(t.storage() == x.storage());
  Tensor s = x.slice(1, 1, 3);
  CHECK(s.to_float_vector() == std::vector<float>{1, 2, 4, 5});
  CHECK(x.select(0, 1).to_float_vector() == std::vector<float>{3, 4, 5});
  CHECK(x.slice(1, 0, 3, 2).to_float_vector() == std::vector<float>{0, 2, 3, 5});
  CHECK(x.view({3, 2}).storage() == x.storage());
  CHECK(x.view({-1}).shape() == Shape{6});
  CHECK_THROWS_WITH(t.view({6}), Catch::Contains("use reshape"));
  CHECK(t.reshape({6}).to_float_vector() == std::vector<float>{0, 3, 1, 4, 2, 5});
  CHECK(x.unsqueeze(0).shape() == Shape{1, 2, 3});
  CHECK(x.unsqueeze(0).squeeze(0).shape() == Shape{2, 3});
  CHECK(x.flatten().shape() == Shape{6});
  CHECK_THROWS_WITH(x.view({4}), Catch::Contains("invalid for 6 elements"));
  CHECK_THROWS_WITH(x.select(0, 5), Catch::Contains("out of range"));
}

TEST_CASE("dtype conversions", "[tensor]") {
  Tensor x = Tensor::from_vector(std::vector<float>{1.5f, -2.25f, 3.0f, 65504.f}, {4});
  CHECK(x.to(DType::f16).to(DType::f32).to_float_vector() == x.to_float_vector());
  CHECK(x.to(DType::bf16).to(DType::f32).to_float_vector() ==
        std::vector<float>{1.5f, -2.25f, 3.0f, 65536.f});
  CHECK(x.to(DType::i64).to_int_vector() == std::vector<int64_t>{1, -2, 3, 65504});
  Tensor u = Tensor::full({2}, 200, DType::u8);
  CHECK(u.to(DType::f32).to_float_vector() == std::vector<float>{200, 200});
  CHECK(half_to_float(float_to_half(1e-7f)) == Approx(1.19209e-07).epsilon(0.01));
  CHECK_THROWS_WITH(x.data<int64_t>(), Catch::Contains("tensor is f32"));
}

TEST_CASE("allocator caches blocks", "[tensor]") {
  Allocator& a = allocator_for(Device::cpu());
  { Tensor t = Tensor::empty({1000, 17}); }
  const auto before = a.stats().system_allocations;
  for (int i = 0; i < 10; ++i) {
    Tensor t = Tensor::empty({1000, 17});
  }
  CHECK(a.stats().system_allocations == before);
}

TEST_CASE("allocator reuses a cached small block a little larger than the request", "[tensor]") {
  Allocator& a = allocator_for(Device::cpu());
  // Below the 256 KiB from which blocks come from segments, in sizes no other test uses, so the
  // cache holds no other block in between.
  { Tensor big = Tensor::empty({100, 601}); }
  const auto before = a.stats();
  {
    Tensor smaller = Tensor::empty({100, 500});  // within 25% of the cached block: reused
    CHECK(a.stats().system_allocations == before.system_allocations);
    CHECK(a.stats().allocated_bytes - before.allocated_bytes >= 100 * 601 * sizeof(float));
  }
  { Tensor much_smaller = Tensor::empty({100, 201}); }  // far smaller: a block of its own
  CHECK(a.stats().system_allocations == before.system_allocations + 1);
  CHECK(a.stats().allocated_bytes == before.allocated_bytes);
}

// The large-block tests: blocks from 256 KiB come from the allocator's address ranges, except
// under AddressSanitizer, where every block comes from malloc.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kLargeBlocksFromMalloc = true;
#else
constexpr bool kLargeBlocksFromMalloc = false;
#endif
constexpr size_t kMiB = size_t{1} << 20;

// Whether a test of the arena's large blocks has nothing to watch (and says so): under
// AddressSanitizer every block comes from malloc, which guards it with red zones.
bool large_blocks_from_malloc() {
  if (kLargeBlocksFromMalloc) {
    SUCCEED("under AddressSanitizer every block comes from malloc, which guards it with red zones");
  }
  return kLargeBlocksFromMalloc;
}

TEST_CASE("allocator splits a cached large block for smaller requests and merges it back",
          "[tensor]") {
  if (large_blocks_from_malloc()) return;
  Allocator& a = allocator_for(Device::cpu());
  a.empty_cache();
  { Tensor one_layer = Tensor::empty({12 * kMiB / sizeof(float)}); }
  const auto before = a.stats();
  {
    // Three later activations of a third of the size share the freed block, each charged only
    // its own size.
    Tensor x = Tensor::empty({4 * kMiB / sizeof(float)});
    Tensor y = Tensor::empty({4 * kMiB / sizeof(float)});
    Tensor z = Tensor::empty({4 * kMiB / sizeof(float)});
    CHECK(a.stats().system_allocations == before.system_allocations);
    CHECK(a.stats().allocated_bytes - before.allocated_bytes == 12 * kMiB);
    std::memset(x.raw_data(), 1, 4 * kMiB);  // the pieces are disjoint: writes stay in place
    std::memset(z.raw_data(), 3, 4 * kMiB);
    std::memset(y.raw_data(), 2, 4 * kMiB);
    CHECK(static_cast<const uint8_t*>(x.raw_data())[4 * kMiB - 1] == 1);
    CHECK(static_cast<const uint8_t*>(z.raw_data())[0] == 3);
  }
  // Freed, the pieces merge: the whole size is served again without the system.
  { Tensor next_step = Tensor::empty({12 * kMiB / sizeof(float)}); }
  CHECK(a.stats().system_allocations == before.system_allocations);
  CHECK(a.stats().allocated_bytes == before.allocated_bytes);
  CHECK(a.stats().cached_bytes == before.cached_bytes);
}

TEST_CASE("allocator merges large blocks mapped one after another and gives pages back",
          "[tensor]") {
  if (large_blocks_from_malloc()) return;
  Allocator& a = allocator_for(Device::cpu());
  a.empty_cache();
  const int64_t kBlock = 40 * kMiB / sizeof(float);  // larger than any gap other tests leave
  {
    // Three requests the cache cannot serve, each mapping its own pages: they lie side by side
    // in one address range, so, freed, they make one free block.
    Tensor x = Tensor::empty({kBlock}), y = Tensor::empty({kBlock}), z = Tensor::empty({kBlock});
    std::memset(y.raw_data(), 7, 40 * kMiB);
  }
  const auto before = a.stats();
  {
    Tensor all = Tensor::empty({3 * kBlock});  // the three blocks, merged
    CHECK(a.stats().system_allocations == before.system_allocations);
    std::memset(all.raw_data(), 1, 120 * kMiB);
  }
  // Given back, the pages are mapped again on the next request, and are usable.
  a.empty_cache();
  CHECK(a.stats().cached_bytes == 0);
  {
    Tensor again = Tensor::empty({kBlock});
    CHECK(a.stats().system_allocations == before.system_allocations + 1);
    auto* bytes = static_cast<uint8_t*>(again.raw_data());
    std::memset(bytes, 5, 40 * kMiB);
    CHECK(bytes[0] == 5);
    CHECK(bytes[40 * kMiB - 1] == 5);
  }
  CHECK(a.stats().allocated_bytes == before.allocated_bytes);
}

TEST_CASE("cuda device errors are clear", "[tensor]") {
  if (built_with_cuda()) return;  // with CUDA the allocator exists; running it needs a GPU
  CHECK_THROWS_WITH(Tensor::empty({2}, DType::f32, Device::cuda(0)),
                    Catch::Contains("built without CUDA"));
  CHECK(Device::parse("gpu:1") == Device::cuda(1));
  CHECK_THROWS_WITH(Device::parse("tpu"), Catch::Contains("expected cpu"));
}

TEST_CASE("strided elementwise loops split over threads give the one-thread bits", "[tensor]") {
  // 3 x 40 x 23 x 29 = 80040 elements: above the threshold where the walk over rows is split,
  // and 2001 rows of 40 channels channels-last, so 3 threads get uneven runs.
  const Shape shape{3, 40, 23, 29};
  Generator gen(7);
  const Tensor x = testing::random_tensor(shape, gen).contiguous(MemoryFormat::ChannelsLast);
  const Tensor scale = testing::random_tensor({3, 40, 1, 1}, gen);
  const Tensor other = testing::random_tensor(shape, gen);  // NCHW beside channels-last x
  const int threads_before = get_num_threads();
  struct Results {
    std::vector<float> product, to_nchw, sum, relu_of_slice;
  };
  auto run = [&](int threads) {
    set_num_threads(threads);
    Results r;
    r.product = mul(x, scale).to_float_vector();
    r.to_nchw = x.contiguous().to_float_vector();
    Tensor acc = x.clone();
    add_(acc, other, 0.5);
    r.sum = acc.to_float_vector();
    r.relu_of_slice = relu(x.slice(3, 0, 28)).to_float_vector();
    set_num_threads(threads_before);
    return r;
  };
  const Results one = run(1);
  const auto xv = x.to_float_vector(), sv = scale.to_float_vector(), ov = other.to_float_vector();
  const int64_t plane = shape[2] * shape[3];
  for (size_t i = 0; i < xv.size(); ++i) {
    REQUIRE(one.product[i] == xv[i] * sv[i / plane]);
    REQUIRE(one.sum[i] == xv[i] + 0.5f * ov[i]);
  }
  CHECK(one.to_nchw == xv);
  CHECK(one.relu_of_slice.size() == xv.size() / shape[3] * 28);
  for (int threads : {2, 3}) {
    const Results many = run(threads);
    CHECK(many.product == one.product);
    CHECK(many.to_nchw == one.to_nchw);
    CHECK(many.sum == one.sum);
    CHECK(many.relu_of_slice == one.relu_of_slice);
  }
}
