#pragma once
// Where the MobileNetV3 trainer's figures go: PaddlePaddle-format log lines on stdout (every
// rank prints its own; dpar-launch echoes rank 0's) and, with --tensorboard DIR, TensorBoard
// scalars written by rank 0 (trainer 0 in ps mode; the other ps trainers each write a file
// with their own rank<N>/ips), flushed at every log line so a crash loses at most one logging
// interval. Tags:
//   train/loss, train/top1, train/top5, train/lr, train/ips, train/reader_cost,
//   train/batch_cost, train/peak_memory_mb     at each logged step (global step, from 1)
//   rank<N>/ips                                 every rank's images/s, so a straggler shows
//   eval/loss, eval/top1, eval/top5             at the global step that ended each epoch
#include <cstdint>
#include <memory>
#include <string>

#include "dpar/data/dataloader.h"
#include "dpar/distributed/data_parallel.h"
#include "dpar/io/summary_writer.h"
#include "dpar/tensor/tensor.h"

namespace mobilenetv3 {

// Loss and top-1/top-5 counts over a window of batches.
struct Metrics {
  double loss = 0, top1 = 0, top5 = 0;
  int64_t samples = 0;
  void add(double batch_loss, const dpar::Tensor& logits, const dpar::Tensor& labels);
  double avg_loss() const { return samples ? loss / static_cast<double>(samples) : 0; }
  double acc1() const { return samples ? top1 / static_cast<double>(samples) : 0; }
  double acc5() const { return samples ? top5 / static_cast<double>(samples) : 0; }
};

// The best evaluation so far (top-1), as checkpoints record it (TrainingState::best_*).
struct BestEpoch {
  double top1 = -1;
  int64_t epoch = -1;
  // Takes epoch's figures; true when they are the best so far (best.ckpt is due).
  bool update(const Metrics& m, int64_t e) {
    if (m.acc1() <= top1) return false;
    top1 = m.acc1();
    epoch = e;
    return true;
  }
};

// Each rank evaluates its shard of the validation set; the sums are all-reduced over the
// default group so every rank reports the same figures (padding of the last shard counts a few
// images twice, as in DDP). Without a default group (one process, or an elastic member that
// evaluates alone) it is the loader's whole set. Rank 0 shows the progress over its shard (a
// line rewritten on a terminal; in a log, plain lines only when the evaluation lasts).
Metrics evaluate(dpar::nn::Module& model, dpar::data::DataLoader& loader, dpar::Device device,
                 bool show_progress);

// One logging interval of training, as the log line reports it.
struct StepReport {
  int64_t epoch = 0, iter = 0, global_step = 0;
  Metrics window;
  double lr = 0;
  double reader_seconds = 0, batch_seconds = 0;  // summed over the window
  int64_t batch_size = 0;                        // per rank
  // This rank's training memory (DataParallel::memory_stats: 1/N of the gradients and of the
  // optimizer state with --shard).
  dpar::dist::ShardMemory memory;
};

class TrainLog {
 public:
  // tensorboard_dir empty: log lines only. gather_ranks: every rank calls step() at the same
  // iterations and rank 0 collects their images/s over the default group (collective jobs);
  // otherwise (ps trainers) each process writes its own figure.
  TrainLog(const std::string& tensorboard_dir, int rank, bool gather_ranks);

  void step(const StepReport& report);
  void eval(int64_t epoch, int64_t global_step, const Metrics& m, double elapsed_seconds);
  // Flushes and closes the event file (fsync); a no-op without one.
  void close();

 private:
  int rank_;
  bool gather_ranks_;
  bool tensorboard_;  // on every rank (they all join the gather), writing on rank 0
  std::unique_ptr<dpar::io::SummaryWriter> writer_;
};

}  // namespace mobilenetv3
