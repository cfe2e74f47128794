#include "distributed/gloo/gloo_store_adapter.h"

#include <algorithm>
#include <cctype>

#include "dpar/core/error.h"

namespace dpar::dist::detail {

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  // Wait with the group's timeout rather than the store's default, so a rank that never
  // joins fails the rendezvous when the group's timeout says so.
  store_->wait({key}, timeout_);
  const Bytes value = store_->get(key);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  // Gloo passes kNoTimeout (zero) to mean "the default".
  try {
    store_->wait(keys, timeout.count() > 0 ? Millis(timeout) : timeout_);
  } catch (const Error& e) {
    // Gloo's rendezvous keys are the ranks' numbers: name the ranks that never published.
    std::string missing;
    try {
      for (const std::string& k : keys) {
        const bool numeric = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c)) != 0;
        });
        if (numeric && !store_->check({k})) missing += (missing.empty() ? "" : ", ") + k;
      }
    } catch (const std::exception&) {
      throw e;
    }
    if (missing.empty()) throw;
    DPAR_FAIL("rank ", missing, " did not join (", e.what(), ")");
  }
}

}  // namespace dpar::dist::detail
