// A stand-in worker for the launcher tests. It prints its environment as key=value lines
// (sorted), then behaves as its key=value arguments say. Messages name it "rank <r>" (DPAR_RANK)
// or, in ps mode, "server <id>" / "trainer <id>" (TRAINING_ROLE, DPAR_SERVER_ID,
// DPAR_TRAINER_ID); that id is also what fail_rank= compares with.
//   lines=N          print N more lines "line <i> of rank <r>"
//   listen=IP:PORT   keep a listening TCP socket on IP:PORT (to occupy a port)
//   grandchild=1     start a child process that sleeps as long as this one (same arguments
//                    in its command line, so a test can find it with pgrep)
//   trap=1           on SIGTERM/SIGINT/SIGHUP print "rank <r> got SIG<NAME>" and, if
//                    record=FILE is given, append that line to FILE; then exit 128+signal
//   ignore_term=1    ignore SIGTERM (to test the launcher's SIGKILL after the grace period)
//   exit=CODE        fail by exiting with CODE      } only on rank fail_rank=R (default all)
//   signal=NAME      fail by killing itself (KILL,  } and only when DPAR_RESTART_COUNT equals
//                    SEGV, TERM, ...)               } fail_restart=K (default any),
//   fail_after=S     ... after S seconds             } after sleeping fail_after=S seconds
//   sleep=S          otherwise sleep S seconds, then exit 0
//   fail_role=ROLE   ps mode: fail only in a process whose TRAINING_ROLE is ROLE (PSERVER or
//                    TRAINER), with fail_rank=R comparing R with its server or trainer id
//   server.KEY=V     ps mode: KEY=V for servers only (e.g. server.sleep=60); trainer.KEY=V
//                    likewise for trainers
//   rankR.KEY=V      KEY=V for the process with id R only (e.g. rank0.sleep=8)
// Any other argument (e.g. a unique marker for pgrep) is ignored.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>

extern char** environ;

namespace {

std::string g_record;  // file the signal handler appends to
char g_message[128];   // prepared before any signal can arrive (the handler may not allocate)

void on_signal(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  char line[192];
  const int n = std::snprintf(line, sizeof line, "%sSIG%s\n", g_message, abbrev ? abbrev : "?");
  (void)!::write(STDOUT_FILENO, line, static_cast<size_t>(n));
  if (!g_record.empty()) {
    FILE* f = std::fopen(g_record.c_str(), "a");
    if (f) {
      std::fwrite(line, 1, static_cast<size_t>(n), f);
      std::fclose(f);
    }
  }
  ::_exit(128 + sig);
}

int signal_number(const std::string& name) {
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* abbrev = sigabbrev_np(sig);
    if (abbrev && (name == abbrev || name == std::string("SIG") + abbrev)) return sig;
  }
  return std::atoi(name.c_str());
}

void sleep_seconds(double s) {
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

int listen_on(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(endpoint.c_str() + colon + 1)));
  inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &addr.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 4) != 0) {
    std::fprintf(stderr, "env_worker: cannot listen on %s: %s\n", endpoint.c_str(),
                 std::strerror(errno));
    std::exit(1);
  }
  std::printf("listening on %s\n", endpoint.c_str());
  std::fflush(stdout);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  const char* role_env = std::getenv("TRAINING_ROLE");
  const std::string role = role_env ? role_env : "";
  const std::string scope = role == "PSERVER" ? "server." : role == "TRAINER" ? "trainer." : "";
  std::map<std::string, std::string> args, scoped;
  for (int i = 1; i < argc; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    if (!eq) continue;
    const std::string key(argv[i], static_cast<size_t>(eq - argv[i]));
    if (!scope.empty() && key.rfind(scope, 0) == 0) {
      scoped[key.substr(scope.size())] = eq + 1;
    } else {
      args[key] = eq + 1;
    }
  }
  for (const auto& [key, value] : scoped) args[key] = value;
  auto arg = [&](const char* key, const char* def) {
    auto it = args.find(key);
    return it == args.end() ? std::string(def) : it->second;
  };
  auto env_int = [](const char* name) {
    const char* value = std::getenv(name);
    return value ? std::atoi(value) : -1;
  };
  // The id fail_rank= compares with, and the name the messages use.
  int rank = env_int("DPAR_RANK");
  std::string who = "rank ";
  if (role == "PSERVER") {
    rank = env_int("DPAR_SERVER_ID");
    who = "server ";
  } else if (role == "TRAINER") {
    rank = env_int("DPAR_TRAINER_ID");
    who = "trainer ";
  }
  who += std::to_string(rank);
  const std::string own = "rank" + std::to_string(rank) + ".";
  for (const auto& [key, value] : std::map<std::string, std::string>(args)) {
    if (key.rfind(own, 0) == 0) args[key.substr(own.size())] = value;
  }
  const char* restart_env = std::getenv("DPAR_RESTART_COUNT");
  const int restart = restart_env ? std::atoi(restart_env) : -1;

  std::map<std::string, std::string> env;
  for (char** it = environ; *it; ++it) {
    const char* eq = std::strchr(*it, '=');
    if (eq) env[std::string(*it, static_cast<size_t>(eq - *it))] = eq + 1;
  }
  for (const auto& [key, value] : env) std::printf("%s=%s\n", key.c_str(), value.c_str());
  const int lines = std::atoi(arg("lines", "0").c_str());
  for (int i = 1; i <= lines; ++i) std::printf("line %d of %s\n", i, who.c_str());
  std::fflush(stdout);

  std::snprintf(g_message, sizeof g_message, "%s got ", who.c_str());
  g_record = arg("record", "");
  if (arg("trap", "0") == "1") {
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::signal(sig, on_signal);
  }
  if (arg("ignore_term", "0") == "1") ::signal(SIGTERM, SIG_IGN);
  if (args.count("listen")) listen_on(args["listen"]);
  if (arg("grandchild", "0") == "1") {
    const pid_t pid = fork();
    if (pid == 0) {
      sleep_seconds(std::atof(arg("sleep", "30").c_str()) + 30);
      _exit(0);
    }
    std::printf("started grandchild %d\n", static_cast<int>(pid));
    std::fflush(stdout);
  }

  const bool role_matches = !args.count("fail_role") || args["fail_role"] == role;
  const bool rank_matches =
      !args.count("fail_rank") || std::atoi(args["fail_rank"].c_str()) == rank;
  const bool restart_matches =
      !args.count("fail_restart") || std::atoi(args["fail_restart"].c_str()) == restart;
  const bool fails = (args.count("exit") || args.count("signal")) && role_matches && rank_matches &&
                     restart_matches;
  if (fails) {
    sleep_seconds(std::atof(arg("fail_after", "0").c_str()));
    std::printf("%s failing now\n", who.c_str());
    std::fflush(stdout);
    if (args.count("signal")) {
      const int sig = signal_number(args["signal"]);
      ::signal(sig, SIG_DFL);
      ::kill(::getpid(), sig);
      sleep_seconds(5);  // a blocked or ignored signal: fall through to exit
    }
    return std::atoi(arg("exit", "1").c_str());
  }
  sleep_seconds(std::atof(arg("sleep", "0").c_str()));
  std::printf("%s done\n", who.c_str());
  return 0;
}
