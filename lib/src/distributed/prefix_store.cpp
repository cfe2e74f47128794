// PrefixStore: one key namespace per process group on top of a shared store.
#include "dpar/core/error.h"
#include "dpar/distributed/store.h"

namespace dpar::dist {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  DPAR_CHECK(base_ != nullptr, "PrefixStore('", prefix_, "'): the base store is null");
  timeout_ = base_->timeout();
}

void PrefixStore::set(const std::string& k, const Bytes& value) { base_->set(key(k), value); }

Bytes PrefixStore::get(const std::string& k) {
  // Store::get waits with the store's own timeout; honour this view's timeout (which may have
  // been changed with set_timeout) by waiting here first. Keys are never deleted, so the get
  // that follows finds the key at once.
  const std::string full = key(k);
  base_->wait({full}, timeout_);
  return base_->get(full);
}

int64_t PrefixStore::add(const std::string& k, int64_t delta) { return base_->add(key(k), delta); }

Bytes PrefixStore::compare_set(const std::string& k, const Bytes& expected, const Bytes& desired) {
  return base_->compare_set(key(k), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(key(k));
  base_->wait(full, timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(key(k));
  return base_->check(full);
}

}  // namespace dpar::dist
