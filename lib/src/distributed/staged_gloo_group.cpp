// CUDA tensors on the Gloo backend through host copies (see gpu_groups.h).
#include <functional>
#include <mutex>

#include "distributed/gpu_groups.h"
#include "dpar/core/error.h"

namespace dpar::dist::detail {
namespace {

std::vector<Tensor> to_host(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  // A device-to-host copy waits for the kernels that produced the tensor.
  for (const Tensor& t : tensors) host.push_back(t.to(Device::cpu()));
  return host;
}

// Host buffers for a collective's outputs (their values are overwritten).
std::vector<Tensor> host_like(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  for (const Tensor& t : tensors) host.push_back(Tensor::empty(t.shape(), t.dtype()));
  return host;
}

// The Gloo work, plus the copy of its results back to the device, done once by the first
// successful wait().
class StagedWork final : public Work {
 public:
  StagedWork(std::shared_ptr<Work> inner, std::function<void()> copy_back)
      : inner_(std::move(inner)), copy_back_(std::move(copy_back)) {}
  bool is_completed() override { return inner_->is_completed(); }
  void wait(Millis timeout) override {
    inner_->wait(timeout);
    std::lock_guard<std::mutex> lock(mutex_);
    if (copy_back_) {
      copy_back_();
      copy_back_ = nullptr;  // drops the host buffers too
    }
  }

 private:
  std::shared_ptr<Work> inner_;
  std::mutex mutex_;
  std::function<void()> copy_back_;
};

std::shared_ptr<Work> finish(std::shared_ptr<Work> inner, std::function<void()> copy_back,
                             bool async_op) {
  auto work = std::make_shared<StagedWork>(std::move(inner), std::move(copy_back));
  if (!async_op) work->wait(Millis(0));
  return work;
}

void copy_all(std::vector<Tensor>& to, const std::vector<Tensor>& from) {
  for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
}

class StagedGlooGroup final : public ProcessGroup {
 public:
  explicit StagedGlooGroup(std::shared_ptr<ProcessGroup> gloo)
      : ProcessGroup(gloo->rank(), gloo->size()), gloo_(std::move(gloo)) {}
  std::string backend_name() const override { return "gloo (host-staged CUDA tensors)"; }

  std::shared_ptr<Work> allreduce(std::vector<Tensor> tensors, ReduceOp op,
                                  bool async_op) override {
    auto host = to_host(tensors);
    auto inner = gloo_->allreduce(host, op, async_op);
    return finish(
        std::move(inner), [tensors, host]() mutable { copy_all(tensors, host); }, async_op);
  }
  std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root, bool async_op) override {
    auto host = to_host(tensors);
    auto inner = gloo_->broadcast(host, root, async_op);
    return finish(
        std::move(inner), [tensors, host]() mutable { copy_all(tensors, host); }, async_op);
  }
  std::shared_ptr<Work> allgather(std::vector<Tensor> outputs, Tensor input,
                                  bool async_op) override {
    auto host_out = host_like(outputs);
    auto inner = gloo_->allgather(host_out, input.to(Device::cpu()), async_op);
    return finish(
        std::move(inner), [outputs, host_out]() mutable { copy_all(outputs, host_out); }, async_op);
  }
  std::shared_ptr<Work> reduce_scatter(Tensor output, std::vector<Tensor> inputs, ReduceOp op,
                                       bool async_op) override {
    Tensor host_out = Tensor::empty(output.shape(), output.dtype());
    auto inner = gloo_->reduce_scatter(host_out, to_host(inputs), op, async_op);
    return finish(
        std::move(inner), [output, host_out]() mutable { output.copy_(host_out); }, async_op);
  }
  std::shared_ptr<Work> barrier(bool async_op) override { return gloo_->barrier(async_op); }
  void abort(const std::string& why) override { gloo_->abort(why); }

 private:
  std::shared_ptr<ProcessGroup> gloo_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_staged_gloo_group(std::shared_ptr<ProcessGroup> gloo) {
  DPAR_CHECK(gloo != nullptr, "make_staged_gloo_group: no gloo group");
  return std::make_shared<StagedGlooGroup>(std::move(gloo));
}

}  // namespace dpar::dist::detail
