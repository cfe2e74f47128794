#pragma once
// train --elastic: the MobileNetV3 trainer as a member of an elastic job (dpar-launch
// --nnodes=MIN:MAX; dpar/distributed/elastic.h). The model, optimizer, LR schedule, dropout
// generator and the position in the epoch are committed in memory after every step; when a
// member dies, stops or joins, the others restore the last commit, form a group of the new size
// and go on from there, in the same processes. The global batch stays the full job's (--batch-size
// x DPAR_ELASTIC_MAX members) through gradient accumulation, so the learning-rate schedule and
// the samples of each step do not depend on how many members there are; the rest of the epoch
// is re-sharded over the new world (EpochRemainderSampler), no sample skipped or seen twice.
// Checkpoints on disk are those of the fixed-world trainer (train_checkpoint.h), for a job that
// loses every member at once: resumed by either trainer at any world size.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dpar/distributed/data_parallel.h"
#include "dpar/optim/lr_scheduler.h"
#include "dpar/optim/optimizer.h"

namespace mobilenetv3 {

struct ElasticTrainSettings {
  std::string model_name, data_path, output_dir;
  std::string pretrained;   // weights every member starts from (--pretrained)
  std::string tensorboard;  // the round's rank 0 writes event files here (--tensorboard)
  int64_t img_size = 32, num_classes = 0, limit_train = 0, limit_val = 0;
  int64_t epochs = 1, batch_size = 64, print_freq = 50;
  int workers = 1;
  uint64_t seed = 0;
  double label_smoothing = 0, clip_grad_norm = 0;
  std::string lr_scheduler;  // its name, recorded in checkpoints
  dpar::dist::DataParallelOptions dp_options;
  // On-disk checkpoints, as the fixed-world trainer writes them (the round's rank 0 writes):
  // every step_interval global steps (0: off) and every epoch_interval epochs (and the last),
  // keeping the newest max_checkpoints. They record the planned job's shape (--batch-size x
  // DPAR_ELASTIC_MAX), so either trainer resumes them, at any world size.
  std::string checkpoint_dir;
  // --resume: "auto"/"latest" (the newest in checkpoint_dir; none: a fresh start), a folder or
  // a file. Every member resolves it when it starts; a member that joins a running job then
  // receives the live state, which is newer.
  std::string resume;
  int64_t max_checkpoints = 3, epoch_interval = 1, step_interval = 0;
  bool export_inference = true;  // with output_dir: the ONNX inference model too
  // The optimizer over the model's parameters, and its schedule over the job's steps.
  std::function<std::shared_ptr<dpar::optim::Optimizer>(const std::vector<dpar::Tensor>&)>
      make_optimizer;
  std::function<std::unique_ptr<dpar::optim::LRScheduler>(dpar::optim::Optimizer&,
                                                          int64_t steps_per_epoch)>
      make_scheduler;
};

// Trains until every epoch is done; the member that is rank 0 at the end writes
// <output_dir>/<model>.safetensors and the inference model. Returns the process's exit status.
int train_elastic(const ElasticTrainSettings& settings);

}  // namespace mobilenetv3
