#pragma once
// The elastic rendezvous: members form numbered rounds on the rendezvous store.
//
// Keys (under the store's job id):
//   elastic/round               the round being formed or running now
//   elastic/r<N>/count          arrivals so far (add)
//   elastic/r<N>/member/<i>     the i-th arrival: "<version> <previous rank> <member id>"
//   elastic/r<N>/closed         the member count, set once (compare_set) by whoever closes it
//   elastic/r<N>/cause          why round N was asked for: start | join | leave | failure ...
//   elastic/r<N>/expect         members round N expects (0: unknown), set with the cause
//   elastic/r<N>/hb/<rank>      heartbeat counters of round N's members
//   elastic/finished            set when every member of a round finished training
// A member that finds the current round closed (it is running without it) asks for the next
// one; the running members see the round number move and join it at their next commit.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dpar/distributed/elastic.h"
#include "dpar/distributed/store.h"

namespace dpar::dist::detail {

struct RoundMember {
  std::string id;
  int64_t version = 0;     // of its committed state
  int previous_rank = -1;  // in the round it comes from; -1 for a new member
  int arrival = 0;
};

struct FormedRound {
  int64_t round = 0;
  int rank = 0;
  int size = 1;
  std::vector<RoundMember> members;  // in rank order
  std::string cause;                 // why the round was asked for
};

// Rank order: the newest state first (rank 0 sends it to the others), then the previous rank
// (survivors keep their order, so a run is reproducible), then arrival.
void order_members(std::vector<RoundMember>& members);
std::string describe_member(const RoundMember& m);  // "<version> <previous rank> <id>"
RoundMember parse_member(const std::string& text, int arrival);

std::string round_key(int64_t round, const std::string& what);
// A store value that holds a decimal integer; throws dpar::Error naming the key otherwise.
int64_t parse_int(const Bytes& value, const std::string& key);
inline constexpr char kRoundKey[] = "elastic/round";
inline constexpr char kFinishedKey[] = "elastic/finished";

class ElasticRendezvous {
 public:
  ElasticRendezvous(std::shared_ptr<Store> store, const ElasticOptions& options,
                    std::string member_id);

  // Joins the round being formed (asking for the next one when the current one runs without
  // this member, or is `left_round`, the round this member just left) and waits until it
  // closes. Throws dpar::Error when fewer than min members are there after elastic_timeout.
  FormedRound join(int64_t version, int previous_rank, int64_t left_round);

  // Asks round `running`'s members to form round running + 1. The first to ask sets the cause
  // and the number of members expected (0: unknown); later askers change nothing.
  void request_next(int64_t running, const std::string& cause, int expected);
  int64_t current_round();
  std::string cause_of(int64_t round);

 private:
  int64_t wait_until_closed(int64_t round, int64_t my_arrival);

  std::shared_ptr<Store> store_;
  ElasticOptions options_;
  std::string id_;
};

}  // namespace dpar::dist::detail
