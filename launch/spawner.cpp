#include "spawner.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cpu_binding.h"
#include "dpar/core/flags.h"
#include "text.h"

namespace dpar::launch {
namespace {

// "" when `path` is an executable regular file, otherwise why not.
std::string executable_problem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::strerror(errno);
  if (S_ISDIR(st.st_mode)) return "is a directory";
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  if (::access(path.c_str(), X_OK) != 0) return "is not executable";
  return "";
}

}  // namespace

std::string resolve_program(const std::string& name, const std::string& path_env) {
  if (name.find('/') != std::string::npos) {
    if (std::string why = executable_problem(name); !why.empty()) {
      throw FlagError("dpar-launch: program " + name + ": " + why);
    }
    return name;
  }
  // POSIX: an empty PATH entry means the current directory.
  for (std::string dir : split(path_env.empty() ? "/usr/local/bin:/usr/bin:/bin" : path_env, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (executable_problem(candidate).empty()) return candidate;
  }
  throw FlagError("dpar-launch: program '" + name + "' not found in PATH (" + path_env + ")");
}

Child spawn_worker(const std::string& path, const std::vector<std::string>& argv, const Env& env,
                   const sigset_t& child_mask, const std::vector<int>& cpus) {
  // Everything the child needs is built before fork: after fork only async-signal-safe calls.
  std::vector<char*> c_argv;
  for (const std::string& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (const auto& [key, value] : env) env_strings.push_back(key + "=" + value);
  std::vector<char*> c_env;
  for (std::string& s : env_strings) c_env.push_back(s.data());
  c_env.push_back(nullptr);
  char exec_failed[512];
  std::snprintf(exec_failed, sizeof exec_failed, "dpar-launch: cannot execute %s: ", path.c_str());
  cpu_set_t cpu_set;
  CPU_ZERO(&cpu_set);
  for (int cpu : cpus) CPU_SET(cpu, &cpu_set);
  char bind_failed[512];
  std::snprintf(bind_failed, sizeof bind_failed,
                "dpar-launch: cannot bind %s to CPUs %s: ", path.c_str(),
                cpu_list_text(cpus).c_str());

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw Error(std::string("dpar-launch: pipe failed: ") + std::strerror(errno));
  }
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw Error(std::string("dpar-launch: fork failed: ") + std::strerror(err));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // The launcher may have died between fork and prctl; then nobody would send the signal.
    if (::getppid() != launcher) ::_exit(1);
    const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    // The launcher ignores SIGPIPE for itself; the worker gets the usual defaults. Other
    // dispositions are the launcher's caller's and pass through exec unchanged.
    ::signal(SIGPIPE, SIG_DFL);
    ::signal(SIGCHLD, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &child_mask, nullptr);
    const char* failed = bind_failed;
    if (cpus.empty() || ::sched_setaffinity(0, sizeof cpu_set, &cpu_set) == 0) {
      ::execve(path.c_str(), c_argv.data(), c_env.data());
      failed = exec_failed;
    }
    const int err = errno;
    const char* why = std::strerror(err);
    (void)!::write(STDERR_FILENO, failed, std::strlen(failed));
    (void)!::write(STDERR_FILENO, why, std::strlen(why));
    (void)!::write(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  // Also set the group from the parent: whichever of the two runs first, the group exists
  // before the launcher might signal it.
  ::setpgid(pid, pid);
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return Child{pid, fds[0]};
}

}  // namespace dpar::launch
