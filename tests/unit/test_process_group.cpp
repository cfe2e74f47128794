// Collectives over the Gloo backend: ranks run as threads of this process, each with its own
// StoreClient to one StoreServer on 127.0.0.1 and its own group, exactly as separate processes
// would. Checks inside rank threads throw (Catch2's macros are not thread-safe); the main
// thread reports every rank's failure.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "dpar/core/random.h"
#include "dpar/distributed/process_group.h"
#include "dpar/distributed/store.h"
#include "dpar/tensor/storage.h"
#include "unit/thread_ranks.h"

using namespace dpar;
using namespace dpar::dist;
using namespace dpar::test;

namespace {

constexpr int64_t kBig = (1 << 20) + 3;

void run_group(int size, const std::function<void(int, ProcessGroup&)>& body,
               ProcessGroupOptions options = test_options()) {
  run_ranks(size, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, size, options);
    body(rank, *pg);
  });
}

// Reads any dtype as doubles in logical order (i64 exactly).
std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  if (t.dtype() == DType::i64) {
    for (int64_t v : t.to_int_vector()) out.push_back(static_cast<double>(v));
  } else {
    for (float v : t.to_float_vector()) out.push_back(v);
  }
  return out;
}

void expect_values(const Tensor& t, const std::vector<double>& want, const std::string& what) {
  const std::vector<double> got = values(t);
  expect(got.size() == want.size(),
         what + ": size " + std::to_string(got.size()) + " vs " + std::to_string(want.size()));
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      throw std::runtime_error(what + ": element " + std::to_string(i) + " is " +
                               std::to_string(got[i]) + ", expected " + std::to_string(want[i]));
    }
  }
}

// Small integers, so that sums and averages (multiples of 1/4 below 64) are exact in every
// dtype including f16 and bf16; i64 values go negative to check truncation toward zero.
double input_value(DType dtype, int rank, int64_t i) {
  if (dtype == DType::i64) return static_cast<double>(((i % 7) - 3) * (rank + 1));
  return static_cast<double>((i * 3 + rank * 5) % 11);
}

Tensor make_tensor(DType dtype, int rank, int64_t n, int64_t salt = 0) {
  if (dtype == DType::i64) {
    std::vector<int64_t> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int64_t>(input_value(dtype, rank, i + salt));
    return Tensor::from_vector(v, {n});
  }
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(input_value(dtype, rank, i + salt));
  return Tensor::from_vector(v, {n}).to(dtype);
}

double reduce_expected(DType dtype, ReduceOp op, int size, int64_t i, int64_t salt = 0) {
  double acc = input_value(dtype, 0, i + salt);
  for (int r = 1; r < size; ++r) {
    const double v = input_value(dtype, r, i + salt);
    if (op == ReduceOp::Max) acc = std::max(acc, v);
    if (op == ReduceOp::Min) acc = std::min(acc, v);
    if (op == ReduceOp::Sum || op == ReduceOp::Avg) acc += v;
  }
  if (op == ReduceOp::Avg) {
    if (dtype == DType::i64) return static_cast<double>(static_cast<int64_t>(acc) / size);
    return static_cast<double>(static_cast<float>(acc) / static_cast<float>(size));
  }
  return acc;
}

const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16, DType::i64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};

std::string label(const char* op, DType d, ReduceOp r, int64_t n) {
  return std::string(op) + " " + std::string(dtype_name(d)) + " " + reduce_op_name(r) +
         " n=" + std::to_string(n);
}

void check_allreduce(int size) {
  run_group(size, [&](int rank, ProcessGroup& pg) {
    for (DType dtype : kDtypes) {
      for (ReduceOp op : kOps) {
        for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}}) {
          Tensor t = make_tensor(dtype, rank, n);
          pg.allreduce({t}, op)->wait();
          std::vector<double> want(n);
          for (int64_t i = 0; i < n; ++i) want[i] = reduce_expected(dtype, op, size, i);
          expect_values(t, want, label("allreduce", dtype, op, n));
        }
      }
    }
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      Tensor big = make_tensor(DType::f32, rank, kBig);
      pg.allreduce({big}, op)->wait();
      std::vector<double> want(kBig);
      for (int64_t i = 0; i < kBig; ++i) want[i] = reduce_expected(DType::f32, op, size, i);
      expect_values(big, want, label("allreduce", DType::f32, op, kBig));
    }
  });
}

}  // namespace

TEST_CASE("reduce_op_name and ProcessGroupOptions::from_env", "[process_group]") {
  CHECK(std::string(reduce_op_name(ReduceOp::Avg)) == "avg");
  CHECK(std::string(reduce_op_name(ReduceOp::Min)) == "min");
  setenv("DPAR_TIMEOUT", "2.5", 1);
  setenv("DPAR_DEBUG", "detail", 1);
  auto o = ProcessGroupOptions::from_env();
  CHECK(o.timeout == Millis(2500));
  CHECK(o.debug_detail);
  setenv("DPAR_TIMEOUT", "soon", 1);
  CHECK_THROWS_WITH(ProcessGroupOptions::from_env(),
                    Catch::Contains("DPAR_TIMEOUT") && Catch::Contains("soon"));
  setenv("DPAR_TIMEOUT", "60", 1);
  setenv("DPAR_DEBUG", "LOUD", 1);
  CHECK_THROWS_WITH(ProcessGroupOptions::from_env(), Catch::Contains("DPAR_DEBUG"));
  unsetenv("DPAR_TIMEOUT");
  unsetenv("DPAR_DEBUG");
  o = ProcessGroupOptions::from_env();
  CHECK(o.timeout == std::chrono::minutes(30));
  CHECK_FALSE(o.debug_detail);
}

TEST_CASE("allreduce: every op, dtype and size on 2 ranks", "[process_group]") {
  check_allreduce(2);
}

TEST_CASE("allreduce: every op, dtype and size on 4 ranks", "[process_group]") {
  check_allreduce(4);
}

TEST_CASE("allreduce fuses several tensors, including non-contiguous ones", "[process_group]") {
  run_group(4, [](int rank, ProcessGroup& pg) {
    Tensor a = make_tensor(DType::f32, rank, 5, 0);
    Tensor d = make_tensor(DType::f32, rank, 12, 17).view({4, 3}).transpose(0, 1);
    Tensor e = make_tensor(DType::f32, rank, 1, 29);
    pg.allreduce({a, d, e}, ReduceOp::Sum)->wait();
    std::vector<double> want_a(5), want_e(1);
    for (int i = 0; i < 5; ++i) want_a[i] = reduce_expected(DType::f32, ReduceOp::Sum, 4, i, 0);
    want_e[0] = reduce_expected(DType::f32, ReduceOp::Sum, 4, 0, 29);
    expect_values(a, want_a, "fused a");
    expect_values(e, want_e, "fused e");
    // d is the transpose of a [4,3] tensor: d[j][k] = source[k*3 + j].
    std::vector<double> want_d;
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) {
        want_d.push_back(reduce_expected(DType::f32, ReduceOp::Sum, 4, k * 3 + j, 17));
      }
    }
    expect_values(d, want_d, "fused non-contiguous d");
  });
}

TEST_CASE("broadcast: dtypes, sizes, roots, mixed dtypes and views", "[process_group]") {
  for (int size : {2, 4}) {
    run_group(size, [size](int rank, ProcessGroup& pg) {
      for (int root : {0, size - 1}) {
        for (DType dtype : kDtypes) {
          for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}}) {
            Tensor t = make_tensor(dtype, rank, n);
            pg.broadcast({t}, root)->wait();
            expect_values(
                t, values(make_tensor(dtype, root, n)),
                label("broadcast", dtype, ReduceOp::Sum, n) + " root " + std::to_string(root));
          }
        }
        // Parameters and integer buffers travel together; one of them is a strided view.
        Tensor f = make_tensor(DType::f32, rank, 6, 1).view({2, 3}).transpose(0, 1);
        Tensor i = make_tensor(DType::i64, rank, 3, 2);
        pg.broadcast({f, i}, root)->wait();
        expect_values(f, values(make_tensor(DType::f32, root, 6, 1).view({2, 3}).transpose(0, 1)),
                      "broadcast mixed f32 view");
        expect_values(i, values(make_tensor(DType::i64, root, 3, 2)), "broadcast mixed i64");
      }
      Tensor big = make_tensor(DType::f32, rank, kBig);
      pg.broadcast({big}, 1)->wait();
      expect_values(big, values(make_tensor(DType::f32, 1, kBig)), "broadcast big");
    });
  }
}

TEST_CASE("allgather: dtypes, sizes, direct and staged outputs", "[process_group]") {
  for (int size : {2, 4}) {
    run_group(size, [size](int rank, ProcessGroup& pg) {
      for (DType dtype : kDtypes) {
        for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}}) {
          Tensor in = make_tensor(dtype, rank, n);
          std::vector<Tensor> outs;
          for (int r = 0; r < size; ++r) outs.push_back(Tensor::zeros({n}, dtype));
          pg.allgather(outs, in)->wait();
          for (int r = 0; r < size; ++r) {
            expect_values(
                outs[r], values(make_tensor(dtype, r, n)),
                label("allgather", dtype, ReduceOp::Sum, n) + " slot " + std::to_string(r));
          }
        }
      }
      // Outputs that are consecutive slices of one flat tensor (gathered in place), with a
      // non-contiguous input.
      const int64_t n = kBig;
      Tensor flat = Tensor::zeros({n * size});
      std::vector<Tensor> outs;
      for (int r = 0; r < size; ++r) outs.push_back(flat.slice(0, r * n, (r + 1) * n));
      Tensor in = make_tensor(DType::f32, rank, n);
      pg.allgather(outs, in)->wait();
      for (int r = 0; r < size; ++r) {
        expect_values(outs[r], values(make_tensor(DType::f32, r, n)), "allgather big slot");
      }
      Tensor strided_in = make_tensor(DType::f32, rank, 6).view({2, 3}).transpose(0, 1);
      std::vector<Tensor> small;
      for (int r = 0; r < size; ++r) small.push_back(Tensor::zeros({3, 2}));
      pg.allgather(small, strided_in)->wait();
      for (int r = 0; r < size; ++r) {
        expect_values(small[r], values(make_tensor(DType::f32, r, 6).view({2, 3}).transpose(0, 1)),
                      "allgather strided input");
      }
    });
  }
}

namespace {

// Uneven chunks, including empty ones: rank r's chunk has chunk_len(r) elements.
int64_t chunk_len(int size, int r, int64_t scale) {
  const int64_t base[] = {3, 0, 5, 1};
  return size == 2 ? (r == 0 ? 7 : 1) * scale : base[r] * scale;
}

void check_reduce_scatter(int size, DType dtype, ReduceOp op, int64_t scale, int rank,
                          ProcessGroup& pg) {
  std::vector<Tensor> inputs;
  int64_t salt = 0;
  std::vector<int64_t> salts;
  for (int r = 0; r < size; ++r) {
    salts.push_back(salt);
    inputs.push_back(make_tensor(dtype, rank, chunk_len(size, r, scale), salt));
    salt += chunk_len(size, r, scale);
  }
  const int64_t n = chunk_len(size, rank, scale);
  Tensor out = Tensor::zeros({n}, dtype);
  pg.reduce_scatter(out, inputs, op)->wait();
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = reduce_expected(dtype, op, size, i, salts[rank]);
  expect_values(out, want, label("reduce_scatter", dtype, op, n));
}

}  // namespace

TEST_CASE("reduce_scatter: uneven chunks, every op and dtype", "[process_group]") {
  for (int size : {2, 4}) {
    run_group(size, [size](int rank, ProcessGroup& pg) {
      for (DType dtype : kDtypes) {
        for (ReduceOp op : kOps) check_reduce_scatter(size, dtype, op, 1, rank, pg);
      }
      // About a million elements in total, split unevenly: several ring segments per chunk.
      check_reduce_scatter(size, DType::f32, ReduceOp::Sum, kBig / 9, rank, pg);
      check_reduce_scatter(size, DType::f32, ReduceOp::Avg, kBig / 9, rank, pg);
    });
  }
}

TEST_CASE("allgather: uneven and empty pieces, in place into one flat buffer", "[process_group]") {
  for (int size : {2, 4}) {
    run_group(size, [size](int rank, ProcessGroup& pg) {
      for (int64_t scale : {int64_t{1}, kBig / 9}) {
        std::vector<Tensor> outs;
        std::vector<int64_t> starts;
        int64_t total = 0;
        for (int r = 0; r < size; ++r) {
          starts.push_back(total);
          total += chunk_len(size, r, scale);
        }
        // Rank r's piece is a slice of the flat buffer it gathers into (sharded DataParallel's
        // parameter slices): the input is already in place.
        Tensor flat = Tensor::zeros({total});
        for (int r = 0; r < size; ++r) {
          outs.push_back(flat.slice(0, starts[r], starts[r] + chunk_len(size, r, scale)));
        }
        outs[rank].copy_(make_tensor(DType::f32, rank, chunk_len(size, rank, scale)));
        pg.allgather(outs, outs[rank])->wait();
        for (int r = 0; r < size; ++r) {
          expect_values(outs[r], values(make_tensor(DType::f32, r, chunk_len(size, r, scale))),
                        "uneven allgather slot " + std::to_string(r));
        }
        // Separate outputs (staged), an input of another size is refused.
        std::vector<Tensor> separate;
        for (int r = 0; r < size; ++r)
          separate.push_back(Tensor::zeros({chunk_len(size, r, scale)}));
        pg.allgather(separate, make_tensor(DType::f32, rank, chunk_len(size, rank, scale)))->wait();
        for (int r = 0; r < size; ++r) {
          expect_values(separate[r], values(make_tensor(DType::f32, r, chunk_len(size, r, scale))),
                        "staged uneven allgather slot " + std::to_string(r));
        }
      }
      bool refused = false;
      try {
        std::vector<Tensor> outs(size, Tensor::zeros({4}));
        pg.allgather(outs, Tensor::zeros({5}));
      } catch (const Error& e) {
        refused = std::string(e.what()).find("must have as many elements as outputs[") !=
                  std::string::npos;
      }
      expect(refused, "an input of the wrong size was not refused");
    });
  }
}

TEST_CASE("allreduce_chunk_bounds: 64-byte aligned, covering, as even as blocks allow",
          "[process_group]") {
  CHECK(allreduce_chunk_bounds(100, 3, 4) == std::vector<int64_t>{0, 48, 80, 100});
  CHECK(allreduce_chunk_bounds(10, 3, 4) == std::vector<int64_t>{0, 10, 10, 10});
  CHECK(allreduce_chunk_bounds(0, 2, 4) == std::vector<int64_t>{0, 0, 0});
  CHECK(allreduce_chunk_bounds(64, 2, 2) == std::vector<int64_t>{0, 32, 64});
  for (int64_t n : {1, 15, 16, 17, 1000, 123457}) {
    for (int size : {1, 2, 3, 7}) {
      const auto b = allreduce_chunk_bounds(n, size, 4);
      REQUIRE(b.size() == static_cast<size_t>(size) + 1);
      CHECK(b.front() == 0);
      CHECK(b.back() == n);
      for (int r = 0; r < size; ++r) {
        CHECK(b[r] <= b[r + 1]);
        CHECK((b[r] % 16 == 0 || b[r] == n));
        CHECK(b[r + 1] - b[r] <= (n + 15) / 16 / size * 16 + 16);
      }
    }
  }
}

TEST_CASE("reduce_scatter over allreduce's chunks sums bitwise as the allreduce",
          "[process_group]") {
  // Three ranks: a sum of three floats depends on its order, so this fails if the chunks (and
  // with them the ring's order) differ.
  run_group(3, [](int rank, ProcessGroup& pg) {
    const int64_t n = 100003;
    Tensor data = Tensor::empty({n});
    Generator gen(77 + static_cast<uint64_t>(rank));
    float* d = data.data<float>();
    for (int64_t i = 0; i < n; ++i) d[i] = gen.normal() * (1 << (i % 20));
    Tensor whole = data.clone();
    pg.allreduce({whole})->wait();
    const auto bounds = allreduce_chunk_bounds(n, 3, 4);
    std::vector<Tensor> pieces;
    for (int r = 0; r < 3; ++r) pieces.push_back(data.slice(0, bounds[r], bounds[r + 1]));
    Tensor mine = Tensor::empty({bounds[rank + 1] - bounds[rank]});
    pg.reduce_scatter(mine, pieces)->wait();
    const Tensor expected = whole.slice(0, bounds[rank], bounds[rank + 1]).contiguous();
    expect(std::memcmp(mine.data<float>(), expected.data<float>(), mine.nbytes()) == 0,
           "the reduce-scatter's slice differs bitwise from the allreduce's");
  });
}

TEST_CASE("async: collectives run in issue order, wait and is_completed", "[process_group]") {
  run_group(2, [](int rank, ProcessGroup& pg) {
    Tensor t = Tensor::full({1000}, rank + 1.0);
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 5; ++i) works.push_back(pg.allreduce({t}, ReduceOp::Sum));
    works.push_back(pg.barrier());
    for (auto& w : works) w->wait(std::chrono::seconds(20));
    for (auto& w : works) expect(w->is_completed(), "work not completed after wait");
    // (1 + 2) * 2^4: each allreduce doubles the sum of the previous one.
    expect_values(t, std::vector<double>(1000, 48.0), "five queued allreduces");

    // An unbounded wait may run the queued collectives on the waiting thread; they still run
    // in issue order, and everything issued before the waited one has completed.
    Tensor a = Tensor::full({10}, rank + 1.0), b = Tensor::full({3000}, rank + 1.0);
    std::vector<std::shared_ptr<Work>> queued;
    for (int i = 0; i < 3; ++i) {
      queued.push_back(pg.allreduce({a}, ReduceOp::Sum));
      queued.push_back(pg.allreduce({b}, ReduceOp::Max));
    }
    queued.push_back(pg.barrier());
    queued.back()->wait();
    for (auto& w : queued) expect(w->is_completed(), "queued work not completed after wait");
    expect_values(a, std::vector<double>(10, 12.0), "queued sums");  // (1 + 2) * 2^2
    expect_values(b, std::vector<double>(3000, 2.0), "queued maxima");
  });
}

TEST_CASE("sync: async_op=false returns completed work, in issue order after queued ones",
          "[process_group]") {
  run_group(2, [](int rank, ProcessGroup& pg) {
    // Every collective in its synchronous form is done when the call returns.
    Tensor t = Tensor::full({1000}, rank + 1.0);
    auto w = pg.allreduce({t}, ReduceOp::Sum, /*async_op=*/false);
    expect(w->is_completed(), "sync allreduce returned before completing");
    expect_values(t, std::vector<double>(1000, 3.0), "sync allreduce");
    Tensor b = Tensor::full({5}, rank + 7.0);
    expect(pg.broadcast({b}, 1, false)->is_completed(), "sync broadcast not completed");
    expect_values(b, std::vector<double>(5, 8.0), "sync broadcast from rank 1");
    std::vector<Tensor> outs{Tensor::zeros({2}), Tensor::zeros({2})};
    expect(pg.allgather(outs, Tensor::full({2}, rank * 10.0), false)->is_completed(),
           "sync allgather not completed");
    expect_values(outs[1], std::vector<double>(2, 10.0), "sync allgather");
    Tensor rs = Tensor::zeros({1});
    pg.reduce_scatter(rs, {Tensor::full({1}, 1.0), Tensor::full({1}, 2.0)}, ReduceOp::Sum, false);
    expect_values(rs, std::vector<double>(1, rank == 0 ? 2.0 : 4.0), "sync reduce_scatter");
    expect(pg.barrier(false)->is_completed(), "sync barrier not completed");

    // Mixed with asynchronous calls: the synchronous one runs after everything queued before
    // it, whichever thread runs it.
    Tensor a = Tensor::full({3000}, rank + 1.0);
    std::vector<std::shared_ptr<Work>> queued;
    for (int i = 0; i < 3; ++i) queued.push_back(pg.allreduce({a}, ReduceOp::Sum));
    pg.allreduce({a}, ReduceOp::Max, false);
    for (auto& q : queued) expect(q->is_completed(), "async work issued earlier not completed");
    expect_values(a, std::vector<double>(3000, 12.0), "three sums then a max");  // 3 * 2^2
    // An asynchronous call after a synchronous one still runs on its own.
    auto later = pg.allreduce({a}, ReduceOp::Sum);
    later->wait(std::chrono::seconds(20));
    expect_values(a, std::vector<double>(3000, 24.0), "async after sync");
  });
}

TEST_CASE("sync: a failing synchronous collective throws from the call", "[process_group]") {
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  std::string error0;
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 2, test_options(std::chrono::seconds(1)));
    if (rank == 0) {
      try {
        pg->allreduce({Tensor::ones({7})}, ReduceOp::Sum, /*async_op=*/false);
      } catch (const Error& e) {
        error0 = e.what();
      }
      rank0_done.set_value();
    } else {
      done.wait();
    }
  });
  CHECK_THAT(error0, Catch::Contains("allreduce(f32[7]) #1 timed out after 1 s"));
}

TEST_CASE("async: a failed Work throws its error from every wait, on any thread",
          "[process_group]") {
  // Each wait throws its own dpar::Error built from the failure's text, so waiters on several
  // threads share no exception object. The waits are bounded so that none runs the collective
  // itself: the communication thread completes the Work and drops its reference while the
  // waiters hold theirs (the timing of the TSan report that led to this cannot be forced; the
  // test holds the behaviour, the same error from every wait).
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  std::vector<std::string> errors(3);
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 2, test_options(std::chrono::seconds(1)));
    if (rank == 0) {
      auto wait_into = [](const std::shared_ptr<Work>& work, std::string& error) {
        try {
          work->wait(std::chrono::seconds(60));
        } catch (const Error& e) {
          error = e.what();
        }
      };
      std::shared_ptr<Work> work = pg->allreduce({Tensor::ones({5})}, ReduceOp::Sum);
      std::thread a(wait_into, work, std::ref(errors[0]));
      std::thread b(wait_into, work, std::ref(errors[1]));
      a.join();
      b.join();
      wait_into(work, errors[2]);
      rank0_done.set_value();
    } else {
      done.wait();
    }
  });
  CHECK_THAT(errors[0], Catch::Contains("allreduce(f32[5]) #1 timed out after 1 s"));
  CHECK(errors[1] == errors[0]);
  CHECK(errors[2] == errors[0]);
}

TEST_CASE("a world of one needs no store and copies locally", "[process_group]") {
  auto pg = make_gloo_group(nullptr, 0, 1, test_options());
  Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  pg->allreduce({t}, ReduceOp::Avg)->wait();
  CHECK(t.to_float_vector() == std::vector<float>{1, 2, 3});
  Tensor out = Tensor::zeros({3});
  pg->allgather({out}, t)->wait();
  CHECK(out.to_float_vector() == std::vector<float>{1, 2, 3});
  Tensor rs = Tensor::zeros({3});
  pg->reduce_scatter(rs, {t}, ReduceOp::Sum)->wait();
  CHECK(rs.to_float_vector() == std::vector<float>{1, 2, 3});
  pg->barrier()->wait();
  CHECK_THROWS_WITH(pg->allreduce({Tensor::zeros({2}, DType::u8)}),
                    Catch::Contains("allreduce") && Catch::Contains("u8"));
}

TEST_CASE("Group routes CPU tensors to one lazily created Gloo backend", "[process_group]") {
  run_ranks(2, [](int rank, std::shared_ptr<Store> store) {
    Group group(store, rank, 2, test_options());
    // Several threads asking at once still create (and rendezvous) exactly one backend.
    std::vector<std::shared_ptr<ProcessGroup>> seen(3);
    std::vector<std::thread> askers;
    for (int i = 0; i < 3; ++i) {
      askers.emplace_back([&, i] { seen[i] = group.backend_ptr_for(Device::cpu()); });
    }
    for (auto& a : askers) a.join();
    expect(seen[0] == seen[1] && seen[1] == seen[2], "backend created more than once");
    expect(seen[0]->backend_name() == "gloo", "CPU backend is not gloo");
    Tensor t = Tensor::full({4}, rank + 1.0);
    group.allreduce({t}, ReduceOp::Avg)->wait();
    expect_values(t, std::vector<double>(4, 1.5), "Group allreduce avg");
    group.barrier();
  });
}

TEST_CASE("Group: CUDA tensors name the device and the missing backend", "[process_group]") {
  if (built_with_cuda()) {
    SUCCEED("built with CUDA: routing of CUDA tensors is covered by the GPU tests");
    return;
  }
  // A tensor that claims to live on cuda:0; routing fails before its memory is touched.
  float fake[4] = {};
  auto storage = std::make_shared<Storage>(fake, sizeof(fake), Device::cuda(0), nullptr);
  Tensor t = Tensor::from_storage(storage, 0, {4}, {1}, DType::f32);
  Group group(nullptr, 0, 1, test_options());
  CHECK_THROWS_WITH(group.allreduce({t}), Catch::Contains("cuda:0") &&
                                              Catch::Contains("built without CUDA") &&
                                              Catch::Contains("NCCL"));
  CHECK_THROWS_WITH(group.allreduce({t, Tensor::zeros({4})}), Catch::Contains("one device"));
}

TEST_CASE("Group: the CUDA backend option is nccl or gloo", "[process_group]") {
  ProcessGroupOptions options = test_options();
  options.cuda_backend = "mpi";
  CHECK_THROWS_WITH(Group(nullptr, 0, 1, options),
                    Catch::Contains("unknown collective backend 'mpi' (expected nccl or gloo)"));
  setenv("DPAR_DIST_BACKEND", "NCCL2", 1);
  CHECK_THROWS_WITH(ProcessGroupOptions::from_env(),
                    Catch::StartsWith("DPAR_DIST_BACKEND: unknown collective backend 'NCCL2'"));
  setenv("DPAR_DIST_BACKEND", "gloo", 1);
  CHECK(ProcessGroupOptions::from_env().cuda_backend == "gloo");
  unsetenv("DPAR_DIST_BACKEND");
  CHECK(ProcessGroupOptions::from_env().cuda_backend == "nccl");
}

TEST_CASE("timeout: a rank that skips a collective is named", "[process_group]") {
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  std::string error0, later0;
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 2, test_options(std::chrono::seconds(2)));
    Tensor t = Tensor::ones({7});
    pg->allreduce({t})->wait();  // #1 on both ranks
    if (rank == 0) {
      try {
        pg->allreduce({Tensor::ones({7})})->wait();  // #2: rank 1 never calls it
      } catch (const Error& e) {
        error0 = e.what();
      }
      try {
        pg->barrier()->wait();
      } catch (const Error& e) {
        later0 = e.what();
      }
      rank0_done.set_value();
    } else {
      done.wait();  // keep the connections open until rank 0 has seen its timeout
    }
  });
  INFO(error0);
  CHECK(error0.find('\n') == std::string::npos);
  CHECK_THAT(error0, Catch::Contains("allreduce(f32[7]) #2 timed out after 2 s") &&
                         Catch::Contains("rank 0 (world size 2)") &&
                         Catch::Contains("have not arrived: 1 (last entered #1)"));
  CHECK_THAT(later0, Catch::Contains("barrier() #3") && Catch::Contains("failed earlier"));
}

TEST_CASE("DPAR_DEBUG=DETAIL: mismatched collectives fail on every rank", "[process_group]") {
  std::vector<std::string> errors(2), skipped(2);
  ProcessGroupOptions options = test_options(std::chrono::seconds(10));
  options.debug_detail = true;
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 2, options);
    try {
      pg->allreduce({Tensor::ones({rank == 0 ? 1000 : 999})})->wait();
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
    // The group stays usable after a mismatch.
    Tensor t = Tensor::ones({3});
    pg->allreduce({t})->wait();
    expect_values(t, {2, 2, 2}, "allreduce after a mismatch");
    try {
      if (rank == 0) {
        pg->barrier()->wait();
      } else {
        pg->broadcast({Tensor::ones({2})}, 0)->wait();
      }
    } catch (const Error& e) {
      skipped[rank] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(errors[r], Catch::Contains("collective mismatch at #1: rank 0 called "
                                          "allreduce(f32[1000]) but rank 1 called "
                                          "allreduce(f32[999])"));
    CHECK_THAT(skipped[r], Catch::Contains("collective mismatch at #3: rank 0 called barrier() "
                                           "but rank 1 called broadcast(f32[2], root 0)"));
  }
}
