// The shared-memory allreduce of ranks on one host (distributed/gloo/shm_allreduce.h): bitwise
// the TCP ring's result, and a mismatched call fails on every rank instead of passing silently.
// Ranks are threads of this process (one host), each with its own store client and groups.
#include <cstring>
#include <future>

#include "distributed/gloo/process_group_gloo.h"
#include "dpar/core/random.h"
#include "unit/thread_ranks.h"

using namespace dpar;
using namespace dpar::dist;
using namespace dpar::test;

TEST_CASE("allreduce through shared memory is bitwise the TCP ring's", "[shm]") {
  // Ranks of one host reduce through a shared segment; with shared_memory off, through Gloo's
  // TCP ring. Sums of three or four floats of wide range depend on their order, so any
  // difference in the fold order, the chunks or the pieces (sizes below span one piece, several,
  // and uneven last pieces) shows as a differing bit.
  for (int size : {2, 3, 4}) {
    run_ranks(size, [&](int rank, std::shared_ptr<Store> store) {
      ProcessGroupOptions tcp_options = test_options();
      tcp_options.shared_memory = false;
      auto shm = make_gloo_group(store, rank, size, test_options());
      auto tcp = make_gloo_group(store, rank, size, tcp_options);
      const auto* shm_gloo = dynamic_cast<const dist::detail::ProcessGroupGloo*>(shm.get());
      const auto* tcp_gloo = dynamic_cast<const dist::detail::ProcessGroupGloo*>(tcp.get());
      expect(shm_gloo->allreduce_transport() == "shared memory",
             "same-host ranks use " + shm_gloo->allreduce_transport());
      expect(tcp_gloo->allreduce_transport() == "tcp (turned off (DPAR_SHM=0))",
             "DPAR_SHM=0 gives " + tcp_gloo->allreduce_transport());
      Generator gen(1000 + static_cast<uint64_t>(rank));
      for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{100003}, int64_t{1000003}}) {
        for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
            std::vector<float> v(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) v[i] = gen.normal() * static_cast<float>(1 << (i % 12));
            Tensor a = Tensor::from_vector(v, {n}).to(dtype), b = a.clone();
            shm->allreduce({a}, op)->wait();
            tcp->allreduce({b}, op)->wait();
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
      shm->allreduce({xt, s1})->wait();
      tcp->allreduce({yt, s2})->wait();
      expect(x.to_float_vector() == y.to_float_vector() &&
                 s1.to_float_vector() == s2.to_float_vector(),
             "fused allreduce differs between shared memory and tcp");
    });
  }
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
