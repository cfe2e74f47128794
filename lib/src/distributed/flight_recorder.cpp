#include "distributed/flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

namespace dpar::dist::detail {
namespace {

constexpr size_t kDefaultEntries = 2000;

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int this_thread_id() {
  thread_local const int id = static_cast<int>(::syscall(SYS_gettid));
  return id;
}

thread_local std::string current_label;

// DPAR_FLIGHT_RECORDER_SIZE, read once. A bad value is reported once and recording stays on
// at the default: a diagnostic switch must not stop a job.
size_t ring_entries() {
  static const size_t entries = [] {
    const char* text = std::getenv("DPAR_FLIGHT_RECORDER_SIZE");
    if (text == nullptr || *text == '\0') return kDefaultEntries;
    char* end = nullptr;
    const long long n = std::strtoll(text, &end, 10);
    if (end == text || *end != '\0' || n < 0 || n > 1000000) {
      std::fprintf(stderr,
                   "dpar: DPAR_FLIGHT_RECORDER_SIZE: expected a number of entries in 0..1000000, "
                   "got '%s'; recording %zu\n",
                   text, kDefaultEntries);
      return kDefaultEntries;
    }
    return static_cast<size_t>(n);
  }();
  return entries;
}

// The live recorders, for the dump. Never freed: a dump may run while statics are destroyed.
struct Registry {
  std::mutex mutex;
  std::vector<const FlightRecorder*> recorders;
  int first_rank = -1;
  std::mutex dump_mutex;  // one dump at a time (a timeout and SIGUSR1 may coincide)
};
Registry& registry() {
  static auto* r = new Registry();
  return *r;
}

// SIGUSR1: the handler only writes a byte to a pipe (async-signal-safe); a thread of ours reads
// it and dumps. Installed once, where SIGUSR1 has its default action.
int signal_pipe[2] = {-1, -1};

void on_sigusr1(int) {
  const int saved = errno;
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(signal_pipe[1], &byte, 1);
  errno = saved;
}

void dump_on_signal_loop() {
  for (;;) {
    char byte = 0;
    const ssize_t n = ::read(signal_pipe[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    const std::string path = dump_flight_records("SIGUSR1");
    if (!path.empty())
      std::fprintf(stderr, "dpar: flight record written to %s (SIGUSR1)\n", path.c_str());
  }
}

void install_signal_dump() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGUSR1, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
    if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return;
    // The reading end blocks: the thread sleeps until a signal arrives.
    ::fcntl(signal_pipe[0], F_SETFL, ::fcntl(signal_pipe[0], F_GETFL) & ~O_NONBLOCK);
    std::thread(dump_on_signal_loop).detach();
    struct sigaction action {};
    action.sa_handler = on_sigusr1;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (::sigaction(SIGUSR1, &action, nullptr) != 0) return;
    // Tells dpar-launch that this process answers SIGUSR1 with a record: to any other program
    // (or a rank before it made a group) SIGUSR1 would be a kill, so the launcher sends it
    // only where this file exists.
    if (const char* dir = std::getenv("DPAR_FLIGHT_RECORDER_DIR"); dir != nullptr && *dir != '\0') {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      std::ofstream(std::filesystem::path(dir) / ("listening." + std::to_string(::getpid())));
    }
  });
}

std::filesystem::path dump_dir() {
  for (const char* name : {"DPAR_FLIGHT_RECORDER_DIR", "TMPDIR"}) {
    const char* dir = std::getenv(name);
    if (dir != nullptr && *dir != '\0') return dir;
  }
  return "/tmp";
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

}  // namespace

CollectiveLabel::CollectiveLabel(std::string label) : previous_(std::move(current_label)) {
  current_label = std::move(label);
}

CollectiveLabel::~CollectiveLabel() { current_label = std::move(previous_); }

const std::string& CollectiveLabel::current() { return current_label; }

FlightRecorder::FlightRecorder(std::string group, std::string backend, int rank, int size)
    : group_(std::move(group)), backend_(std::move(backend)), rank_(rank), size_(size) {
  ring_.resize(ring_entries());
  if (!enabled()) return;
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.recorders.push_back(this);
    if (r.first_rank < 0) r.first_rank = rank;
  }
  install_signal_dump();
}

FlightRecorder::~FlightRecorder() {
  if (!enabled()) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.recorders.erase(std::remove(r.recorders.begin(), r.recorders.end(), this), r.recorders.end());
}

FlightRecorder::Entry* FlightRecorder::slot(int64_t seq) {
  return const_cast<Entry*>(std::as_const(*this).slot(seq));
}

const FlightRecorder::Entry* FlightRecorder::slot(int64_t seq) const {
  const Entry& e = ring_[static_cast<size_t>(seq) % ring_.size()];
  return e.info.seq == seq ? &e : nullptr;
}

std::string FlightRecorder::describe(int64_t seq) const {
  // Appended piece by piece: GCC 12 misreads `"#" + std::to_string(seq)` (-Wrestrict).
  std::string text;
  std::lock_guard<std::mutex> lock(mutex_);
  const Entry* e = enabled() ? slot(seq) : nullptr;
  if (e != nullptr) text += e->info.describe() + " ";
  text += '#';
  text += std::to_string(seq);
  if (e != nullptr && !e->label.empty()) text += " (" + e->label + ")";
  return text;
}

void FlightRecorder::enqueued(const CollectiveInfo& info) {
  if (!enabled()) return;
  const int64_t t = now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = ring_[static_cast<size_t>(info.seq) % ring_.size()];
  e.info = info;  // reuses the slot's shape storage once the ring has gone round
  e.label = CollectiveLabel::current();
  e.enqueued_us = t;
  e.started_us = e.ended_us = 0;
  e.ok = false;
  e.thread = 0;
}

void FlightRecorder::started(int64_t seq) {
  if (!enabled()) return;
  const int64_t t = now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = slot(seq)) {
    e->started_us = t;
    e->thread = this_thread_id();
  }
}

void FlightRecorder::ended(int64_t seq, bool ok) {
  if (!enabled()) return;
  const int64_t t = now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = slot(seq)) {
    e->ended_us = t;
    e->ok = ok;
  }
}

std::string FlightRecorder::record_failure(const CollectiveInfo& info, bool timed_out) {
  ended(info.seq, false);
  note_group_failed();
  // Built piece by piece: GCC 12 misreads `" #" + std::to_string(seq)` (-Wrestrict).
  std::string reason = info.describe();
  reason += " #";
  reason += std::to_string(info.seq);
  reason += timed_out ? " timed out" : " failed";
  const std::string path = dump_flight_records(reason);
  return path.empty() ? "" : " (flight record: " + path + ")";
}

size_t FlightRecorder::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<size_t>(
      std::count_if(ring_.begin(), ring_.end(), [](const Entry& e) { return e.info.seq != 0; }));
}

nlohmann::json FlightRecorder::json() const {
  nlohmann::json entries = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<const Entry*> used;
    for (const Entry& e : ring_) {
      if (e.info.seq != 0) used.push_back(&e);
    }
    std::sort(used.begin(), used.end(),
              [](const Entry* a, const Entry* b) { return a->info.seq < b->info.seq; });
    for (const Entry* e : used) {
      const char* state =
          e->ended_us ? (e->ok ? "completed" : "failed") : (e->started_us ? "started" : "queued");
      nlohmann::json j = {{"seq", e->info.seq},
                          {"op", collective_name(e->info.kind)},
                          {"call", e->info.describe()},
                          {"dtype", dtype_name(e->info.dtype)},
                          {"shape", e->info.shape},
                          {"numel", e->info.numel},
                          {"tensors", e->info.ntensors},
                          {"label", e->label},
                          {"state", state},
                          {"enqueued_us", e->enqueued_us},
                          {"started_us", e->started_us},
                          {"ended_us", e->ended_us},
                          {"thread", e->thread}};
      entries.push_back(std::move(j));
    }
  }
  return {{"group", group_}, {"backend", backend_},      {"rank", rank_},
          {"size", size_},   {"capacity", ring_.size()}, {"entries", std::move(entries)}};
}

std::string dump_flight_records(const std::string& reason) {
  Registry& r = registry();
  std::lock_guard<std::mutex> dump_lock(r.dump_mutex);
  nlohmann::json groups = nlohmann::json::array();
  int rank = -1;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.recorders.empty()) return "";
    for (const FlightRecorder* recorder : r.recorders) {
      groups.push_back(recorder->json());
    }
    rank = r.first_rank;
  }
  if (const char* text = std::getenv("DPAR_RANK"); text != nullptr && *text != '\0') {
    rank = std::atoi(text);
  }
  const nlohmann::json record = {{"version", 1},
                                 {"rank", rank},
                                 {"pid", ::getpid()},
                                 {"host", host_name()},
                                 {"reason", reason},
                                 {"time_us", now_us()},
                                 {"groups", std::move(groups)}};
  try {
    const std::filesystem::path dir = dump_dir();
    std::filesystem::create_directories(dir);
    const std::filesystem::path path = dir / ("rank" + std::to_string(rank) + ".json");
    const std::filesystem::path aside = path.string() + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(aside, std::ios::trunc);
      out << record.dump(1) << "\n";
      if (!out.flush()) return "";
    }
    std::filesystem::rename(aside, path);
    return path.string();
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace dpar::dist::detail
