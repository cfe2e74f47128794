#include "distributed/gloo/gloo_terminate.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <string>

#include "distributed/flight_recorder.h"

namespace dpar::dist::detail {
namespace {

std::mutex groups_mutex;
std::map<const void*, std::function<std::string()>>& groups() {
  static auto* live = new std::map<const void*, std::function<std::string()>>();  // never freed:
  return *live;  // the handler may run while static destructors do
}
std::terminate_handler previous_handler = nullptr;

// "[enforce fail at ./gloo/transport/tcp/pair.cc:488] it != localPendingRecv_.end(). " as
// "enforce fail at ./gloo/transport/tcp/pair.cc:488: it != localPendingRecv_.end()": Gloo's
// location stays, for whoever reads Gloo's source next.
std::string one_line(std::string text) {
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find("] ");
    if (close != std::string::npos)
      text = text.substr(1, close - 1) + ": " + text.substr(close + 2);
  }
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '.')) text.pop_back();
  return text;
}

// What Gloo threw, or empty for anything else.
std::string gloo_failure(const std::exception_ptr& e) {
  if (!e) return {};
  try {
    std::rethrow_exception(e);
  } catch (const gloo::EnforceNotMet& x) {
    return one_line(x.what());
  } catch (const gloo::Exception& x) {
    return one_line(x.what());
  } catch (...) {
  }
  return {};
}

[[noreturn]] void on_terminate() {
  const std::string what = gloo_failure(std::current_exception());
  // try_lock: the thread that holds it may be the one that is stuck.
  if (!what.empty() && groups_mutex.try_lock()) {
    for (const auto& [group, describe] : groups()) {
      std::fprintf(stderr,
                   "dpar: %s: Gloo's network thread failed (%s): a frame on a Gloo connection was "
                   "corrupted in transit or forged, and Gloo cannot recover from it, so the "
                   "process stops\n",
                   describe().c_str(), what.c_str());
    }
    groups_mutex.unlock();
    // What each group did last, for dpar-launch's verdict: the other ranks only see that this
    // one went away.
    const std::string record = dump_flight_records("Gloo's network thread failed: " + what);
    if (!record.empty())
      std::fprintf(stderr, "dpar: flight record written to %s\n", record.c_str());
    std::fflush(stderr);
  }
  if (previous_handler != nullptr) previous_handler();
  std::abort();
}

}  // namespace

void note_gloo_group(const void* group, std::function<std::string()> describe) {
  static std::once_flag installed;
  std::call_once(installed, [] { previous_handler = std::set_terminate(on_terminate); });
  std::lock_guard<std::mutex> lock(groups_mutex);
  groups()[group] = std::move(describe);
}

void forget_gloo_group(const void* group) {
  std::lock_guard<std::mutex> lock(groups_mutex);
  groups().erase(group);
}

}  // namespace dpar::dist::detail
