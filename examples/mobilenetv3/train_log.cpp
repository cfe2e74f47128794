#include "train_log.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "dpar/autograd/grad_mode.h"
#include "dpar/core/progress.h"
#include "dpar/core/sysinfo.h"
#include "dpar/distributed/parallel_env.h"
#include "dpar/distributed/process_group.h"
#include "dpar/tensor/ops.h"

namespace mobilenetv3 {

using dpar::Tensor;

void Metrics::add(double batch_loss, const Tensor& logits, const Tensor& labels) {
  const int64_t n = labels.numel();
  const int64_t k = std::min<int64_t>(5, logits.size(1));
  const std::vector<int64_t> top = dpar::topk_indices(logits, k).to_int_vector();
  const std::vector<int64_t> y = labels.to_int_vector();
  for (int64_t i = 0; i < n; ++i) {
    const auto label = y[static_cast<size_t>(i)];
    top1 += top[static_cast<size_t>(i * k)] == label;
    for (int64_t j = 0; j < k; ++j) {
      if (top[static_cast<size_t>(i * k + j)] == label) {
        top5 += 1;
        break;
      }
    }
  }
  loss += batch_loss * static_cast<double>(n);
  samples += n;
}

TrainLog::TrainLog(const std::string& tensorboard_dir, int rank, bool gather_ranks)
    : rank_(rank), gather_ranks_(gather_ranks), tensorboard_(!tensorboard_dir.empty()) {
  // Without a group to gather over (ps trainers), every other trainer writes its own images/s
  // into a small file of its own in the same folder; TensorBoard (and plot_run.py) merge the
  // files of a folder into one run.
  if (tensorboard_ && (rank_ == 0 || !gather_ranks_)) {
    writer_ = std::make_unique<dpar::io::SummaryWriter>(
        tensorboard_dir, rank_ == 0 ? "" : ".rank" + std::to_string(rank_));
    std::printf("tensorboard: writing %s\n", writer_->path().c_str());
    std::fflush(stdout);
  }
}

void TrainLog::step(const StepReport& r) {
  const double images = static_cast<double>(r.window.samples);
  const double iters = images / static_cast<double>(r.batch_size);
  const double ips = r.batch_seconds > 0 ? images / r.batch_seconds : 0;
  constexpr double kMB = 1024.0 * 1024.0;
  std::printf(
      "[Epoch %lld, iter: %lld] top1: %.5f, top5: %.5f, lr: %.6f, loss: %.5f, memory per rank: "
      "params %.2f MB, grads %.2f MB, optimizer %.2f MB, "
      "avg_reader_cost: %.5f sec, avg_batch_cost: %.5f sec, avg_samples: %lld, "
      "avg_ips: %.2f images/sec.\n",
      static_cast<long long>(r.epoch), static_cast<long long>(r.iter), r.window.acc1(),
      r.window.acc5(), r.lr, r.window.avg_loss(), static_cast<double>(r.memory.parameters) / kMB,
      static_cast<double>(r.memory.gradients) / kMB,
      static_cast<double>(r.memory.optimizer_state) / kMB, r.reader_seconds / iters,
      r.batch_seconds / iters, static_cast<long long>(r.batch_size), ips);
  std::fflush(stdout);
  if (!tensorboard_) return;
  // Every rank's images/s reaches rank 0 (one tiny synchronous allgather per log line).
  std::vector<float> rank_ips{static_cast<float>(ips)};
  if (gather_ranks_ && dpar::dist::get_world_size() > 1) {
    const int world = dpar::dist::get_world_size();
    std::vector<Tensor> gathered;
    for (int i = 0; i < world; ++i) gathered.push_back(Tensor::zeros({1}));
    dpar::dist::default_group().allgather(gathered, Tensor::from_vector(rank_ips, {1}),
                                          /*async_op=*/false);
    rank_ips.clear();
    for (const Tensor& t : gathered) rank_ips.push_back(t.to_float_vector()[0]);
  }
  if (!writer_) return;
  if (rank_ != 0) {  // a ps trainer's own file: its images/s only
    writer_->add_scalar("rank" + std::to_string(rank_) + "/ips", ips, r.global_step);
    writer_->flush();
    return;
  }
  std::vector<std::pair<std::string, double>> values = {
      {"train/loss", r.window.avg_loss()},
      {"train/top1", r.window.acc1()},
      {"train/top5", r.window.acc5()},
      {"train/lr", r.lr},
      {"train/ips", ips},
      {"train/reader_cost", r.reader_seconds / iters},
      {"train/batch_cost", r.batch_seconds / iters},
      {"train/peak_memory_mb", dpar::sysinfo::peak_rss_mb()}};
  // Without the gather (ps mode, one process) the one figure is this process's own.
  for (size_t i = 0; i < rank_ips.size(); ++i) {
    const int who = rank_ips.size() == 1 ? rank_ : static_cast<int>(i);
    values.emplace_back("rank" + std::to_string(who) + "/ips", rank_ips[i]);
  }
  writer_->add_scalars(values, r.global_step);
  writer_->flush();
}

void TrainLog::eval(int64_t epoch, int64_t global_step, const Metrics& m, double elapsed_seconds) {
  std::printf(
      "[Eval][Epoch %lld][Avg] loss: %.5f, top1: %.5f, top5: %.5f | peak memory: %.1f MB, "
      "elapsed %.1f s\n",
      static_cast<long long>(epoch), m.avg_loss(), m.acc1(), m.acc5(), dpar::sysinfo::peak_rss_mb(),
      elapsed_seconds);
  std::fflush(stdout);
  if (!writer_ || rank_ != 0) return;
  writer_->add_scalars(
      {{"eval/loss", m.avg_loss()}, {"eval/top1", m.acc1()}, {"eval/top5", m.acc5()}}, global_step);
  writer_->flush();
}

void TrainLog::close() {
  if (writer_) writer_->close();
  writer_.reset();
}

Metrics evaluate(dpar::nn::Module& model, dpar::data::DataLoader& loader, dpar::Device device,
                 bool show_progress) {
  using namespace dpar;
  model.eval();
  NoGradGuard no_grad;
  Metrics m;
  std::optional<Progress> progress;
  if (show_progress) {
    progress.emplace("eval", static_cast<double>(loader.num_samples()), "images");
  }
  for (data::Batch& batch : loader.epoch(0)) {
    const Tensor images = batch.images.to(device, /*non_blocking=*/true);
    const Tensor labels = batch.labels.to(device, /*non_blocking=*/true);
    Tensor logits = model.forward(images);
    m.add(cross_entropy(logits, labels).item(), logits, labels);
    if (progress) progress->advance(static_cast<double>(batch.labels.numel()));
  }
  if (progress) progress->finish();
  if (dist::get_world_size() > 1) {
    Tensor sums = Tensor::from_vector(
        std::vector<float>{static_cast<float>(m.loss), static_cast<float>(m.top1),
                           static_cast<float>(m.top5), static_cast<float>(m.samples)},
        {4});
    dist::default_group().allreduce({sums}, dist::ReduceOp::Sum, /*async_op=*/false);
    const std::vector<float> v = sums.to_float_vector();
    m.loss = v[0];
    m.top1 = v[1];
    m.top5 = v[2];
    m.samples = static_cast<int64_t>(v[3]);
  }
  model.train();
  return m;
}

}  // namespace mobilenetv3
