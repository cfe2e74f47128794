#include "supervisor.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "dpar/core/error.h"
#include "spawner.h"
#include "text.h"

namespace dpar::launch {
namespace {

constexpr int kHandledSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT};

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

void say(const std::string& line) { write_all(STDERR_FILENO, "dpar-launch: " + line + "\n"); }

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", s);
  return text;
}

// "rank 1 (local rank 1, pid 42)", "server 1 (127.0.0.1:6071, pid 42)", "trainer 0 (pid 42)".
std::string describe_process(const Process& proc, pid_t pid) {
  const std::string pid_text = "pid " + std::to_string(pid);
  switch (proc.role) {
    case Role::kServer:
      return process_name(proc) + " (" + proc.endpoint + ", " + pid_text + ")";
    case Role::kTrainer:
      return process_name(proc) + " (" + pid_text + ")";
    case Role::kRank:
      break;
  }
  return process_name(proc) + " (local rank " + std::to_string(proc.local_rank) + ", " + pid_text +
         ")";
}

// Direct children of the launcher: the workers, and with the subreaper flag also whatever a
// dead worker left behind.
std::vector<pid_t> direct_children() {
  std::vector<pid_t> out;
  const std::string path = "/proc/self/task/" + std::to_string(::getpid()) + "/children";
  std::ifstream in(path);
  for (pid_t pid; in >> pid;) out.push_back(pid);
  return out;
}

}  // namespace

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")" +
           (WCOREDUMP(status) ? ", core dumped" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

Supervisor::Supervisor(const LaunchPlan& plan, std::vector<Env> envs,
                       std::vector<std::vector<int>> cpus)
    : plan_(plan) {
  const auto& procs = plan.node().procs;
  DPAR_CHECK(envs.size() == procs.size(), "dpar-launch: ", envs.size(), " environments for ",
             procs.size(), " processes");
  DPAR_CHECK(cpus.empty() || cpus.size() == procs.size(), "dpar-launch: ", cpus.size(),
             " CPU shares for ", procs.size(), " processes");
  for (size_t i = 0; i < procs.size(); ++i) {
    Worker w;
    w.proc = &procs[i];
    w.env = std::move(envs[i]);
    if (i < cpus.size()) w.cpus = std::move(cpus[i]);
    workers_.push_back(std::move(w));
  }
  if (!plan.ps_mode && !workers_.empty()) {
    const auto chosen = workers_[0].env.find("DPAR_FLIGHT_RECORDER_DIR");
    std::vector<int> local_ranks;
    for (const Worker& w : workers_) local_ranks.push_back(w.proc->rank);
    flight_ = std::make_unique<FlightCollector>(
        plan.log_dir, chosen == workers_[0].env.end() ? std::string() : chosen->second,
        static_cast<int>(plan.endpoints.size()), local_ranks);
  }
  // Orphans of the workers (a worker's own children) become the launcher's, so they are
  // reaped here instead of lingering as zombies under a container's init.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  // A console that went away must not kill the launcher while it still supervises workers.
  ::signal(SIGPIPE, SIG_IGN);
  // An inherited SIG_IGN for SIGCHLD would make the kernel reap the workers itself.
  ::signal(SIGCHLD, SIG_DFL);
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : kHandledSignals) {
    // A signal the launcher was started with ignored (nohup, or '&' in a script without job
    // control) stays ignored: the caller asked for that.
    struct sigaction current {};
    if (sig != SIGCHLD && ::sigaction(sig, nullptr, &current) == 0 &&
        current.sa_handler == SIG_IGN) {
      continue;
    }
    sigaddset(&handled, sig);
  }
  DPAR_CHECK(::sigprocmask(SIG_BLOCK, &handled, &child_mask_) == 0,
             "dpar-launch: sigprocmask failed: ", std::strerror(errno));
  signal_fd_ = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  DPAR_CHECK(signal_fd_ >= 0, "dpar-launch: signalfd failed: ", std::strerror(errno));
}

Supervisor::~Supervisor() {
  // Only reached with workers still running when starting them failed part-way.
  for (Worker& w : workers_) {
    if (w.running) ::killpg(w.pid, SIGKILL);
    close_output(w);
  }
  kill_leftovers();
  if (signal_fd_ >= 0) ::close(signal_fd_);
}

size_t Supervisor::running_count() const {
  size_t n = 0;
  for (const Worker& w : workers_) n += w.running ? 1 : 0;
  return n;
}

void Supervisor::start_all(int restart) {
  stopping_ = killed_ = false;
  failed_ = -1;
  first_clean_exit_.reset();
  early_exit_reported_ = false;
  servers_waiting_ = false;
  overdue_servers_.clear();
  const bool to_files = !plan_.log_dir.empty();
  if (flight_) flight_->clear();
  for (Worker& w : workers_) {
    if (flight_ && !flight_->dir().empty()) w.env["DPAR_FLIGHT_RECORDER_DIR"] = flight_->dir();
    const std::string path =
        to_files ? plan_.log_dir + "/" + log_file_name(*w.proc) : std::string();
    // With log files only the node's first process (ps mode: its first trainer) is echoed, as
    // paddle's launcher does; without them every process is, behind a prefix naming it when
    // there are several.
    const bool echo = !to_files || w.proc->local_rank == plan_.echo_local_rank();
    std::string prefix;
    // Appended (not "[" + name) to sidestep a GCC 12 -Wrestrict false alarm.
    if (!to_files && workers_.size() > 1)
      prefix.append("[").append(process_name(*w.proc)).append("] ");
    w.log = std::make_unique<LogSink>(path, restart > 0, echo, prefix);
    if (restart > 0) {
      w.log->write_file_only("----- dpar-launch: restart " + std::to_string(restart) + " of " +
                             std::to_string(plan_.max_restarts) + " -----\n");
    }
    w.env["DPAR_RESTART_COUNT"] = std::to_string(restart);
    const Child child = spawn_worker(plan_.program_path, plan_.command, w.env, child_mask_, w.cpus);
    w.pid = child.pid;
    w.out = child.output;
    w.running = true;
    w.sweep = false;
    w.status = 0;
  }
}

void Supervisor::close_output(Worker& w) {
  if (w.out >= 0) {
    ::close(w.out);
    w.out = -1;
  }
}

void Supervisor::drain(Worker& w) {
  char buf[65536];
  while (w.out >= 0) {
    const ssize_t n = ::read(w.out, buf, sizeof buf);
    if (n > 0) {
      w.log->write(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      // EOF: every writer is gone. EAGAIN: nothing more for now; a worker that already
      // exited may have left a child holding the pipe, so once it is reaped we stop reading.
      if (n == 0 || !w.running) close_output(w);
      return;
    }
  }
}

void Supervisor::signal_groups(int sig) {
  for (Worker& w : workers_) {
    if (w.pid > 0 && (w.running || w.sweep)) ::killpg(w.pid, sig);
  }
}

void Supervisor::begin_stop(int sig) {
  stopping_ = true;
  deadline_ =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(plan_.grace_period * 1000));
  signal_groups(sig);
  // A stopped worker (SIGSTOP, a debugger) acts on nothing but SIGKILL until it continues.
  if (sig != SIGKILL) signal_groups(SIGCONT);
}

void Supervisor::report_failure(const Worker& w) const {
  const size_t others = running_count();
  std::string msg = describe_process(*w.proc, w.pid) + " " + describe_wait_status(w.status);
  if (others > 0) {
    msg += "; stopping the other " + std::to_string(others) + " local process" +
           (others == 1 ? "" : "es");
  }
  say(msg);
  const std::vector<std::string> tail = w.log->tail();
  const std::string source = w.log->path().empty() ? "its output" : w.log->path();
  if (tail.empty()) {
    say(source + " is empty");
  } else {
    say("last " + std::to_string(tail.size()) + " lines of " + source + ":");
    std::string block;
    for (const std::string& line : tail) block += "    " + line + "\n";
    write_all(STDERR_FILENO, block);
  }
}

void Supervisor::reap() {
  while (true) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;  // 0: others still run; -1 (ECHILD): no children left
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = workers_[i];
      if (w.pid != pid || !w.running) continue;
      w.running = false;
      w.status = status;
      drain(w);
      close_output(w);
      w.log->finish();
      if (stopping_) {
        w.sweep = true;  // exited on our signal; what it started may still need one
      } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        if (!first_clean_exit_) first_clean_exit_ = Clock::now();
      } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        failed_ = static_cast<int>(i);
        w.sweep = true;
        report_failure(w);
        if (flight_) {
          // Before the stop: a rank asked for its record must still be alive to write it.
          std::vector<std::pair<int, pid_t>> running;
          for (const Worker& other : workers_) {
            if (other.running) running.emplace_back(other.proc->rank, other.pid);
          }
          flight_->request(w.proc->rank, describe_wait_status(status), running);
        }
        begin_stop(SIGTERM);
      }
    }
  }
}

void Supervisor::watch_servers() {
  if (!plan_.all_trainers_local() || stopping_) return;
  if (!servers_waiting_) {
    for (const Worker& w : workers_) {
      // A trainer that failed has already started the stop, so the rest exited 0.
      if (w.proc->role == Role::kTrainer && w.running) return;
    }
    if (running_count() == 0) return;
    servers_waiting_ = true;
    servers_deadline_ = Clock::now() + std::chrono::milliseconds(
                                           static_cast<int64_t>(plan_.server_stop_timeout * 1000));
  }
  if (Clock::now() < servers_deadline_) return;
  for (const Worker& w : workers_) {
    if (!w.running || w.proc->role != Role::kServer) continue;
    overdue_servers_.push_back(w.proc->role_id);
    say(process_name(*w.proc) + " did not stop within " + seconds(plan_.server_stop_timeout) +
        " after all trainers finished (" + w.proc->endpoint + ", pid " + std::to_string(w.pid) +
        "); stopping it");
  }
  begin_stop(SIGTERM);
}

void Supervisor::watch_early_exits() {
  if (plan_.ps_mode || stopping_ || early_exit_reported_ || !first_clean_exit_ ||
      running_count() == 0 || Clock::now() < *first_clean_exit_ + kEarlyExitNotice) {
    return;
  }
  early_exit_reported_ = true;
  std::vector<std::string> done, running;
  for (const Worker& w : workers_) {
    (w.running ? running : done).push_back(std::to_string(w.proc->rank));
  }
  const bool one = running.size() == 1;
  say(std::string(done.size() == 1 ? "rank " : "ranks ") + join(done, ", ") +
      " exited with code 0 while " + (one ? "rank " : "ranks ") + join(running, ", ") +
      (one ? " still runs " : " still run ") +
      seconds(static_cast<double>(kEarlyExitNotice.count())) +
      " later; a rank waiting for a finished one in a collective fails at its timeout "
      "(DPAR_TIMEOUT)");
}

int Supervisor::poll_timeout_ms() const {
  Clock::time_point until;
  if (stopping_ && !killed_) {
    until = deadline_;
  } else if (servers_waiting_ && !stopping_) {
    until = servers_deadline_;
  } else if (!plan_.ps_mode && first_clean_exit_ && !early_exit_reported_ && !stopping_) {
    until = *first_clean_exit_ + kEarlyExitNotice;
  } else {
    return -1;
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
  // Rounded up, so the loop does not spin through the last fraction of a millisecond.
  return static_cast<int>(std::max<int64_t>(0, left.count() + 1));
}

void Supervisor::handle_signals() {
  signalfd_siginfo info;
  while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) continue;  // reap() runs after every wake-up anyway
    if (interrupt_ == 0) interrupt_ = sig;
    if (!stopping_) {
      say("got " + signal_name(sig) + "; passing it to " + std::to_string(running_count()) +
          " local process(es), SIGKILL after " + seconds(plan_.grace_period));
      begin_stop(sig);
    } else if (!killed_) {
      say("got " + signal_name(sig) + " again; sending SIGKILL");
      signal_groups(SIGKILL);
      killed_ = true;
    }
  }
}

void Supervisor::kill_leftovers() {
  // Processes a worker started and left behind (reparented here by the subreaper flag, or
  // still in a stopped group) end with the job; reap them so none stays a zombie.
  const auto until = Clock::now() + std::chrono::seconds(2);
  size_t killed = 0;
  while (true) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    const std::vector<pid_t> left = direct_children();
    if (left.empty() || Clock::now() >= until) break;
    for (pid_t pid : left) killed += ::kill(pid, SIGKILL) == 0 ? 1 : 0;
    ::usleep(10000);
  }
  if (killed > 0) say("stopped processes the workers left behind");
}

Supervisor::Outcome Supervisor::supervise() {
  std::vector<pollfd> fds;
  std::vector<Worker*> owners;
  while (running_count() > 0) {
    fds.assign(1, pollfd{signal_fd_, POLLIN, 0});
    owners.assign(1, nullptr);
    for (Worker& w : workers_) {
      if (w.out >= 0) {
        fds.push_back(pollfd{w.out, POLLIN, 0});
        owners.push_back(&w);
      }
    }
    const int ready = ::poll(fds.data(), fds.size(), poll_timeout_ms());
    if (ready < 0 && errno != EINTR) {
      DPAR_FAIL("dpar-launch: poll failed: ", std::strerror(errno));
    }
    for (size_t i = 1; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0) drain(*owners[i]);
    }
    if (ready > 0 && fds[0].revents != 0) handle_signals();
    reap();
    watch_servers();
    watch_early_exits();
    if (stopping_ && !killed_ && running_count() > 0 && Clock::now() >= deadline_) {
      say(std::to_string(running_count()) + " local process(es) still running after " +
          seconds(plan_.grace_period) + "; sending SIGKILL");
      signal_groups(SIGKILL);
      killed_ = true;
    }
  }
  if (stopping_) signal_groups(SIGKILL);  // what the stopped workers started in their groups
  for (Worker& w : workers_) close_output(w);
  kill_leftovers();
  if (interrupt_ != 0) return Outcome::kInterrupted;
  if (failed_ >= 0) return Outcome::kFailure;
  return overdue_servers_.empty() ? Outcome::kSuccess : Outcome::kServersDidNotStop;
}

int Supervisor::run() {
  for (int restart = 0;; ++restart) {
    start_all(restart);
    const Outcome outcome = supervise();
    if (outcome == Outcome::kSuccess) {
      say("all " + std::to_string(workers_.size()) + " local process(es) exited with code 0");
      return 0;
    }
    if (outcome == Outcome::kInterrupted) {
      say("stopped by " + signal_name(interrupt_));
      return 128 + interrupt_;
    }
    if (outcome == Outcome::kServersDidNotStop) {
      // The trainers finished their work: a restart would repeat it, so this is final.
      std::vector<std::string> ids;
      for (int id : overdue_servers_) ids.push_back(std::to_string(id));
      say("job failed: " + std::string(ids.size() == 1 ? "server " : "servers ") + join(ids, ", ") +
          " did not stop within " + seconds(plan_.server_stop_timeout) +
          " after all trainers finished");
      return 1;
    }
    if (flight_) {
      const std::vector<std::string> verdict = flight_->verdict();
      for (const std::string& line : verdict) say("flight recorder: " + line);
      if (!verdict.empty() && flight_->kept()) say("flight records: " + flight_->dir());
    }
    const Worker& w = workers_[static_cast<size_t>(failed_)];
    const std::string what = process_name(*w.proc) + " " + describe_wait_status(w.status);
    // A server failing after this node's trainers all finished: their work is done, and a
    // restart would only repeat it.
    bool trainers_done = w.proc->role == Role::kServer;
    bool any_trainer = false;
    for (const Worker& other : workers_) {
      if (other.proc->role != Role::kTrainer) continue;
      any_trainer = true;
      trainers_done = trainers_done && !other.running && WIFEXITED(other.status) &&
                      WEXITSTATUS(other.status) == 0;
    }
    if (restart < plan_.max_restarts && !(any_trainer && trainers_done)) {
      say(what + "; restarting all " + std::to_string(workers_.size()) +
          " local process(es) (restart " + std::to_string(restart + 1) + " of " +
          std::to_string(plan_.max_restarts) + ")");
      continue;
    }
    say("job failed: " + what +
        (w.log->path().empty() ? std::string() : " (full log: " + w.log->path() + ")"));
    return 1;
  }
}

}  // namespace dpar::launch
