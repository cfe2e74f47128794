// The shared-memory allreduce of ranks on one host (distributed/gloo/shm_allreduce.h) and the
// hierarchical one of ranks on several hosts (hybrid_ring.h): bitwise the TCP ring's result; a
// mismatched call, or a rank that gives up, fails every rank instead of passing silently or
// hanging. Ranks are threads of this process, each with its own store client and groups.
#include <cstring>
#include <future>

#include "distributed/gloo/process_group_gloo.h"
#include "dpar/core/random.h"
#include "unit/thread_ranks.h"

using namespace dpar;
using namespace dpar::dist;
using namespace dpar::test;

namespace {

const dist::detail::ProcessGroupGloo& gloo_of(const ProcessGroup& pg) {
  return dynamic_cast<const dist::detail::ProcessGroupGloo&>(pg);
}

// Sums of three or more floats of wide range depend on their order, so any difference in the
// fold order, the chunks or the pieces (sizes below span one piece, several, and uneven last
// pieces) shows as a differing bit between the two groups' results.
void expect_same_bits(ProcessGroup& shm, ProcessGroup& tcp, int rank, int size) {
  Generator gen(1000 + static_cast<uint64_t>(rank));
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{100003}, int64_t{1000003}}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
        std::vector<float> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[i] = gen.normal() * static_cast<float>(1 << (i % 12));
        Tensor a = Tensor::from_vector(v, {n}).to(dtype), b = a.clone();
        shm.allreduce({a}, op)->wait();
        tcp.allreduce({b}, op)->wait();
        expect(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0,
               std::string(dtype_name(dtype)) + " " + reduce_op_name(op) +
                   " n=" + std::to_string(n) + " on " + std::to_string(size) +
                   " ranks: the results differ bitwise");
      }
    }
  }
  // Fused and non-contiguous tensors go through the staging buffer, then the same path.
  Tensor x =
      Tensor::from_vector(std::vector<float>(60, 0.1f * static_cast<float>(rank + 1)), {6, 10});
  Tensor y = x.clone();
  Tensor xt = x.transpose(0, 1), yt = y.transpose(0, 1);
  Tensor s1 = Tensor::full({5}, 1.0f / 3.0f), s2 = s1.clone();
  shm.allreduce({xt, s1})->wait();
  tcp.allreduce({yt, s2})->wait();
  expect(x.to_float_vector() == y.to_float_vector() && s1.to_float_vector() == s2.to_float_vector(),
         "fused allreduce differs between shared memory and tcp");
}

}  // namespace

TEST_CASE("allreduce through shared memory is bitwise the TCP ring's", "[shm]") {
  // Ranks of one host reduce through a shared segment; with shared_memory off, through Gloo's
  // TCP ring.
  for (int size : {2, 3, 4}) {
    run_ranks(size, [&](int rank, std::shared_ptr<Store> store) {
      ProcessGroupOptions tcp_options = test_options();
      tcp_options.shared_memory = false;
      auto shm = make_gloo_group(store, rank, size, test_options());
      auto tcp = make_gloo_group(store, rank, size, tcp_options);
      expect(gloo_of(*shm).allreduce_transport() == "shared memory",
             "same-host ranks use " + gloo_of(*shm).allreduce_transport());
      expect(gloo_of(*tcp).allreduce_transport() == "tcp (turned off (DPAR_SHM=0))",
             "DPAR_SHM=0 gives " + gloo_of(*tcp).allreduce_transport());
      expect_same_bits(*shm, *tcp, rank, size);
    });
  }
}

TEST_CASE("the hierarchical allreduce over several hosts is bitwise the TCP ring's", "[shm]") {
  // Threads stand for ranks on several hosts (host_identity): the ring's hops between two ranks
  // of one "host" go through shared memory, the others through TCP. Layouts: two hosts of two,
  // hosts of unequal size, and a host whose ranks meet across the ring's wrap (4 -> 0).
  struct Layout {
    std::vector<std::string> hosts;
    std::string transport;
  };
  const std::vector<Layout> layouts = {
      {{"a", "a", "b", "b"}, "shared memory within hosts (2 of 4 ring hops), tcp between them"},
      {{"a", "a", "b"}, "shared memory within hosts (1 of 3 ring hops), tcp between them"},
      {{"a", "b", "b", "b", "a"},
       "shared memory within hosts (3 of 5 ring hops), tcp between them"},
      {{"a", "b", "a", "b"},
       "tcp (the ranks run on 2 hosts; no two neighbouring ranks of the ring share a host)"},
  };
  for (const Layout& layout : layouts) {
    const int size = static_cast<int>(layout.hosts.size());
    run_ranks(size, [&](int rank, std::shared_ptr<Store> store) {
      ProcessGroupOptions options = test_options();
      options.host_identity = "host " + layout.hosts[static_cast<size_t>(rank)];
      ProcessGroupOptions tcp_options = options;
      tcp_options.shared_memory = false;
      auto hybrid = make_gloo_group(store, rank, size, options);
      auto tcp = make_gloo_group(store, rank, size, tcp_options);
      expect(gloo_of(*hybrid).allreduce_transport() == layout.transport,
             "the group's transport is " + gloo_of(*hybrid).allreduce_transport());
      expect_same_bits(*hybrid, *tcp, rank, size);
    });
  }
}

TEST_CASE("a rank that gives up on a hierarchical allreduce fails the ranks across its hops",
          "[shm]") {
  // Two hosts of two: rank 2 is aborted before the collective. Rank 3 waits on rank 2's
  // shared-memory hop and must fail at once with rank 2's reason, not at the timeout; the
  // failure goes on around the ring (TCP hops close), so every rank fails well within it.
  std::vector<std::string> errors(4);
  std::vector<double> seconds(4);
  run_ranks(4, [&](int rank, std::shared_ptr<Store> store) {
    ProcessGroupOptions options = test_options(std::chrono::seconds(60));
    options.host_identity = rank < 2 ? "host a" : "host b";
    auto pg = make_gloo_group(store, rank, 4, options);
    Tensor t = Tensor::ones({300000});
    pg->allreduce({t})->wait();  // connected and working
    if (rank == 2) pg->abort("stopped by the test");
    const auto start = std::chrono::steady_clock::now();
    try {
      pg->allreduce({t})->wait();
    } catch (const Error& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
    seconds[static_cast<size_t>(rank)] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << errors[static_cast<size_t>(r)]);
    CHECK_FALSE(errors[static_cast<size_t>(r)].empty());
    CHECK(seconds[static_cast<size_t>(r)] < 30);
  }
  CHECK_THAT(errors[3], Catch::Contains("rank 2 gave up on the collective") &&
                            Catch::Contains("stopped by the test"));
}

TEST_CASE("ranks that all-reduce different sizes through shared memory all fail, naming both",
          "[shm]") {
  // Over TCP the transport fails such a pair; the segment would hand back a silent mix.
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 2, test_options(std::chrono::seconds(5)));
    Tensor t = Tensor::ones({rank == 0 ? 1000 : 999});
    try {
      pg->allreduce({t})->wait();
    } catch (const Error& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  for (const std::string& e : errors) {
    INFO(e);
    CHECK_THAT(e, Catch::Contains("failed on rank") &&
                      Catch::Contains(" elements of 4 bytes, rank ") && Catch::Contains("1000") &&
                      Catch::Contains("999") &&
                      Catch::Contains("the ranks called different collectives"));
  }
}
