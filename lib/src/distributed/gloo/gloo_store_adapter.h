#pragma once
// Lets Gloo's rendezvous (gloo::rendezvous::Context::connectFullMesh) run over a dpar Store,
// so the gRPC store that every rank already talks to also exchanges Gloo's pair addresses.
#include <gloo/rendezvous/store.h>

#include <memory>
#include <string>
#include <vector>

#include "dpar/distributed/store.h"

namespace dpar::dist::detail {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  // timeout: how long get()/wait() without an explicit timeout wait for a key (the group's).
  GlooStoreAdapter(std::shared_ptr<dist::Store> store, Millis timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<dist::Store> store_;
  Millis timeout_;
};

}  // namespace dpar::dist::detail
