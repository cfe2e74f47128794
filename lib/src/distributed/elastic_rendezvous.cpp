// The elastic rendezvous rounds (elastic_rendezvous.h).
#include "distributed/elastic_rendezvous.h"

#include <algorithm>
#include <charconv>
#include <thread>

#include "distributed/store_common.h"

namespace dpar::dist::detail {

int64_t parse_int(const Bytes& value, const std::string& key) {
  const std::string text = Store::to_string(value);
  int64_t out = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  DPAR_CHECK(ec == std::errc() && ptr == text.data() + text.size(), "elastic rendezvous: key '",
             key, "' holds '", text, "', not a number");
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr Millis kPoll{50};

Bytes int_bytes(int64_t v) { return Store::to_bytes(std::to_string(v)); }

}  // namespace

void order_members(std::vector<RoundMember>& members) {
  std::stable_sort(members.begin(), members.end(), [](const RoundMember& a, const RoundMember& b) {
    if (a.version != b.version) return a.version > b.version;
    // New members (-1) after survivors.
    const auto prev = [](const RoundMember& m) {
      return m.previous_rank < 0 ? INT32_MAX : m.previous_rank;
    };
    if (prev(a) != prev(b)) return prev(a) < prev(b);
    return a.arrival < b.arrival;
  });
}

std::string describe_member(const RoundMember& m) {
  return std::to_string(m.version) + " " + std::to_string(m.previous_rank) + " " + m.id;
}

RoundMember parse_member(const std::string& text, int arrival) {
  RoundMember m;
  m.arrival = arrival;
  const size_t a = text.find(' ');
  const size_t b = a == std::string::npos ? a : text.find(' ', a + 1);
  DPAR_CHECK(b != std::string::npos, "elastic rendezvous: malformed member entry '", text, "'");
  m.version = parse_int(Store::to_bytes(text.substr(0, a)), "member");
  m.previous_rank =
      static_cast<int>(parse_int(Store::to_bytes(text.substr(a + 1, b - a - 1)), "member"));
  m.id = text.substr(b + 1);
  return m;
}

std::string round_key(int64_t round, const std::string& what) {
  return "elastic/r" + std::to_string(round) + "/" + what;
}

ElasticRendezvous::ElasticRendezvous(std::shared_ptr<Store> store, const ElasticOptions& options,
                                     std::string member_id)
    : store_(std::move(store)), options_(options), id_(std::move(member_id)) {}

int64_t ElasticRendezvous::current_round() {
  // Creates the key on first use (round 0) and reads it in one call.
  return parse_int(store_->compare_set(kRoundKey, {}, int_bytes(0)), kRoundKey);
}

std::string ElasticRendezvous::cause_of(int64_t round) {
  const std::string key = round_key(round, "cause");
  return store_->check({key}) ? Store::to_string(store_->get(key)) : std::string();
}

void ElasticRendezvous::request_next(int64_t running, const std::string& cause, int expected) {
  if (store_->add(round_key(running + 1, "requests"), 1) == 1) {
    store_->set(round_key(running + 1, "expect"), int_bytes(expected));
    store_->set(round_key(running + 1, "cause"), Store::to_bytes(cause));
  }
  store_->compare_set(kRoundKey, int_bytes(running), int_bytes(running + 1));
}

int64_t ElasticRendezvous::wait_until_closed(int64_t round, int64_t my_arrival) {
  const std::string closed = round_key(round, "closed");
  const std::string count_key = round_key(round, "count");
  const std::string expect_key = round_key(round, "expect");
  const auto start = Clock::now();
  auto last_change = start;
  int64_t last_count = -1;
  for (;;) {
    if (store_->check({closed})) return parse_int(store_->get(closed), closed);
    const int64_t count = store_->add(count_key, 0);
    const auto now = Clock::now();
    if (count != last_count) {
      last_count = count;
      last_change = now;
    }
    const int64_t expect =
        store_->check({expect_key}) ? parse_int(store_->get(expect_key), expect_key) : 0;
    const bool enough = count >= options_.min_members;
    if (count >= options_.max_members || (enough && expect > 0 && count >= expect) ||
        (enough && now - last_change >= options_.settle)) {
      store_->compare_set(closed, {}, int_bytes(count));
      continue;
    }
    if (!enough && now - start >= options_.elastic_timeout) {
      DPAR_FAIL("elastic: round ", round, " has ", count, " of the ", options_.min_members,
                " members it needs (DPAR_ELASTIC_MIN=", options_.min_members, ", at most ",
                options_.max_members, ") after waiting ", format_seconds(options_.elastic_timeout),
                " s (DPAR_ELASTIC_TIMEOUT); giving up as member ", my_arrival, " (", id_, ")");
    }
    std::this_thread::sleep_for(kPoll);
  }
}

FormedRound ElasticRendezvous::join(int64_t version, int previous_rank, int64_t left_round) {
  for (;;) {
    const int64_t round = current_round();
    if (round <= left_round) {
      // Nobody asked for the next round yet (this member saw the failure first).
      request_next(left_round, "failure", 0);
      continue;
    }
    const std::string closed = round_key(round, "closed");
    if (store_->check({closed})) {
      // The round runs without this member: ask its members to make room.
      request_next(round, "join", static_cast<int>(parse_int(store_->get(closed), closed)) + 1);
      continue;
    }
    const int64_t arrival = store_->add(round_key(round, "count"), 1) - 1;
    RoundMember me{id_, version, previous_rank, static_cast<int>(arrival)};
    store_->set(round_key(round, "member/" + std::to_string(arrival)),
                Store::to_bytes(describe_member(me)));
    const int64_t size = wait_until_closed(round, arrival);
    if (arrival >= size) continue;  // it closed just before this member arrived
    std::vector<std::string> keys;
    for (int64_t i = 0; i < size; ++i)
      keys.push_back(round_key(round, "member/" + std::to_string(i)));
    store_->wait(keys, options_.elastic_timeout);
    FormedRound formed;
    formed.round = round;
    formed.size = static_cast<int>(size);
    for (int64_t i = 0; i < size; ++i) {
      formed.members.push_back(parse_member(
          Store::to_string(store_->get(keys[static_cast<size_t>(i)])), static_cast<int>(i)));
    }
    order_members(formed.members);
    for (size_t r = 0; r < formed.members.size(); ++r) {
      if (formed.members[r].id == id_) formed.rank = static_cast<int>(r);
    }
    formed.cause = cause_of(round);
    if (formed.cause.empty()) formed.cause = "start";
    return formed;
  }
}

}  // namespace dpar::dist::detail

namespace dpar::dist {

ElasticProgress elastic_progress(Store& store) {
  using detail::round_key;
  ElasticProgress progress;
  progress.finished = store.check({detail::kFinishedKey});
  if (!store.check({detail::kRoundKey})) return progress;
  progress.round = detail::parse_int(store.get(detail::kRoundKey), detail::kRoundKey);
  // The members of the round still forming are those of the last closed one.
  for (int64_t round = progress.round; round >= std::max<int64_t>(0, progress.round - 1); --round) {
    const std::string count = round_key(round, "count");
    if (!store.check({count})) continue;
    const int64_t members = store.add(count, 0);
    for (int64_t rank = 0; rank < members; ++rank) {
      const std::string key = round_key(round, "hb/" + std::to_string(rank));
      if (store.check({key})) progress.heartbeats += Store::to_string(store.get(key)) + ",";
    }
    progress.heartbeats += "|";
  }
  return progress;
}

}  // namespace dpar::dist
