#pragma once
// Elastic training: a job whose ranks come and go while it runs. Survivors of a failure keep
// their processes and memory, re-form the group at the new world size and re-run the
// interrupted step from an in-memory commit; a joining process receives the committed state
// from a live peer (a broadcast), not from disk. In the manner of Horovod's elastic.State/run:
//
//   dist::ElasticState state;
//   state.add_module("model", *model);
//   state.add_optimizer("optimizer", optimizer);
//   state.add_counter("step", step);
//   dist::ElasticJob job;                      // reads dpar-launch's DPAR_RDZV_* environment
//   job.run(state, [&](dist::Group& group) {   // called again after every membership change
//     dist::DataParallel dp(model, {.group = job.group_ptr()});
//     while (step < steps) { train_one_step(dp, group.rank(), group.size()); ++step;
//                            job.commit(); }   // in-memory commit + membership check
//   });
//
// Membership lives in rounds on the rendezvous store (docs/elastic.md): a round closes when
// max members are there, when the members it expects are, or when at least min are and none
// arrived for the settle time; ranks follow the committed state's age, then the previous rank,
// then arrival, so survivors keep their order. Every member publishes a heartbeat each second;
// one that has not moved for detect_after is declared gone: the members abort the round's
// group (a collective waiting for it fails at once) and form the next round.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dpar/core/error.h"
#include "dpar/distributed/process_group.h"
#include "dpar/nn/module.h"

namespace dpar {
class Generator;
namespace optim {
class Optimizer;
class LRScheduler;
}  // namespace optim
}  // namespace dpar

namespace dpar::dist {

// What must survive a change of membership. commit() keeps a copy in memory (cheap: one copy
// of each tensor into buffers reused from the previous commit); restore() puts the last commit
// back; sync() makes every rank hold root's commit. Items load in registration order.
class ElasticState {
 public:
  using Save = std::function<nn::NamedTensors()>;
  using Load = std::function<void(const nn::NamedTensors&)>;

  ElasticState();
  ~ElasticState();
  ElasticState(const ElasticState&) = delete;
  ElasticState& operator=(const ElasticState&) = delete;

  // Parameters and buffers (state_dict / load_state_dict).
  void add_module(const std::string& name, nn::Module& module);
  // Momentum and moment buffers, step counts and the learning rate.
  void add_optimizer(const std::string& name, optim::Optimizer& optimizer);
  void add_scheduler(const std::string& name, optim::LRScheduler& scheduler);
  void add_generator(const std::string& name, Generator& generator);
  void add_counter(const std::string& name, int64_t& counter);
  // Anything else: save() returns named tensors, load() takes them back. `device` says where
  // received tensors go when this process holds none of them yet (a joining rank).
  void add(const std::string& name, Save save, Load load, Device device = Device::cpu());

  void commit();
  // Throws dpar::Error when nothing was committed yet.
  void restore();
  // Root's commit reaches every rank of group, which loads it (every rank calls it; root must
  // have committed). Afterwards every rank's commit and live state equal root's.
  void sync(Group& group, int root = 0);

  bool has_commit() const;
  // How many commits the state went through, counted along the job: sync() hands root's count
  // on, so a joining rank continues it. The rendezvous ranks members by it.
  int64_t version() const;
  // For state loaded from elsewhere before run() (a checkpoint on disk): how far along it is
  // (e.g. the steps and epochs it has done), so that a round whose members resumed from
  // different checkpoints, or only some of them from one, takes the most advanced member's
  // state. Commits count on from it. version >= 0.
  void set_version(int64_t version);
  size_t committed_bytes() const;
  // FNV-1a over the commit's names, dtypes, shapes and bytes: equal on ranks holding equal state.
  uint64_t checksum() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ElasticOptions {
  // DPAR_RDZV_BACKEND: "dpar" (a StoreServer, e.g. the launcher's) or "etcd" (an etcd cluster:
  // EtcdStore; the endpoint may list its members, ip:port,ip:port)
  std::string backend = "dpar";
  std::string endpoint;            // host:port of the rendezvous store (DPAR_RDZV_ENDPOINT)
  std::string job_id = "default";  // DPAR_RDZV_ID
  int min_members = 1;             // DPAR_ELASTIC_MIN: processes (nodes x processes per node)
  int max_members = 1;             // DPAR_ELASTIC_MAX
  // Below min members, a round waits this long, then run() fails naming how many it had
  // and needed (DPAR_ELASTIC_TIMEOUT, seconds; Paddle's --elastic_timeout).
  Millis elastic_timeout{std::chrono::seconds(30)};
  // With at least min members there, a round closes when nobody arrived for this long
  // (DPAR_ELASTIC_SETTLE, seconds), unless every member it expects is there already.
  Millis settle{std::chrono::seconds(2)};
  Millis heartbeat{std::chrono::seconds(1)};
  // A member whose heartbeat has not moved for this long is declared gone (DPAR_ELASTIC_DETECT,
  // seconds); also how long this process tolerates an unreachable store before giving up.
  Millis detect_after{std::chrono::seconds(5)};
  // run() gives up when the training function fails this many times in a row without a commit
  // in between (a bug, not a membership change).
  int max_failures_without_progress = 3;
  ProcessGroupOptions group = ProcessGroupOptions::from_env();
  std::function<void(const std::string&)> log;  // empty: stderr, as "dpar: <line>"
  // The DPAR_* variables above (dpar-launch --nnodes=MIN:MAX sets them).
  static ElasticOptions from_env();
};

// Thrown out of ElasticJob::commit() when the membership changes (a member joins or leaves):
// the step is committed; run() forms the next round and calls the training function again.
class MembershipChanged : public Error {
 public:
  using Error::Error;
};

class ElasticJob {
 public:
  // Connects to the rendezvous store (throws dpar::Error naming the endpoint if unreachable).
  explicit ElasticJob(ElasticOptions options = ElasticOptions::from_env());
  ~ElasticJob();
  ElasticJob(const ElasticJob&) = delete;
  ElasticJob& operator=(const ElasticJob&) = delete;

  // Commits state (so every member starts from one), then: joins a round, syncs the state from
  // the round's rank 0, calls train(group) and returns when it does. When train throws (a
  // collective failed: a member died, stopped or was cut off), or commit() reports a change,
  // restores the last commit and goes again in the next round. The last member to finish
  // marks the job finished on the store.
  void run(ElasticState& state, const std::function<void(Group&)>& train);

  // After each completed step: state.commit(), then throws MembershipChanged when the next
  // round is pending (a member joins or leaves).
  void commit();
  // Leaves the job at this step boundary (after a commit) on purpose: the other members form
  // the next round without this one, as after a failure but without losing anything. run()
  // returns once the others know. For planned scale-down and for reference runs of a schedule.
  void leave();

  int rank() const;        // in the current round
  int world_size() const;  // of the current round
  int64_t round() const;   // the current round's number
  std::shared_ptr<Group> group_ptr() const;
  // How each round formed: "round 3: 2 members (after rank 2 was gone: no heartbeat for 5.0 s)"
  const std::vector<std::string>& history() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// How a step's batch follows the world size when it changes. The job is planned with
// `per_rank_batch` samples on each of `planned_world` ranks (the global batch).
//  - KeepPerRankBatch: every rank keeps its batch; the global batch and the learning rate scale
//    with world / planned_world (the linear scaling rule of Goyal et al.).
//  - KeepGlobalBatch: the global batch stays, through gradient accumulation: the fewest
//    micro-batches per step whose equal size, at most per_rank_batch, fills it exactly; the
//    learning rate stays. Throws dpar::Error naming the sizes when no equal split exists
//    (a global batch of 12 over 5 ranks).
enum class BatchPolicy { KeepPerRankBatch, KeepGlobalBatch };
struct StepPlan {
  int64_t micro_batch = 0;   // samples per rank and micro-batch
  int64_t accumulation = 1;  // micro-batches per step (gradients accumulated under no_sync)
  int64_t global_batch = 0;  // samples per step over all ranks
  double lr_scale = 1.0;     // times the planned learning rate
};
StepPlan plan_step(BatchPolicy policy, int64_t per_rank_batch, int planned_world, int world);

// What the host of an elastic job's rendezvous store (dpar-launch) sees of the job: whether its
// members marked it finished, the current round, and the current round's heartbeats (a text
// that changes whenever a member sends one), so it keeps the store up while the job lives.
struct ElasticProgress {
  bool finished = false;
  int64_t round = 0;
  std::string heartbeats;
};
ElasticProgress elastic_progress(Store& store);

}  // namespace dpar::dist
