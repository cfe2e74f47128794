#pragma once
// Two ranks as threads of one test process: one StoreServer on loopback and, per rank, its own
// StoreClient and Gloo Group (tests of DataParallel and sharding).
#include <array>
#include <exception>
#include <future>
#include <memory>
#include <string>

#include "dpar/distributed/process_group.h"
#include "dpar/distributed/store.h"

namespace dpar::test {

// Runs fn(rank, group) on two threads (ranks 0 and 1) against one loopback store.
template <class F>
auto run_two_ranks(F fn, dist::Millis collective_timeout = std::chrono::seconds(30)) {
  dist::StoreServer server("127.0.0.1", 0, "dp-test", 2);
  const std::string endpoint = server.endpoint();
  using R = decltype(fn(0, std::shared_ptr<dist::Group>()));
  auto body = [&](int rank) -> R {
    dist::StoreClientOptions so;
    so.connect_timeout = std::chrono::seconds(20);
    so.timeout = std::chrono::seconds(30);
    so.log_waiting = false;
    auto store =
        std::make_shared<dist::StoreClient>(endpoint, dist::StoreIdentity{"dp-test", 2, rank}, so);
    dist::ProcessGroupOptions po;
    po.timeout = collective_timeout;
    auto group = std::make_shared<dist::Group>(store, rank, 2, po);
    return fn(rank, group);
  };
  auto second = std::async(std::launch::async, body, 1);
  R first{};
  std::exception_ptr error;
  try {
    first = body(0);
  } catch (...) {
    error = std::current_exception();
  }
  R other = second.get();
  if (error) std::rethrow_exception(error);
  return std::array<R, 2>{std::move(first), std::move(other)};
}

}  // namespace dpar::test
