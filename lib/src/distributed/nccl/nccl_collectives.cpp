// ProcessGroupNccl's collectives: argument checks on the caller's thread, then the NCCL calls
// (with flattening copies where the tensors are several or not dense) as the body that
// ProcessGroupNccl::run places on the communication stream.
#include <algorithm>
#include <numeric>

#include "distributed/nccl/process_group_nccl.h"
#include "dpar/core/error.h"
#include "tensor/cuda/cuda_context.h"

namespace dpar::dist::detail {
namespace {

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  DPAR_FAIL("nccl: unsupported dtype");
}

// Avg is NCCL's own: a pre-multiplied sum for floats, a sum then a division for integers
// (truncating toward zero), as the Gloo group does.
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  DPAR_FAIL("nccl: unsupported reduce op");
}

Device check_cuda(const std::vector<Tensor>& tensors, const char* what) {
  DPAR_CHECK(!tensors.empty(), what, ": no tensors given");
  const Device device = tensors[0].defined() ? tensors[0].device() : Device::cpu();
  for (const Tensor& t : tensors) {
    DPAR_CHECK(t.defined(), what, ": got an undefined tensor");
    DPAR_CHECK(t.device().is_cuda(), what, ": the nccl group takes CUDA tensors, got a tensor on ",
               t.device().str());
    DPAR_CHECK(t.device() == device, what, ": all tensors must be on one device, got ",
               device.str(), " and ", t.device().str());
  }
  return device;
}

void check_same_dtype(const std::vector<Tensor>& tensors, DType dtype, const char* what) {
  for (const Tensor& t : tensors) {
    DPAR_CHECK(t.dtype() == dtype, what, ": tensors of one call must share a dtype, got ",
               dtype_name(dtype), " and ", dtype_name(t.dtype()));
  }
}

int64_t total_numel(const std::vector<Tensor>& tensors) {
  return std::accumulate(tensors.begin(), tensors.end(), int64_t{0},
                         [](int64_t n, const Tensor& t) { return n + t.numel(); });
}

// Copies tensors, in order, into one flat buffer made on the current (communication) stream.
Tensor flatten_into_new(const std::vector<Tensor>& tensors, DType dtype, Device device) {
  Tensor flat = Tensor::empty({total_numel(tensors)}, dtype, device);
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    flat.slice(0, offset, offset + t.numel()).view(t.shape()).copy_(t);
    offset += t.numel();
  }
  return flat;
}

void unflatten_from(const Tensor& flat, std::vector<Tensor>& tensors) {
  int64_t offset = 0;
  for (Tensor& t : tensors) {
    t.copy_(flat.slice(0, offset, offset + t.numel()).view(t.shape()));
    offset += t.numel();
  }
}

}  // namespace

std::shared_ptr<Work> ProcessGroupNccl::allreduce(std::vector<Tensor> tensors, ReduceOp op,
                                                  bool async_op) {
  const Device device = check_cuda(tensors, "allreduce");
  const DType dtype = tensors[0].dtype();
  check_same_dtype(tensors, dtype, "allreduce");
  auto info = describe_call(CollectiveKind::Allreduce, tensors, op, 0);
  const Body body = [&](ncclComm_t comm, cudaStream_t stream) {
    // Element-wise reductions do not care about layout: a dense tensor is reduced in place
    // over its memory; several tensors or a strided view go through one flat buffer.
    const bool in_place = tensors.size() == 1 && tensors[0].is_dense();
    Tensor flat = in_place ? tensors[0] : flatten_into_new(tensors, dtype, device);
    if (flat.numel() > 0) {
      call_nccl(comm, info, "ncclAllReduce", [&] {
        return ncclAllReduce(flat.raw_data(), flat.raw_data(), static_cast<size_t>(flat.numel()),
                             nccl_dtype(dtype), nccl_op(op), comm, stream);
      });
    }
    if (!in_place) unflatten_from(flat, tensors);
  };
  return run(info, device, tensors, body, async_op);
}

std::shared_ptr<Work> ProcessGroupNccl::broadcast(std::vector<Tensor> tensors, int root,
                                                  bool async_op) {
  const Device device = check_cuda(tensors, "broadcast");
  DPAR_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is outside a world of size ",
             size_);
  auto info = describe_call(CollectiveKind::Broadcast, tensors, ReduceOp::Sum, root);
  const Body body = [&](ncclComm_t comm, cudaStream_t stream) {
    std::vector<Tensor> dense(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      dense[i] = tensors[i].is_dense() ? tensors[i] : tensors[i].contiguous();
    }
    // One group call: NCCL fuses the broadcasts into one launch.
    call_nccl(comm, info, "ncclGroupStart", [&] { return ncclGroupStart(); });
    for (const Tensor& t : dense) {
      if (t.numel() == 0) continue;
      call_nccl(comm, info, "ncclBroadcast", [&] {
        return ncclBroadcast(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()),
                             nccl_dtype(t.dtype()), root, comm, stream);
      });
    }
    call_nccl(comm, info, "ncclGroupEnd", [&] { return ncclGroupEnd(); });
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!dense[i].is_same(tensors[i])) tensors[i].copy_(dense[i]);
    }
  };
  return run(info, device, tensors, body, async_op);
}

std::shared_ptr<Work> ProcessGroupNccl::allgather(std::vector<Tensor> outputs, Tensor input,
                                                  bool async_op) {
  std::vector<Tensor> all = outputs;
  all.push_back(input);
  const Device device = check_cuda(all, "allgather");
  DPAR_CHECK(static_cast<int>(outputs.size()) == size_, "allgather: expected ", size_,
             " output tensors (one per rank), got ", outputs.size());
  check_same_dtype(outputs, input.dtype(), "allgather");
  DPAR_CHECK(outputs[rank_].numel() == input.numel(), "allgather: the input ", input.shape(),
             " must have as many elements as outputs[", rank_, "] ", outputs[rank_].shape());
  auto info = describe_call(CollectiveKind::Allgather, outputs, ReduceOp::Sum, 0);
  const Body body = [&](ncclComm_t comm, cudaStream_t stream) {
    const int64_t n = input.numel();
    const bool even = std::all_of(outputs.begin(), outputs.end(),
                                  [&](const Tensor& t) { return t.numel() == n; });
    Tensor source = input.is_contiguous() ? input : input.contiguous();
    if (even) {
      if (n == 0) return;
      Tensor gathered = Tensor::empty({n * size_}, input.dtype(), device);
      call_nccl(comm, info, "ncclAllGather", [&] {
        return ncclAllGather(source.raw_data(), gathered.raw_data(), static_cast<size_t>(n),
                             nccl_dtype(input.dtype()), comm, stream);
      });
      unflatten_from(gathered, outputs);
      return;
    }
    // Uneven pieces (a buffer split by size): rank r broadcasts its piece, all in one group
    // call, which NCCL runs as one fused launch.
    std::vector<Tensor> pieces(outputs.size());
    call_nccl(comm, info, "ncclGroupStart", [&] { return ncclGroupStart(); });
    for (size_t r = 0; r < outputs.size(); ++r) {
      pieces[r] = outputs[r].is_contiguous()
                      ? outputs[r]
                      : Tensor::empty(outputs[r].shape(), outputs[r].dtype(), device);
      if (pieces[r].numel() == 0) continue;
      const void* send = static_cast<int>(r) == rank_ ? source.raw_data() : pieces[r].raw_data();
      call_nccl(comm, info, "ncclBroadcast", [&] {
        return ncclBroadcast(send, pieces[r].raw_data(), static_cast<size_t>(pieces[r].numel()),
                             nccl_dtype(input.dtype()), static_cast<int>(r), comm, stream);
      });
    }
    call_nccl(comm, info, "ncclGroupEnd", [&] { return ncclGroupEnd(); });
    for (size_t r = 0; r < outputs.size(); ++r) {
      if (!pieces[r].is_same(outputs[r])) outputs[r].copy_(pieces[r]);
    }
  };
  return run(info, device, all, body, async_op);
}

std::shared_ptr<Work> ProcessGroupNccl::reduce_scatter(Tensor output, std::vector<Tensor> inputs,
                                                       ReduceOp op, bool async_op) {
  std::vector<Tensor> all = inputs;
  all.push_back(output);
  const Device device = check_cuda(all, "reduce_scatter");
  DPAR_CHECK(static_cast<int>(inputs.size()) == size_, "reduce_scatter: expected ", size_,
             " input tensors (one per rank), got ", inputs.size());
  check_same_dtype(inputs, output.dtype(), "reduce_scatter");
  DPAR_CHECK(inputs[rank_].numel() == output.numel(), "reduce_scatter: the output ", output.shape(),
             " must have as many elements as inputs[", rank_, "] ", inputs[rank_].shape());
  auto info = describe_call(CollectiveKind::ReduceScatter, inputs, op, 0);
  const Body body = [&](ncclComm_t comm, cudaStream_t stream) {
    const ncclDataType_t dtype = nccl_dtype(output.dtype());
    Tensor result =
        output.is_contiguous() ? output : Tensor::empty(output.shape(), output.dtype(), device);
    const bool even = std::all_of(inputs.begin(), inputs.end(),
                                  [&](const Tensor& t) { return t.numel() == inputs[0].numel(); });
    if (even) {
      // Equal pieces: one ncclReduceScatter over the pieces laid end to end.
      Tensor flat = flatten_into_new(inputs, output.dtype(), device);
      if (output.numel() > 0) {
        call_nccl(comm, info, "ncclReduceScatter", [&] {
          return ncclReduceScatter(flat.raw_data(), result.raw_data(),
                                   static_cast<size_t>(output.numel()), dtype, nccl_op(op), comm,
                                   stream);
        });
      }
    } else {
      // Uneven pieces (a buffer split by size): piece r is reduced onto rank r.
      std::vector<Tensor> pieces(inputs.size());
      call_nccl(comm, info, "ncclGroupStart", [&] { return ncclGroupStart(); });
      for (size_t r = 0; r < inputs.size(); ++r) {
        pieces[r] = inputs[r].is_contiguous() ? inputs[r] : inputs[r].contiguous();
        if (pieces[r].numel() == 0) continue;
        void* receive = static_cast<int>(r) == rank_ ? result.raw_data() : pieces[r].raw_data();
        call_nccl(comm, info, "ncclReduce", [&] {
          return ncclReduce(pieces[r].raw_data(), receive, static_cast<size_t>(pieces[r].numel()),
                            dtype, nccl_op(op), static_cast<int>(r), comm, stream);
        });
      }
      call_nccl(comm, info, "ncclGroupEnd", [&] { return ncclGroupEnd(); });
    }
    if (!result.is_same(output)) output.copy_(result.view(output.shape()));
  };
  return run(info, device, all, body, async_op);
}

std::shared_ptr<Work> ProcessGroupNccl::barrier(bool async_op) {
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!comms_.empty()) device = comms_.begin()->first;
  }
  if (device < 0) cuda::check(cudaGetDevice(&device), "cudaGetDevice");
  Tensor token = Tensor::zeros({1}, DType::f32, Device::cuda(device));
  auto work = allreduce({token}, ReduceOp::Sum, /*async_op=*/true);
  // A barrier holds the host: wait for completion (bounded by the timeout) on the host.
  if (!async_op) work->wait(options_.timeout);
  return work;
}

}  // namespace dpar::dist::detail
