// The bodies of ProcessGroupGloo's collectives, run on the group's communication thread.
// A single contiguous tensor is handed to Gloo in place (no copy, no allocation); several
// tensors, or non-contiguous ones, are packed into one reused staging buffer, so several
// tensors travel as one fused message, and unpacked afterwards.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>

#include <cstring>

#include "distributed/gloo/process_group_gloo.h"
#include "distributed/gloo/reduce_functions.h"
#include "distributed/gloo/reduce_scatter_ring.h"

namespace dpar::dist::detail {
namespace {

void pack(const Tensor& t, uint8_t* dst) {
  if (t.is_contiguous()) {
    std::memcpy(dst, t.raw_data(), t.nbytes());
  } else {
    Tensor::from_blob(dst, t.shape(), t.dtype()).copy_(t);
  }
}

void unpack(const uint8_t* src, Tensor& t) {
  if (t.is_contiguous()) {
    std::memcpy(t.raw_data(), src, t.nbytes());
  } else {
    t.copy_(Tensor::from_blob(const_cast<uint8_t*>(src), t.shape(), t.dtype()));
  }
}

size_t total_bytes(const std::vector<Tensor>& tensors) {
  size_t bytes = 0;
  for (const Tensor& t : tensors) bytes += t.nbytes();
  return bytes;
}

bool single_contiguous(const std::vector<Tensor>& tensors) {
  return tensors.size() == 1 && tensors[0].is_contiguous();
}

// Gloo's option setters are templates whose type only fixes the element size.
template <class Options>
void set_output(Options& opts, void* data, size_t bytes, size_t element_size) {
  switch (element_size) {
    case 8:
      opts.template setOutput<int64_t>(static_cast<int64_t*>(data), bytes / 8);
      break;
    case 4:
      opts.template setOutput<float>(static_cast<float*>(data), bytes / 4);
      break;
    case 2:
      opts.template setOutput<uint16_t>(static_cast<uint16_t*>(data), bytes / 2);
      break;
    default:
      opts.template setOutput<uint8_t>(static_cast<uint8_t*>(data), bytes);
      break;
  }
}

}  // namespace

void ProcessGroupGloo::run_allreduce(PendingOp& op) {
  const CollectiveInfo& info = op.work->info();
  std::vector<Tensor>& tensors = op.tensors;
  // Every rank passes the same shapes, so every rank skips alike (DETAIL verifies it).
  if (info.numel == 0 || size_ == 1) return;
  const size_t element_size = dtype_size(info.dtype);
  const size_t bytes = total_bytes(tensors);
  const bool direct = single_contiguous(tensors);
  uint8_t* data = direct ? static_cast<uint8_t*>(tensors[0].raw_data()) : staging(bytes);
  if (!direct) {
    size_t offset = 0;
    for (const Tensor& t : tensors) {
      pack(t, data + offset);
      offset += t.nbytes();
    }
  }
  gloo::AllreduceOptions opts(context_);
  set_output(opts, data, bytes, element_size);
  opts.setReduceFunction(reduce_function(info.dtype, info.reduce_op, "allreduce"));
  opts.setTag(tag(info));
  opts.setTimeout(options_.timeout);
  gloo::allreduce(opts);
  if (info.reduce_op == ReduceOp::Avg) {
    divide_in_place(data, static_cast<size_t>(info.numel), info.dtype, size_);
  }
  if (!direct) {
    size_t offset = 0;
    for (Tensor& t : tensors) {
      unpack(data + offset, t);
      offset += t.nbytes();
    }
  }
}

void ProcessGroupGloo::run_broadcast(PendingOp& op) {
  const CollectiveInfo& info = op.work->info();
  std::vector<Tensor>& tensors = op.tensors;
  if (info.numel == 0 || size_ == 1) return;
  // Bytes, not elements: tensors of different dtypes may travel together (e.g. parameters and
  // integer buffers).
  const size_t bytes = total_bytes(tensors);
  const bool direct = single_contiguous(tensors);
  uint8_t* data = direct ? static_cast<uint8_t*>(tensors[0].raw_data()) : staging(bytes);
  if (!direct && rank_ == info.root) {
    size_t offset = 0;
    for (const Tensor& t : tensors) {
      pack(t, data + offset);
      offset += t.nbytes();
    }
  }
  gloo::BroadcastOptions opts(context_);
  opts.setOutput<uint8_t>(data, bytes);
  opts.setRoot(info.root);
  opts.setTag(tag(info));
  opts.setTimeout(options_.timeout);
  gloo::broadcast(opts);
  if (!direct && rank_ != info.root) {
    size_t offset = 0;
    for (Tensor& t : tensors) {
      unpack(data + offset, t);
      offset += t.nbytes();
    }
  }
}

void ProcessGroupGloo::run_allgather(PendingOp& op) {
  std::vector<Tensor>& outputs = op.tensors;
  const Tensor& input = op.single;
  const size_t bytes = input.nbytes();
  if (size_ == 1) {
    outputs[0].copy_(input);
    return;
  }
  if (bytes == 0) return;
  // Outputs that are consecutive slices of one buffer (e.g. views of a flat tensor) are
  // gathered into directly.
  bool direct = true;
  auto* first = static_cast<uint8_t*>(outputs[0].raw_data());
  for (int r = 0; r < size_ && direct; ++r) {
    direct = outputs[r].is_contiguous() && outputs[r].raw_data() == first + r * bytes;
  }
  uint8_t* out = direct ? first : staging(bytes * (size_ + 1));
  uint8_t* in = nullptr;
  if (input.is_contiguous()) {
    in = static_cast<uint8_t*>(input.raw_data());
  } else {
    in = direct ? staging(bytes) : out + bytes * size_;
    pack(input, in);
  }
  gloo::AllgatherOptions opts(context_);
  // Gloo copies the input into the output's slot unless it already is that slot.
  if (in != out + bytes * rank_) opts.setInput<uint8_t>(in, bytes);
  opts.setOutput<uint8_t>(out, bytes * size_);
  opts.setTag(tag(op.work->info()));
  opts.setTimeout(options_.timeout);
  gloo::allgather(opts);
  if (!direct) {
    for (int r = 0; r < size_; ++r) unpack(out + r * bytes, outputs[r]);
  }
}

void ProcessGroupGloo::run_reduce_scatter(PendingOp& op) {
  const CollectiveInfo& info = op.work->info();
  std::vector<Tensor>& inputs = op.tensors;
  Tensor& output = op.single;
  if (size_ == 1) {
    output.copy_(inputs[0].reshape(output.shape()));
    return;
  }
  if (info.numel == 0) return;
  // The ring reduces in place, so the inputs (which the caller keeps) are packed into the
  // staging buffer first; this rank's chunk is then copied out.
  std::vector<size_t> chunk_bytes(static_cast<size_t>(size_));
  size_t total = 0;
  for (int r = 0; r < size_; ++r) {
    chunk_bytes[r] = inputs[r].nbytes();
    total += chunk_bytes[r];
  }
  uint8_t* data = staging(total);
  size_t offset = 0, mine = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) mine = offset;
    pack(inputs[r], data + offset);
    offset += chunk_bytes[r];
  }
  ring_reduce_scatter(context_, data, chunk_bytes, dtype_size(info.dtype),
                      reduce_function(info.dtype, info.reduce_op, "reduce_scatter"), tag(info),
                      options_.timeout, scratch_);
  const size_t count = static_cast<size_t>(output.numel());
  if (info.reduce_op == ReduceOp::Avg) divide_in_place(data + mine, count, info.dtype, size_);
  unpack(data + mine, output);
}

void ProcessGroupGloo::run_barrier(PendingOp& op) {
  if (size_ == 1) return;
  gloo::BarrierOptions opts(context_);
  opts.setTag(tag(op.work->info()));
  opts.setTimeout(options_.timeout);
  gloo::barrier(opts);
}

}  // namespace dpar::dist::detail
