#pragma once
// Runs the local workers and watches them until the job on this node is over:
//  - all workers exit 0                        -> exit status 0
//  - a worker exits non-zero or by a signal    -> the others are stopped (SIGTERM to each
//    process group, SIGKILL after the grace period), the failure is reported with the last
//    lines of its log, and all local workers restart if --max_restarts allows; else status 1.
//    In collective mode the others first get SIGUSR1 and up to 2 s to write their flight
//    records, and after the teardown one verdict says which rank was behind (flight_verdict.h)
//  - the launcher gets SIGINT/SIGTERM/SIGHUP   -> the same signal goes to every worker's group,
//    SIGKILL after the grace period (at once on a second signal); status 128 + signal
//  - collective mode, a rank exits 0 while others of this node still run 5 s later -> one
//    line names it (the others may be waiting for it in a collective, until their timeout)
//  - ps mode, every trainer of the job runs here and all exited 0 -> the servers get
//    --server_stop_timeout seconds to exit by themselves (the trainers told them to); servers
//    still running then are stopped as above and the status is 1 (no restart)
// Processes are named by role in messages: "rank 3", or in ps mode "server 1" / "trainer 0".
// The launcher is a child subreaper, so processes the workers leave behind are reaped too.
#include <signal.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "environment.h"
#include "flight_collect.h"
#include "log_sink.h"
#include "plan.h"

namespace dpar::launch {

class Supervisor {
 public:
  // `envs[i]` is the environment of the node's local rank i (DPAR_RESTART_COUNT is set per
  // start) and `cpus[i]` the CPUs it runs on (none given or empty: unbound). Blocks the signals
  // it handles from here on; throws dpar::Error on system failures.
  Supervisor(const LaunchPlan& plan, std::vector<Env> envs,
             std::vector<std::vector<int>> cpus = {});
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  int run();

 private:
  struct Worker {
    const Process* proc = nullptr;
    Env env;
    std::vector<int> cpus;  // empty: unbound
    pid_t pid = -1;
    int out = -1;
    bool running = false;
    bool sweep = false;  // its process group may still hold processes to stop
    int status = 0;      // wait status once it exited
    std::unique_ptr<LogSink> log;
  };
  enum class Outcome { kSuccess, kFailure, kInterrupted, kServersDidNotStop };
  using Clock = std::chrono::steady_clock;

  void start_all(int restart);
  Outcome supervise();
  void handle_signals();
  void reap();
  void drain(Worker& w);
  void close_output(Worker& w);
  void begin_stop(int sig);
  void signal_groups(int sig);
  void report_failure(const Worker& w) const;
  void watch_servers();
  void watch_early_exits();
  int poll_timeout_ms() const;
  void kill_leftovers();
  size_t running_count() const;

  const LaunchPlan& plan_;
  std::vector<Worker> workers_;
  // Collective mode: the ranks' flight records, asked for when one fails (flight_collect.h).
  std::unique_ptr<FlightCollector> flight_;
  sigset_t child_mask_{};
  int signal_fd_ = -1;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point deadline_{};
  int failed_ = -1;    // index of the worker whose failure stops this attempt
  int interrupt_ = 0;  // signal that interrupted the launcher
  // ps mode: all trainers finished; the servers must exit by servers_deadline_.
  bool servers_waiting_ = false;
  Clock::time_point servers_deadline_{};
  std::vector<int> overdue_servers_;  // ids of the servers stopped after the deadline
  // Collective mode: when the first worker exited 0 while others ran on, and whether that
  // was reported.
  std::optional<Clock::time_point> first_clean_exit_;
  bool early_exit_reported_ = false;

 public:
  // How long the others may run on after a rank exited 0 before the launcher says so.
  static constexpr std::chrono::seconds kEarlyExitNotice{5};
};

// "exited with code 3", "was killed by signal 9 (SIGKILL)".
std::string describe_wait_status(int status);

}  // namespace dpar::launch
