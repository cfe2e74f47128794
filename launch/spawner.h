#pragma once
// Starting one worker: fork, a process group of its own, a parent-death signal, stdout and
// stderr into a pipe the launcher reads, then exec.
#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "environment.h"

namespace dpar::launch {

// Finds the executable the way execvp would: a name with a '/' is used as is, otherwise it is
// looked up in `path_env` (PATH). Throws FlagError when there is no such executable file.
std::string resolve_program(const std::string& name, const std::string& path_env);

struct Child {
  pid_t pid = -1;   // also its process group id
  int output = -1;  // read end of its stdout+stderr pipe (non-blocking, close-on-exec)
};

// Starts `path` with `argv` (argv[0] included) and `env`. The child:
//  - leads its own process group, so signals reach the worker and anything it starts, and a
//    Ctrl-C at the terminal reaches the launcher, which decides what the workers get;
//  - gets SIGKILL if the launcher dies (PR_SET_PDEATHSIG), so no worker outlives it;
//  - has `child_mask` as its signal mask and default signal handlers, stdin from /dev/null;
//  - runs on `cpus` only (sched_setaffinity, inherited by its threads and children), unless
//    that is empty.
// If binding or exec fails the child prints why on its output and exits with status 127.
Child spawn_worker(const std::string& path, const std::vector<std::string>& argv, const Env& env,
                   const sigset_t& child_mask, const std::vector<int>& cpus = {});

}  // namespace dpar::launch
