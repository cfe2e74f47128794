// The shared-memory collectives of ranks on one host (distributed/gloo/shm_collectives.h) and
// the hierarchical ring of ranks on several hosts (hybrid_ring.h): bitwise the TCP ring's
// results; a mismatched call, or a rank that gives up, fails every rank instead of passing
// silently or hanging. Ranks are threads of this process, each with its own store client and
// groups.
#include <cstring>
#include <future>
#include <latch>

#include "distributed/gloo/hybrid_ring.h"
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

// Values whose sums depend on their order (see above), different on every rank.
Tensor wide_range(Generator& gen, int64_t n, DType dtype) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = gen.normal() * static_cast<float>(1 << (i % 12));
  return Tensor::from_vector(v, {n}).to(dtype);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

// Uneven splits of n elements over the ranks (one rank's part empty when there are 3 or more),
// as sharded DataParallel's buckets give them.
std::vector<int64_t> uneven_bounds(int64_t n, int size) {
  std::vector<int64_t> bounds{0};
  for (int r = 0; r < size; ++r) {
    const int64_t share = r + 1 == size         ? n - bounds.back()
                          : r == 1 && size >= 3 ? 0
                                                : n / size + (r % 2 ? 3 : -3);
    bounds.push_back(bounds.back() + std::max<int64_t>(share, 0));
  }
  bounds.back() = n;
  return bounds;
}

std::vector<Tensor> split(const Tensor& flat, const std::vector<int64_t>& bounds) {
  std::vector<Tensor> pieces;
  for (size_t r = 0; r + 1 < bounds.size(); ++r)
    pieces.push_back(flat.slice(0, bounds[r], bounds[r + 1]));
  return pieces;
}

// reduce_scatter and allgather over uneven chunks (one piece, several, uneven last pieces), in
// place on views of one buffer as sharded DataParallel calls them and into separate tensors,
// bitwise the TCP ring's.
void expect_same_bits_scatter_gather(ProcessGroup& shm, ProcessGroup& tcp, int rank, int size) {
  Generator gen(2000 + static_cast<uint64_t>(rank));
  const auto me = static_cast<size_t>(rank);
  for (int64_t n : {int64_t{5}, int64_t{100003}, int64_t{1000003}}) {
    const std::vector<int64_t> bounds = uneven_bounds(n, size);
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
        const std::string what = std::string(dtype_name(dtype)) + " " + reduce_op_name(op) +
                                 " n=" + std::to_string(n) + " on " + std::to_string(size) +
                                 " ranks";
        // In place: this rank's chunk of the flat buffer receives the result.
        Tensor a = wide_range(gen, n, dtype), b = a.clone();
        std::vector<Tensor> pa = split(a, bounds), pb = split(b, bounds);
        shm.reduce_scatter(pa[me], pa, op)->wait();
        tcp.reduce_scatter(pb[me], pb, op)->wait();
        expect(same_bytes(pa[me], pb[me]), "reduce_scatter in place, " + what + ": differs");
        // Into a separate output; the inputs stay as they were.
        Tensor c = wide_range(gen, n, dtype), keep = c.clone();
        Tensor oc = Tensor::zeros({bounds[me + 1] - bounds[me]}, dtype), ot = oc.clone();
        shm.reduce_scatter(oc, split(c, bounds), op)->wait();
        tcp.reduce_scatter(ot, split(c, bounds), op)->wait();
        expect(same_bytes(oc, ot), "reduce_scatter, " + what + ": differs");
        expect(same_bytes(c, keep), "reduce_scatter, " + what + ": changed its inputs");
      }
      // allgather in place (the input is this rank's slice of the outputs) and from a separate
      // input: every rank ends with every rank's slice.
      Tensor g = wide_range(gen, n, dtype), h = Tensor::zeros({n}, dtype);
      std::vector<Tensor> pg = split(g, bounds), ph = split(h, bounds);
      Tensor mine = pg[me].clone();
      shm.allgather(pg, pg[me])->wait();
      shm.allgather(ph, mine)->wait();
      Tensor t = Tensor::zeros({n}, dtype);
      tcp.allgather(split(t, bounds), mine)->wait();
      expect(same_bytes(g, t) && same_bytes(h, t), "allgather " + std::string(dtype_name(dtype)) +
                                                       " n=" + std::to_string(n) +
                                                       " differs from the TCP ring's");
    }
  }
  // Non-contiguous inputs and outputs go through the staging buffer.
  Tensor x = Tensor::from_vector(std::vector<float>(6 * size, 0.5f * static_cast<float>(rank + 1)),
                                 {6, static_cast<int64_t>(size)});
  std::vector<Tensor> cols, shm_out, tcp_out;
  for (int r = 0; r < size; ++r) {
    cols.push_back(x.slice(1, r, r + 1));  // strided columns
    shm_out.push_back(Tensor::zeros({6, 2}).slice(1, 0, 1));
    tcp_out.push_back(Tensor::zeros({6, 1}));
  }
  Tensor so = Tensor::zeros({6, 2}).slice(1, 1, 2), to = Tensor::zeros({6, 1});
  shm.reduce_scatter(so, cols, ReduceOp::Sum)->wait();
  tcp.reduce_scatter(to, cols, ReduceOp::Sum)->wait();
  expect(same_bytes(so, to), "non-contiguous reduce_scatter differs from the TCP ring's");
  shm.allgather(shm_out, cols[me])->wait();
  tcp.allgather(tcp_out, cols[me])->wait();
  for (int r = 0; r < size; ++r) {
    expect(same_bytes(shm_out[static_cast<size_t>(r)], tcp_out[static_cast<size_t>(r)]),
           "non-contiguous allgather differs from the TCP ring's at rank " + std::to_string(r));
  }
}

// This rank's group through shared memory (the default) and one with it off (the TCP ring).
std::pair<std::shared_ptr<ProcessGroup>, std::shared_ptr<ProcessGroup>> shm_and_tcp(
    const std::shared_ptr<Store>& store, int rank, int size) {
  ProcessGroupOptions tcp_options = test_options();
  tcp_options.shared_memory = false;
  auto shm = make_gloo_group(store, rank, size, test_options());
  return {shm, make_gloo_group(store, rank, size, tcp_options)};
}

}  // namespace

TEST_CASE("allreduce through shared memory is bitwise the TCP ring's", "[shm]") {
  // Ranks of one host reduce through a shared segment; with shared_memory off, through Gloo's
  // TCP ring.
  for (int size : {2, 3, 4}) {
    run_ranks(size, [&](int rank, std::shared_ptr<Store> store) {
      auto [shm, tcp] = shm_and_tcp(store, rank, size);
      expect(gloo_of(*shm).transport() == "shared memory",
             "same-host ranks use " + gloo_of(*shm).transport());
      expect(gloo_of(*tcp).transport() == "tcp (turned off (DPAR_SHM=0))",
             "DPAR_SHM=0 gives " + gloo_of(*tcp).transport());
      expect_same_bits(*shm, *tcp, rank, size);
    });
  }
}

TEST_CASE("reduce_scatter and allgather through shared memory are bitwise the TCP ring's",
          "[shm]") {
  for (int size : {2, 3, 4}) {
    run_ranks(size, [&](int rank, std::shared_ptr<Store> store) {
      auto [shm, tcp] = shm_and_tcp(store, rank, size);
      expect_same_bits_scatter_gather(*shm, *tcp, rank, size);
    });
  }
}

namespace {

// Broadcasts from every root: one element, 64 KB and about, 12 MiB (several pieces or segments,
// an odd tail), and a fused pair of dtypes through the staging buffer. Then a
// barrier that every rank has reached.
void expect_broadcasts_and_barrier(ProcessGroup& pg, Store& store, int rank, int size) {
  for (int root = 0; root < size; ++root) {
    for (int64_t n : {int64_t{1}, int64_t{16383}, int64_t{16384}, int64_t{3 * 1024 * 1024 + 7}}) {
      Generator gen(77 + static_cast<uint64_t>(n));  // the same values on every rank
      const Tensor expected = wide_range(gen, n, DType::f32);
      Tensor t = rank == root ? expected.clone() : Tensor::zeros({n});
      pg.broadcast({t}, root)->wait();
      expect(same_bytes(t, expected), "broadcast of " + std::to_string(n) + " from rank " +
                                          std::to_string(root) + " differs on rank " +
                                          std::to_string(rank));
    }
    Tensor f = Tensor::full({3, 5}, rank == root ? 2.5f : 0.0f).transpose(0, 1);
    Tensor i = Tensor::full({4}, rank == root ? 7.0f : 0.0f).to(DType::i64);
    pg.broadcast({f, i}, root)->wait();
    expect(f.to_float_vector() == std::vector<float>(15, 2.5f) &&
               i.to_float_vector() == std::vector<float>(4, 7.0f),
           "fused broadcast from rank " + std::to_string(root) + " differs on rank " +
               std::to_string(rank));
  }
  // Every rank's key is set before it reaches the barrier, so after it all are there.
  store.set("before-barrier/" + std::to_string(rank), {1});
  pg.barrier()->wait();
  for (int r = 0; r < size; ++r)
    expect(store.check({"before-barrier/" + std::to_string(r)}),
           "rank " + std::to_string(r) + " had not reached the barrier");
}

}  // namespace

TEST_CASE("broadcast and barrier through shared memory", "[shm]") {
  for (int size : {2, 3}) {
    run_ranks(size, [&](int rank, std::shared_ptr<Store> store) {
      auto pg = make_gloo_group(store, rank, size, test_options());
      expect_broadcasts_and_barrier(*pg, *store, rank, size);
    });
  }
}

TEST_CASE("broadcast and barrier over several hosts", "[shm]") {
  // The mixed ring's chain at every size (two hosts; a host across the ring's wrap); Gloo's tree
  // for one segment and the chain for 12 MiB where the chain's 4 TCP hops outnumber the tree's 3
  // rounds (hosts of 2+1+1+1); the tree alone where no hop is shared memory.
  struct Layout {
    std::vector<std::string> hosts;
    std::string transport;
  };
  for (
      const Layout& layout : std::vector<Layout>{
          {{"a", "a", "b", "b"}, "shared memory within hosts (2 of 4 ring hops), tcp between them"},
          {{"a", "b", "b", "a"}, "shared memory within hosts (2 of 4 ring hops), tcp between them"},
          {{"a", "a", "b", "c", "d"},
           "shared memory within hosts (1 of 5 ring hops), tcp between them"},
          {{"a", "b", "a", "b"},
           "tcp (the ranks run on 2 hosts; no two neighbouring ranks of the ring share a host)"}}) {
    const int size = static_cast<int>(layout.hosts.size());
    run_ranks(size, [&](int rank, std::shared_ptr<Store> store) {
      ProcessGroupOptions options = test_options();
      options.host_identity = "host " + layout.hosts[static_cast<size_t>(rank)];
      auto pg = make_gloo_group(store, rank, size, options);
      expect(gloo_of(*pg).transport() == layout.transport,
             "the group's transport is " + gloo_of(*pg).transport());
      expect_broadcasts_and_barrier(*pg, *store, rank, size);
    });
  }
}

TEST_CASE("a broadcast over several hosts takes the chain where it is the shorter way", "[shm]") {
  using dist::detail::chain_broadcast_pays;
  constexpr size_t kSegment = dist::detail::ShmLink::kSlotBytes;  // the chain's segment
  // No hop through shared memory: the tree.
  CHECK_FALSE(chain_broadcast_pays(4, 0, 100 << 20));
  // Two hosts of two: 2 TCP hops, 2 rounds: the chain at every size.
  CHECK(chain_broadcast_pays(4, 2, 4));
  CHECK(chain_broadcast_pays(4, 2, kSegment));
  CHECK(chain_broadcast_pays(4, 2, kSegment + 1));
  CHECK(chain_broadcast_pays(4, 2, 64 * kSegment));
  // Two hosts of eight: 2 TCP hops against 4 rounds, but 15 hops in all: the tree while latency
  // counts, the chain once the message is cut into segments.
  CHECK_FALSE(chain_broadcast_pays(16, 14, 64 << 10));
  CHECK(chain_broadcast_pays(16, 14, 2 * kSegment));
  // Hosts of 2+1+1+1: 4 TCP hops against 3 rounds: the tree up to 1.625 segments.
  CHECK_FALSE(chain_broadcast_pays(5, 1, kSegment));
  CHECK_FALSE(chain_broadcast_pays(5, 1, kSegment + kSegment / 2));
  CHECK(chain_broadcast_pays(5, 1, 2 * kSegment));
  // Eight hosts, one of two ranks: 8 TCP hops against 4 rounds: the tree up to ~2.4 segments.
  CHECK_FALSE(chain_broadcast_pays(9, 1, 2 * kSegment));
  CHECK(chain_broadcast_pays(9, 1, 3 * kSegment));
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
      expect(gloo_of(*hybrid).transport() == layout.transport,
             "the group's transport is " + gloo_of(*hybrid).transport());
      expect_same_bits(*hybrid, *tcp, rank, size);
      expect_same_bits_scatter_gather(*hybrid, *tcp, rank, size);
    });
  }
}

TEST_CASE("a rank that gives up on a hierarchical collective fails the ranks across its hops",
          "[shm]") {
  // Two hosts of two: rank 2 is aborted before an allreduce (the ring) or a broadcast from rank
  // 1 (the chain 1 -> 2 -> 3 -> 0; rank 1's TCP send to rank 2 fails). Rank 3 waits on rank 2's
  // shared-memory hop and must fail at once with rank 2's reason, not at the timeout; the
  // failure goes on around the ring (TCP hops close), so every rank fails well within it.
  for (const bool broadcast : {false, true}) {
    std::vector<std::string> errors(4);
    std::vector<double> seconds(4);
    run_ranks(4, [&](int rank, std::shared_ptr<Store> store) {
      ProcessGroupOptions options = test_options(std::chrono::seconds(60));
      options.host_identity = rank < 2 ? "host a" : "host b";
      auto pg = make_gloo_group(store, rank, 4, options);
      Tensor t = Tensor::ones({300000});
      auto collective = [&] {
        broadcast ? pg->broadcast({t}, 1)->wait() : pg->allreduce({t})->wait();
      };
      collective();  // connected and working
      if (rank == 2) pg->abort("stopped by the test");
      const auto start = std::chrono::steady_clock::now();
      try {
        collective();
      } catch (const Error& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
      seconds[static_cast<size_t>(rank)] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
    for (int r = 0; r < 4; ++r) {
      INFO((broadcast ? "broadcast" : "allreduce")
           << ", rank " << r << ": " << errors[static_cast<size_t>(r)]);
      CHECK_FALSE(errors[static_cast<size_t>(r)].empty());
      CHECK(seconds[static_cast<size_t>(r)] < 30);
    }
    CHECK_THAT(errors[3], Catch::Contains("rank 2 gave up on the collective") &&
                              Catch::Contains("stopped by the test"));
  }
}

TEST_CASE("a rank that gives up mid-chain fails the ranks behind it over TCP too", "[shm]") {
  // Hosts of 2+1+1+1: a 12 MiB broadcast from rank 0 is the chain 0 -> 1 (shared memory) -> 2
  // -> 3 -> 4 (TCP). Rank 2 is aborted: rank 1's send and rank 3's receive fail, and rank 3,
  // whose hops are both TCP, must close its connections so that rank 4 fails too, instead of
  // waiting out the 60 s timeout for a segment rank 3 will never send. Every rank keeps its group
  // until all are done, as a process that handles the error would: no socket closes by exiting.
  const std::vector<std::string> hosts = {"a", "a", "b", "c", "d"};
  std::vector<std::string> errors(5);
  std::vector<double> seconds(5);
  std::latch all_done(5);
  run_ranks(5, [&](int rank, std::shared_ptr<Store> store) {
    ProcessGroupOptions options = test_options(std::chrono::seconds(60));
    options.host_identity = "host " + hosts[static_cast<size_t>(rank)];
    auto pg = make_gloo_group(store, rank, 5, options);
    Tensor t = Tensor::ones({3 << 20});
    pg->broadcast({t}, 0)->wait();  // connected and working
    if (rank == 2) pg->abort("stopped by the test");
    const auto start = std::chrono::steady_clock::now();
    try {
      pg->broadcast({t}, 0)->wait();
    } catch (const Error& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
    seconds[static_cast<size_t>(rank)] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    all_done.arrive_and_wait();
  });
  for (int r = 1; r < 5; ++r) {  // rank 0's part (its hop to rank 1) may well have finished
    INFO("rank " << r << ": " << errors[static_cast<size_t>(r)]);
    CHECK_FALSE(errors[static_cast<size_t>(r)].empty());
    CHECK(seconds[static_cast<size_t>(r)] < 30);
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
                      Catch::Contains(" elements of f32 (sum), rank ") && Catch::Contains("1000") &&
                      Catch::Contains("999") &&
                      Catch::Contains("the ranks called different collectives"));
  }
}

TEST_CASE("ranks that call different collectives through shared memory all fail, naming both",
          "[shm]") {
  // One rank all-gathers where the other reduce-scatters the same bytes, the ranks name
  // different roots, split the same bytes differently, or reduce with different ops: the segment
  // would mix them silently, so every rank fails naming both calls.
  struct Case {
    std::string rank0, rank1;
  };
  const std::vector<Case> cases = {
      {"all-gathers 100 elements of f32 in chunks of [50, 50]",
       "reduce-scatters 100 elements of f32 (sum) in chunks of [50, 50]"},
      {"broadcasts 400 bytes from rank 0", "broadcasts 400 bytes from rank 1"},
      {"reduce-scatters 100 elements of f32 (sum) in chunks of [50, 50]",
       "reduce-scatters 100 elements of f32 (sum) in chunks of [60, 40]"},
      {"all-reduces 100 elements of f32 (sum)", "all-reduces 100 elements of f32 (avg)"},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    std::vector<std::string> errors(2);
    run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
      auto pg = make_gloo_group(store, rank, 2, test_options(std::chrono::seconds(5)));
      Tensor t = Tensor::ones({100});
      try {
        if (k == 0 && rank == 0)
          pg->allgather({t.slice(0, 0, 50), t.slice(0, 50, 100)}, t.slice(0, 0, 50))->wait();
        if (k == 0 && rank == 1)
          pg->reduce_scatter(t.slice(0, 50, 100), {t.slice(0, 0, 50), t.slice(0, 50, 100)})->wait();
        if (k == 1) pg->broadcast({t}, rank)->wait();
        if (k == 2) {
          const int64_t cut = rank == 0 ? 50 : 60;
          pg->reduce_scatter(Tensor::zeros({rank == 0 ? cut : 100 - cut}),
                             {t.slice(0, 0, cut), t.slice(0, cut, 100)})
              ->wait();
        }
        if (k == 3) pg->allreduce({t}, rank == 0 ? ReduceOp::Sum : ReduceOp::Avg)->wait();
      } catch (const Error& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
    for (const std::string& e : errors) {
      INFO(e);
      CHECK_THAT(e, Catch::Contains("failed on rank") && Catch::Contains(cases[k].rank0) &&
                        Catch::Contains(cases[k].rank1) &&
                        Catch::Contains("the ranks called different collectives"));
    }
  }
}

TEST_CASE("an abort ends a wait in a shared-memory allgather at once", "[shm]") {
  // Rank 1 never calls: rank 0's communication thread waits in the segment until its group is
  // aborted (as an elastic job aborts the group of a member that stopped), then fails naming why,
  // long before the 60 s timeout.
  std::string error;
  double seconds = 0;
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 2, test_options(std::chrono::seconds(60)));
    if (rank == 1) {
      store->wait({"abort-test/done"}, std::chrono::seconds(60));
      return;
    }
    Tensor t = Tensor::ones({100});
    auto work = pg->allgather({t.slice(0, 0, 50), t.slice(0, 50, 100)}, t.slice(0, 0, 50));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto start = std::chrono::steady_clock::now();
    pg->abort("stopped by the test");
    try {
      work->wait();
    } catch (const Error& e) {
      error = e.what();
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    store->set("abort-test/done", {1});
  });
  INFO(error);
  CHECK_THAT(error,
             Catch::Contains("allgather") && Catch::Contains("aborted: stopped by the test"));
  CHECK(seconds < 10);
}

TEST_CASE("a rank that gives up fails the ranks waiting for it in shared memory at once", "[shm]") {
  // Rank 1 is aborted (as an elastic job aborts the group of a stopped member) while rank 0
  // waits for it in a barrier: over TCP the closed sockets would tell rank 0; here the segment
  // does, long before the 60 s timeout.
  std::string error;
  double seconds = 0;
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 2, test_options(std::chrono::seconds(60)));
    pg->barrier()->wait();  // both connected
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      pg->abort("stopped by the test");
      store->wait({"give-up-test/done"}, std::chrono::seconds(60));
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      pg->barrier()->wait();
    } catch (const Error& e) {
      error = e.what();
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    store->set("give-up-test/done", {1});
  });
  INFO(error);
  CHECK_THAT(error, Catch::Contains("barrier() #2 failed on rank 0") &&
                        Catch::Contains("rank 1 gave up on the collective: aborted: stopped by "
                                        "the test"));
  CHECK(seconds < 10);
}
