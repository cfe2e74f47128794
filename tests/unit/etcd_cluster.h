#pragma once
// Real etcd members (Debian's etcd-server) on loopback for the etcd store and elastic tests:
// each member is a child process with its own data directory under a TempDir; the destructor
// kills what is left. Members die with the test process (PR_SET_PDEATHSIG).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "unit/helpers.h"

class EtcdCluster {
 public:
  explicit EtcdCluster(int members) {
    for (int i = 0; i < members; ++i) {
      client_ports_.push_back(free_port());
      peer_ports_.push_back(free_port());
    }
    std::string initial;
    for (int i = 0; i < members; ++i) {
      if (i > 0) initial += ',';
      initial += name(i) + "=" + url(peer_ports_[static_cast<size_t>(i)]);
    }
    for (int i = 0; i < members; ++i) pids_.push_back(start(i, initial));
  }
  ~EtcdCluster() {
    for (size_t i = 0; i < pids_.size(); ++i) kill(static_cast<int>(i));
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  std::string endpoint(int i) const {
    return "127.0.0.1:" + std::to_string(client_ports_[static_cast<size_t>(i)]);
  }
  // Every member, comma-separated: what --rdzv_endpoint takes.
  std::string endpoints() const {
    std::string out;
    for (size_t i = 0; i < client_ports_.size(); ++i) {
      if (i > 0) out += ',';
      out += endpoint(static_cast<int>(i));
    }
    return out;
  }
  void kill(int i) {
    pid_t& pid = pids_[static_cast<size_t>(i)];
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
  std::string log_of(int i) const { return (dir_.path / (name(i) + ".log")).string(); }

 private:
  static std::string name(int i) {
    std::string out = "member";
    out += std::to_string(i);
    return out;
  }
  static std::string url(int port) { return "http://127.0.0.1:" + std::to_string(port); }

  pid_t start(int i, const std::string& initial) {
    const std::string data = (dir_.path / name(i)).string();
    const std::string client = url(client_ports_[static_cast<size_t>(i)]);
    const std::string peer = url(peer_ports_[static_cast<size_t>(i)]);
    std::vector<std::string> args = {"/usr/bin/etcd",
                                     "--name=" + name(i),
                                     "--data-dir=" + data,
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=" + initial,
                                     "--initial-cluster-state=new",
                                     "--initial-cluster-token=dpar-test",
                                     "--logger=zap",
                                     "--log-level=warn"};
    const std::string log = log_of(i);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    return pid;
  }

  TempDir dir_;
  std::vector<int> client_ports_, peer_ports_;
  std::vector<pid_t> pids_;
};
