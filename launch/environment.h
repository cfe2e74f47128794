#pragma once
// The environment of each worker: dpar's own DPAR_* variables plus the names PaddlePaddle's
// and torchrun's launchers use, so programs written for either find what they expect.
//
// GPUs: every process on a node sees the node's GPUs, in local-rank order, through
// CUDA_VISIBLE_DEVICES (NCCL's peer-to-peer paths need the processes to see each other's
// devices), and uses the one at index LOCAL_RANK: DPAR_DEVICE=gpu:<local rank> and
// FLAGS_selected_gpus=<local rank>. With --gpus=0,1 that is simply gpu:0 and gpu:1. --gpus ids
// are the caller's ids: when the launcher itself runs with CUDA_VISIBLE_DEVICES set (a
// scheduler's allocation), each id must be one of those entries, as paddle's launcher asks.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "plan.h"

namespace dpar::launch {

using Env = std::map<std::string, std::string>;

Env current_environment();

// CPUs this process may run on (sched_getaffinity), at least 1.
int usable_cpus();

// `base` is the launcher's environment; the result is base plus the variables above,
// DPAR_RESTART_COUNT, and OMP_NUM_THREADS = max(1, cpus / local processes) unless base sets it.
// Throws FlagError when a GPU is outside an inherited CUDA_VISIBLE_DEVICES.
Env worker_environment(const LaunchPlan& plan, const Process& proc, const Env& base,
                       int restart_count, int cpus);

// The variables the launcher sets, in a readable order, with their values in `env`.
std::vector<std::pair<std::string, std::string>> launcher_variables(const Env& env);

// A boxed two-column table of launcher_variables(env) under `title`.
std::string format_env_table(const Env& env, const std::string& title);

}  // namespace dpar::launch
