#pragma once
// The environment of each worker: dpar's own DPAR_* variables plus the names PaddlePaddle's
// and torchrun's launchers use, so programs written for either find what they expect.
//
// GPUs: every process on a node sees the node's GPUs, in local-rank order, through
// CUDA_VISIBLE_DEVICES (NCCL's peer-to-peer paths need the processes to see each other's
// devices), and uses the one at index LOCAL_RANK: DPAR_DEVICE=gpu:<local rank> and
// FLAGS_selected_gpus=<local rank>. With --gpus=0,1 that is simply gpu:0 and gpu:1. --gpus ids
// are the caller's ids: when the launcher itself runs with CUDA_VISIBLE_DEVICES set (a
// scheduler's allocation), each id must be one of those entries, as paddle's launcher asks;
// otherwise each must be a CUDA device of this machine (check_local_gpus).
#include <functional>
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

// The CUDA devices of this machine as dpar sees them: their count and, when there is none,
// why (dpar::cuda_device_count() and dpar::cuda_unavailable_reason()).
struct GpuInventory {
  int count = 0;
  std::string unavailable_reason;
};
GpuInventory this_machine_gpus();

// Checks, before anything starts, that every GPU this node's processes use exists here. With a
// non-empty inherited CUDA_VISIBLE_DEVICES in `base` that list is the rule and
// worker_environment checks it; otherwise each id must be below the count `inventory`
// returns, which is asked only when a local process uses a GPU. Only this node's GPUs are
// checked: every node's launcher checks its own. Throws FlagError, e.g. "dpar-launch:
// --gpus=0,1: GPU 1 is not a device of this machine (it has 1 CUDA device: 0)".
void check_local_gpus(const LaunchPlan& plan, const Env& base,
                      const std::function<GpuInventory()>& inventory);

// `base` is the launcher's environment; the result is base plus the variables above,
// DPAR_RESTART_COUNT, and OMP_NUM_THREADS = max(1, cpus / local processes) unless base sets it.
// A process bound to `cpu_share` (--cpu_bind=cores, collective mode) gets DPAR_CPUS (its CPU
// list) and OMP_NUM_THREADS = the share's size unless base sets it; otherwise DPAR_CPUS is
// removed, so an inherited one does not describe it.
// Throws FlagError when a GPU is outside an inherited CUDA_VISIBLE_DEVICES.
//
// ps mode (plan.ps_mode) sets instead, for every process: TRAINING_ROLE (PSERVER | TRAINER),
// DPAR_RUN_MODE=ps, DPAR_PSERVER_ENDPOINTS = PADDLE_PSERVERS_IP_PORT_LIST (all servers, by id),
// DPAR_SERVER_NUM, DPAR_TRAINERS_NUM = PADDLE_TRAINERS_NUM, DPAR_JOB_ID, DPAR_JOB_TOKEN
// (plan.job_token), POD_IP (this node), DPAR_NODE_RANK, DPAR_NNODES, DPAR_RESTART_COUNT and
// DPAR_DEVICE=cpu; servers also DPAR_SERVER_ID, PADDLE_PORT, DPAR_CURRENT_ENDPOINT =
// PADDLE_CURRENT_ENDPOINT (their ip:port) and OMP_NUM_THREADS=1 unless set; trainers
// DPAR_TRAINER_ID = PADDLE_TRAINER_ID and OMP_NUM_THREADS = max(1, cpus / local trainers)
// unless set. Inherited values of other variables are left as they are.
Env worker_environment(const LaunchPlan& plan, const Process& proc, const Env& base,
                       int restart_count, int cpus, const std::vector<int>& cpu_share = {});

// The variables the launcher sets, in a readable order, with their values in `env`;
// DPAR_JOB_TOKEN's value is shown as "(set)".
std::vector<std::pair<std::string, std::string>> launcher_variables(const Env& env);

// A boxed two-column table of launcher_variables(env) under `title`.
std::string format_env_table(const Env& env, const std::string& title);

}  // namespace dpar::launch
