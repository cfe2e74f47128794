// ElasticJob: the round loop (join, sync, train, recover) and the heartbeat watcher that turns a
// silent member into a new round within DPAR_ELASTIC_DETECT seconds.
#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "distributed/elastic_rendezvous.h"
#include "distributed/store_common.h"
#include "dpar/distributed/elastic.h"
#include "dpar/distributed/etcd_store.h"

namespace dpar::dist {
namespace {

using Clock = std::chrono::steady_clock;

int count_env(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  DPAR_CHECK(end != text && *end == '\0' && value >= 1 && value <= 1 << 20, name,
             ": expected a positive count, got '", text, "'");
  return static_cast<int>(value);
}

std::string make_member_id() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::random_device device;
  char nonce[9];
  std::snprintf(nonce, sizeof nonce, "%08x", device());
  return std::string(host) + ":" + std::to_string(getpid()) + ":" + nonce;
}

// Thrown by leave() through the training function back to run().
struct LeftJob : Error {
  using Error::Error;
};

}  // namespace

ElasticOptions ElasticOptions::from_env() {
  ElasticOptions options;
  if (const char* b = std::getenv("DPAR_RDZV_BACKEND"); b != nullptr && *b != '\0')
    options.backend = b;
  if (const char* e = std::getenv("DPAR_RDZV_ENDPOINT")) options.endpoint = e;
  if (const char* id = std::getenv("DPAR_RDZV_ID"); id != nullptr && *id != '\0')
    options.job_id = id;
  options.min_members = count_env("DPAR_ELASTIC_MIN", 1);
  options.max_members = count_env("DPAR_ELASTIC_MAX", options.min_members);
  if (auto t = detail::seconds_from_env("DPAR_ELASTIC_TIMEOUT", false))
    options.elastic_timeout = *t;
  if (auto t = detail::seconds_from_env("DPAR_ELASTIC_SETTLE", true)) options.settle = *t;
  if (auto t = detail::seconds_from_env("DPAR_ELASTIC_DETECT", false)) options.detect_after = *t;
  return options;
}

struct ElasticJob::Impl {
  ElasticOptions options;
  std::string id = make_member_id();
  std::shared_ptr<Store> store;
  EtcdStore* etcd = nullptr;  // set when the store is an etcd cluster (its leases are heartbeats)
  std::unique_ptr<detail::ElasticRendezvous> rendezvous;
  ElasticState* state = nullptr;
  std::vector<std::string> history;

  // The current round; the group is replaced between rounds on the run() thread only.
  detail::FormedRound formed;
  std::shared_ptr<Group> group;

  // Set by the watcher, read by commit() and run().
  std::atomic<bool> change_pending{false};
  std::mutex mutex;  // guards fatal, stop_watch
  std::condition_variable cv;
  std::string fatal;  // the rendezvous store is lost: run() gives up
  bool stop_watch = false;
  std::thread watcher;

  void log(const std::string& line) { detail::log_line(options.log, "elastic: " + line); }

  std::string fatal_error() {
    std::lock_guard<std::mutex> lock(mutex);
    return fatal;
  }

  void start_watch() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop_watch = false;
    }
    change_pending = false;
    watcher = std::thread([this, round = formed.round, rank = formed.rank, size = formed.size,
                           group = group] { watch(round, rank, size, group); });
  }

  void stop_watching() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop_watch = true;
    }
    cv.notify_all();
    if (watcher.joinable()) watcher.join();
  }

  // This member's heartbeat. dpar store: a counter set each interval. etcd: one key on this
  // process's lease, which the store renews; etcd deletes it detect_after (the lease's
  // time-to-live) after the process stops renewing — it died, was stopped, or was cut off.
  void publish_heartbeat(const std::string& key, int64_t beat, bool& leased_key_set) {
    if (etcd == nullptr) {
      store->set(key, Store::to_bytes(std::to_string(beat)));
    } else if (!leased_key_set) {
      etcd->set_leased(key, Store::to_bytes("alive"));
      leased_key_set = true;
    }
  }

  // Once per heartbeat interval: publish this member's heartbeat, look at the others', and at
  // the round number. A peer silent for detect_after is gone: ask for the next round and abort
  // the group, so a collective waiting for that peer fails now.
  void watch(int64_t round, int rank, int size, const std::shared_ptr<Group>& round_group) {
    struct Seen {
      std::string value;
      Clock::time_point since;
      bool present = false;  // etcd: the peer's leased key was there once
    };
    std::vector<Seen> seen(static_cast<size_t>(size), Seen{"", Clock::now()});
    auto store_ok = Clock::now();
    int64_t beat = 0;
    bool leased_key_set = false;
    bool aborted = false;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        if (cv.wait_for(lock, beat == 0 ? Millis(0) : options.heartbeat,
                        [&] { return stop_watch; })) {
          return;
        }
      }
      const auto now = Clock::now();
      try {
        publish_heartbeat(detail::round_key(round, "hb/" + std::to_string(rank)), ++beat,
                          leased_key_set);
        store_ok = now;
        if (aborted) continue;  // keeps publishing its heartbeat until run() stops it
        std::vector<int> gone;
        for (int peer = 0; peer < size; ++peer) {
          if (peer == rank) continue;
          const std::string key = detail::round_key(round, "hb/" + std::to_string(peer));
          Seen& s = seen[static_cast<size_t>(peer)];
          if (etcd != nullptr) {
            // A leased key is there exactly while its member renews the lease: once seen, its
            // absence is the verdict (etcd waited the time-to-live already).
            if (store->check({key})) {
              s.present = true;
              continue;
            }
            if (s.present || now - s.since >= options.detect_after) gone.push_back(peer);
            continue;
          }
          if (store->check({key})) {
            std::string value = Store::to_string(store->get(key));
            if (value != s.value) {
              s = Seen{std::move(value), now};
              continue;
            }
          }
          if (now - s.since >= options.detect_after) gone.push_back(peer);
        }
        const int64_t current = rendezvous->current_round();
        if (current > round) {
          change_pending = true;
          // After a failure the others may wait in a collective for the lost member: abort.
          const std::string cause = rendezvous->cause_of(round + 1);
          if (cause.rfind("failure", 0) == 0) {
            round_group->abort("round " + std::to_string(round + 1) + " was asked for (" + cause +
                               ")");
            aborted = true;
          }
        } else if (!gone.empty()) {
          std::string who;
          for (int peer : gone) who += (who.empty() ? "rank " : ", rank ") + std::to_string(peer);
          const std::string cause = "failure: " + who + " sent no heartbeat for " +
                                    detail::format_seconds(options.detect_after) + " s";
          log("round " + std::to_string(round) + ": " + cause.substr(9) + "; forming round " +
              std::to_string(round + 1));
          rendezvous->request_next(round, cause, size - static_cast<int>(gone.size()));
          change_pending = true;
          round_group->abort(cause);
          aborted = true;
        }
      } catch (const std::exception& e) {
        if (now - store_ok >= options.detect_after) {
          const std::string line =
              "lost the rendezvous store at " + options.endpoint + " for " +
              detail::format_seconds(std::chrono::duration_cast<Millis>(now - store_ok)) +
              " s: " + e.what();
          {
            std::lock_guard<std::mutex> lock(mutex);
            fatal = line;
          }
          change_pending = true;
          round_group->abort(line);
          return;
        }
      }
    }
  }
};

ElasticJob::ElasticJob(ElasticOptions options) : impl_(std::make_unique<Impl>()) {
  DPAR_CHECK(!options.endpoint.empty(),
             "ElasticJob: no rendezvous endpoint (DPAR_RDZV_ENDPOINT; dpar-launch --nnodes=MIN:MAX "
             "--rdzv_endpoint=host:port sets it)");
  DPAR_CHECK(options.min_members >= 1 && options.max_members >= options.min_members,
             "ElasticJob: min members ", options.min_members, " and max members ",
             options.max_members, ": expected 1 <= min <= max");
  impl_->options = std::move(options);
  const ElasticOptions& o = impl_->options;
  if (o.backend == "etcd") {
    EtcdStoreOptions etcd;
    etcd.connect_timeout = o.elastic_timeout;
    etcd.timeout = o.elastic_timeout;
    etcd.rpc_timeout = o.detect_after;
    etcd.lease_ttl = std::max(o.detect_after, Millis(2000));
    auto store = std::make_shared<EtcdStore>(o.endpoint, o.job_id, etcd);
    impl_->etcd = store.get();
    impl_->store = store;
    // etcd outlives jobs: keys of a finished job with this id would send this member into a
    // round nobody else joins.
    DPAR_CHECK(!store->check({detail::kFinishedKey}), "elastic: job '", o.job_id,
               "' already finished in etcd at ", o.endpoint,
               "; give this job its own --rdzv_id (DPAR_RDZV_ID), or delete the old one's keys: "
               "etcdctl del --prefix /dpar/",
               o.job_id, "/");
  } else {
    DPAR_CHECK(o.backend == "dpar", "ElasticJob: rendezvous backend '", o.backend,
               "' (DPAR_RDZV_BACKEND): expected dpar or etcd");
    StoreClientOptions client;
    client.timeout = o.elastic_timeout;
    client.rpc_timeout = o.detect_after;
    client.log = o.log;
    // World size 0: an elastic job's store admits members without fixed ranks.
    impl_->store = std::make_shared<StoreClient>(o.endpoint, StoreIdentity{o.job_id, 0, 0}, client);
  }
  impl_->rendezvous =
      std::make_unique<detail::ElasticRendezvous>(impl_->store, impl_->options, impl_->id);
}

ElasticJob::~ElasticJob() {
  impl_->stop_watching();
  impl_->group.reset();
}

void ElasticJob::run(ElasticState& state, const std::function<void(Group&)>& train) {
  Impl& m = *impl_;
  m.state = &state;
  if (!state.has_commit()) state.commit();
  int previous_rank = -1;
  int64_t left_round = -1;
  int failures = 0;
  for (;;) {
    try {
      m.formed = m.rendezvous->join(state.version(), previous_rank, left_round);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.rfind("elastic:", 0) == 0) throw;  // the rendezvous's own verdict (below MIN)
      throw Error("elastic: the rendezvous store at " + m.options.endpoint +
                  " failed while forming the next round: " + what);
    }
    const std::string line = "round " + std::to_string(m.formed.round) + ": rank " +
                             std::to_string(m.formed.rank) + " of " +
                             std::to_string(m.formed.size) + " (" + m.formed.cause + ")";
    m.history.push_back(line);
    m.log(line);
    auto prefixed =
        std::make_shared<PrefixStore>(detail::round_key(m.formed.round, "group"), m.store);
    m.group = std::make_shared<Group>(prefixed, m.formed.rank, m.formed.size, m.options.group);
    m.start_watch();
    int64_t version_before = state.version();
    try {
      state.sync(*m.group, 0);
      version_before = state.version();  // a joining member's state just became rank 0's
      train(*m.group);
      m.group->barrier();
      m.stop_watching();
      const std::string key = detail::round_key(m.formed.round, "finished");
      if (m.store->add(key, 1) == m.formed.size)
        m.store->set(detail::kFinishedKey, Store::to_bytes("1"));
      m.group.reset();
      return;
    } catch (const LeftJob&) {
      m.stop_watching();
      m.group.reset();
      return;
    } catch (const MembershipChanged&) {
      failures = 0;
    } catch (const Error& e) {
      const std::string fatal = m.fatal_error();
      if (!fatal.empty()) {
        m.stop_watching();
        throw Error("elastic: " + fatal);
      }
      failures = state.version() > version_before ? 1 : failures + 1;
      if (failures > m.options.max_failures_without_progress) {
        m.stop_watching();
        throw Error("elastic: the training function failed " + std::to_string(failures) +
                    " times in a row without a commit; the last failure: " + e.what());
      }
      m.log("round " + std::to_string(m.formed.round) + ": " + e.what());
    }
    m.stop_watching();
    // Peers still inside a collective with this member fail at once instead of waiting.
    m.group->abort("rank " + std::to_string(m.formed.rank) + " left round " +
                   std::to_string(m.formed.round));
    m.group.reset();
    state.restore();
    previous_rank = m.formed.rank;
    left_round = m.formed.round;
  }
}

void ElasticJob::commit() {
  Impl& m = *impl_;
  DPAR_CHECK(m.state != nullptr, "ElasticJob::commit: call it inside run()");
  m.state->commit();
  if (m.change_pending) {
    throw MembershipChanged("elastic: the membership of round " + std::to_string(m.formed.round) +
                            " changes");
  }
}

void ElasticJob::leave() {
  Impl& m = *impl_;
  DPAR_CHECK(m.group != nullptr, "ElasticJob::leave: call it inside run()");
  m.rendezvous->request_next(
      m.formed.round, "leave: rank " + std::to_string(m.formed.rank) + " left", m.formed.size - 1);
  throw LeftJob("elastic: rank " + std::to_string(m.formed.rank) + " left the job");
}

int ElasticJob::rank() const { return impl_->formed.rank; }
int ElasticJob::world_size() const { return impl_->formed.size; }
int64_t ElasticJob::round() const { return impl_->formed.round; }
std::shared_ptr<Group> ElasticJob::group_ptr() const { return impl_->group; }
const std::vector<std::string>& ElasticJob::history() const { return impl_->history; }

}  // namespace dpar::dist
