#pragma once
// --cpu_bind=cores: each of a node's processes runs on its own share of the CPUs the launcher
// may use, as Open MPI's `--bind-to core` (its default for two processes or fewer) and Intel's
// PyTorch launcher (`ipexrun`, `torch.backends.xeon.run_cpu`) do for CPU jobs.
//
// Why: unbound, the kernel places a rank's threads on any CPU, so a rank's communication
// thread that wakes while every core trains may preempt another rank's training thread, and a
// rank's OpenMP threads may migrate between cores (and memory nodes) with cold caches. On the
// 2-core AVX2 machine (AMD EPYC, Zen 3) it measured no difference: bench_ddp, 2 ranks x 1
// thread, four interleaved `--rounds 5 --peer=false` invocations each way reached 84, 85, 85
// and 93% of the independent-process ceiling bound against 83, 88, 81 and 94% unbound; PyTorch
// DDP alone (bench/peers/torch_ddp.py, three pairs) ran 67-76 img/s bound, 64-79 unbound. It is
// meant for machines with more cores, threads per rank and sockets. Not the default: two
// unrelated jobs on one machine would each bind their first rank to the first CPUs and share
// them while the others idle (ctest -j runs such jobs). With --gpus the shares follow the CPU
// numbering, not which socket each GPU hangs off.
#include <string>
#include <vector>

namespace dpar::launch {

// The CPUs this process may run on (sched_getaffinity), ascending.
std::vector<int> allowed_cpus();

// For each CPU in `cpus`, an id shared by the CPUs of one physical core (its hardware
// threads): the first CPU of its /sys thread_siblings_list, or the CPU itself where that is
// not readable.
std::vector<int> core_ids(const std::vector<int>& cpus);

// Splits `cpus` (ascending; core[i] the core id of cpus[i]) into `processes` shares, in order:
// whole physical cores, the same number to each, when there are at least as many cores as
// processes; otherwise single CPUs (hardware threads), when there are enough of those. Cores
// (or CPUs) the division leaves over stay unused. Shares are equal in units, not always in
// speed: single hardware threads of one core share it, and a core of which the launcher may
// use only some threads counts as a core. Throws FlagError when there are fewer CPUs than
// processes.
std::vector<std::vector<int>> cpu_shares(const std::vector<int>& cpus, const std::vector<int>& core,
                                         int processes);

// "0-3,8,10-11" (the kernel's cpu-list format; ascending input).
std::string cpu_list_text(const std::vector<int>& cpus);

}  // namespace dpar::launch
