// The bodies of ProcessGroupGloo's collectives, run on the group's communication thread.
// A single contiguous tensor is reduced or gathered in place (no copy, no allocation); several
// tensors, or non-contiguous ones, are packed into one reused staging buffer, so several
// tensors travel as one fused message, and unpacked afterwards.
//
// Every byte that crosses a Gloo connection is checked with CRC-32C: allreduce, allgather and
// reduce_scatter run dpar's checked rings (checked_ring.h); broadcast through Gloo's tree sends
// the root's CRC behind the payload and every receiver checks it, and along the mixed ring's
// chain (hybrid_ring.h) every TCP hop is checked. A mismatch fails the collective (and the
// group) with CorruptedTransfer instead of handing the ranks a silently wrong result.
#include <gloo/barrier.h>
#include <gloo/broadcast.h>

#include <cstring>

#include "core/crc32c.h"
#include "distributed/gloo/checked_ring.h"
#include "distributed/gloo/hybrid_ring.h"
#include "distributed/gloo/process_group_gloo.h"
#include "distributed/gloo/reduce_functions.h"

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

// Several tensors one after another in `dst`, and back.
void pack_all(const std::vector<Tensor>& tensors, uint8_t* dst) {
  for (const Tensor& t : tensors) {
    pack(t, dst);
    dst += t.nbytes();
  }
}

void unpack_all(const uint8_t* src, std::vector<Tensor>& tensors) {
  for (Tensor& t : tensors) {
    unpack(src, t);
    src += t.nbytes();
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

bool overlap(const uint8_t* a, size_t a_bytes, const uint8_t* b, size_t b_bytes) {
  return a_bytes > 0 && b_bytes > 0 && a < b + b_bytes && b < a + a_bytes;
}

// The chunk sizes allreduce_chunk_bounds gives (the same split a sharded reduce-scatter uses).
std::vector<size_t> allreduce_chunks(size_t count, int size, size_t element_size) {
  const std::vector<int64_t> bounds =
      allreduce_chunk_bounds(static_cast<int64_t>(count), size, element_size);
  std::vector<size_t> bytes(static_cast<size_t>(size));
  for (size_t r = 0; r < bytes.size(); ++r) {
    bytes[r] = static_cast<size_t>(bounds[r + 1] - bounds[r]) * element_size;
  }
  return bytes;
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
    pack_all(tensors, data);
  }
  // An average is divided on each chunk by its owner, before the others copy it.
  ChunkFn finish;
  if (info.reduce_op == ReduceOp::Avg) {
    finish = [&](uint8_t* chunk, size_t count) {
      divide_in_place(chunk, count, info.dtype, size_);
    };
  }
  const ReduceFn reduce = reduce_function(info.dtype, info.reduce_op, "allreduce");
  if (shm_) {
    // Every rank on this host: through the shared segment, in the ring's order (same bits).
    shm_->allreduce(data, allreduce_chunk_bounds(info.numel, size_, element_size), info.dtype,
                    info.reduce_op, reduce, finish, options_.timeout,
                    [this] { return abort_reason(); });
  } else {
    // Reduce-scatter, then allgather, both checked hop by hop; the hops inside a host through
    // shared memory where there are such hops (same order, same bits).
    RingBuffer ring{data, allreduce_chunks(static_cast<size_t>(info.numel), size_, element_size),
                    element_size};
    if (links_.in_use()) {
      hybrid_ring_allreduce(
          context_, links_, ring, reduce, finish, tag(info), options_.timeout,
          [this] { return abort_reason(); }, hybrid_scratch_);
    } else {
      ring_allreduce(context_, ring, reduce, finish, tag(info), options_.timeout, ring_scratch_);
    }
  }
  if (!direct) {
    unpack_all(data, tensors);
  }
}

void ProcessGroupGloo::run_broadcast(PendingOp& op) {
  const CollectiveInfo& info = op.work->info();
  std::vector<Tensor>& tensors = op.tensors;
  if (info.numel == 0 || size_ == 1) return;
  const size_t bytes = total_bytes(tensors);
  const bool chain = chain_broadcast_pays(size_, links_.shm_hops, bytes);
  if (shm_ || chain) {
    // Every rank on this host: the root's bytes through the shared segment. Several hosts: along
    // the mixed ring's chain, each TCP hop checked. Straight from and into a single contiguous
    // tensor.
    const bool direct = single_contiguous(tensors);
    uint8_t* data = direct ? static_cast<uint8_t*>(tensors[0].raw_data()) : staging(bytes);
    if (!direct && rank_ == info.root) {
      pack_all(tensors, data);
    }
    if (shm_) {
      shm_->broadcast(data, bytes, info.root, options_.timeout, [this] { return abort_reason(); });
    } else {
      hybrid_chain_broadcast(
          context_, links_, data, bytes, info.root, tag(info), options_.timeout,
          [this] { return abort_reason(); }, hybrid_scratch_);
    }
    if (!direct && rank_ != info.root) {
      unpack_all(data, tensors);
    }
    return;
  }
  // Bytes, not elements: tensors of different dtypes may travel together (e.g. parameters and
  // integer buffers). The root's CRC-32C travels behind the payload in the same message, so
  // even a single tensor goes through the staging buffer: Gloo's broadcast tree is kept (log2 n
  // rounds, where a chain of TCP hops would take n-1; a mixed ring's chain is taken above where
  // chain_broadcast_pays says it is shorter) and the check is end to end.
  uint8_t* data = staging(bytes + sizeof(uint32_t));
  if (rank_ == info.root) {
    pack_all(tensors, data);
    const uint32_t crc = dpar::detail::crc32c(data, bytes);
    std::memcpy(data + bytes, &crc, sizeof crc);
  }
  gloo::BroadcastOptions opts(context_);
  opts.setOutput<uint8_t>(data, bytes + sizeof(uint32_t));
  opts.setRoot(info.root);
  opts.setTag(tag(info));
  opts.setTimeout(options_.timeout);
  gloo::broadcast(opts);
  if (rank_ == info.root) return;
  uint32_t sent = 0;
  std::memcpy(&sent, data + bytes, sizeof sent);
  const uint32_t got = dpar::detail::crc32c(data, bytes);
  if (got != sent) {
    throw CorruptedTransfer(::dpar::detail::str_cat(
        "the ", bytes, " bytes rank ", rank_, " received from root ", info.root,
        " failed their CRC-32C check (", dpar::detail::crc_pair(got, sent),
        "): they were corrupted in transit; the tensors were left unchanged"));
  }
  unpack_all(data, tensors);
}

void ProcessGroupGloo::run_allgather(PendingOp& op) {
  std::vector<Tensor>& outputs = op.tensors;
  const Tensor& input = op.single;
  if (size_ == 1) {
    outputs[0].copy_(input);
    return;
  }
  // Chunk r is outputs[r]'s bytes: uneven splits travel as they are.
  RingBuffer ring{nullptr, std::vector<size_t>(static_cast<size_t>(size_)),
                  dtype_size(input.dtype())};
  size_t total = 0;
  for (int r = 0; r < size_; ++r) {
    ring.chunk_bytes[r] = outputs[r].nbytes();
    total += ring.chunk_bytes[r];
  }
  if (total == 0) return;
  if (shm_) return shm_allgather(input, outputs, ring.chunk_bytes);
  // Outputs that are consecutive slices of one buffer (e.g. views of a flat tensor) are
  // gathered into directly.
  bool direct = true;
  auto* first = static_cast<uint8_t*>(outputs[0].raw_data());
  size_t offset = 0, mine = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) mine = offset;
    direct = direct && outputs[r].is_contiguous() &&
             static_cast<uint8_t*>(outputs[r].raw_data()) == first + offset;
    offset += ring.chunk_bytes[r];
  }
  ring.data = direct ? first : staging(total);
  if (input.is_contiguous()) {
    if (input.raw_data() != ring.data + mine) {
      std::memmove(ring.data + mine, input.raw_data(), input.nbytes());
    }
  } else {
    pack(input, ring.data + mine);
  }
  if (links_.in_use()) {
    hybrid_ring_allgather(
        context_, links_, ring, tag(op.work->info()), options_.timeout,
        [this] { return abort_reason(); }, hybrid_scratch_);
  } else {
    ring_allgather(context_, ring, tag(op.work->info()), options_.timeout, ring_scratch_);
  }
  if (!direct) {
    offset = 0;
    for (int r = 0; r < size_; ++r) {
      unpack(ring.data + offset, outputs[r]);
      offset += ring.chunk_bytes[r];
    }
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
  if (shm_) return shm_reduce_scatter(info, inputs, output);
  // The ring reduces in place, so the inputs (which the caller keeps) are packed into the
  // staging buffer first; this rank's chunk is then copied out.
  RingBuffer ring{nullptr, std::vector<size_t>(static_cast<size_t>(size_)), dtype_size(info.dtype)};
  size_t total = 0;
  for (int r = 0; r < size_; ++r) {
    ring.chunk_bytes[r] = inputs[r].nbytes();
    total += ring.chunk_bytes[r];
  }
  ring.data = staging(total);
  size_t offset = 0, mine = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) mine = offset;
    pack(inputs[r], ring.data + offset);
    offset += ring.chunk_bytes[r];
  }
  const ReduceFn reduce = reduce_function(info.dtype, info.reduce_op, "reduce_scatter");
  if (links_.in_use()) {
    hybrid_ring_reduce_scatter(
        context_, links_, ring, reduce, tag(info), options_.timeout,
        [this] { return abort_reason(); }, hybrid_scratch_);
  } else {
    ring_reduce_scatter(context_, ring, reduce, tag(info), options_.timeout, ring_scratch_);
  }
  const size_t count = static_cast<size_t>(output.numel());
  if (info.reduce_op == ReduceOp::Avg) divide_in_place(ring.data + mine, count, info.dtype, size_);
  unpack(ring.data + mine, output);
}

// Every rank on this host. Contiguous inputs are read in place and a contiguous output written
// in place (the fold reads the slots, so the output may be this rank's own input chunk); others
// go through the staging buffer.
void ProcessGroupGloo::shm_reduce_scatter(const CollectiveInfo& info,
                                          const std::vector<Tensor>& inputs, Tensor& output) {
  const size_t n = static_cast<size_t>(size_);
  std::vector<const uint8_t*> chunks(n);
  std::vector<size_t> chunk_bytes(n);
  size_t staged = 0;
  for (size_t r = 0; r < n; ++r) {
    chunk_bytes[r] = inputs[r].nbytes();
    if (!inputs[r].is_contiguous()) staged += chunk_bytes[r];
  }
  auto* out = static_cast<uint8_t*>(output.raw_data());
  bool out_direct = output.is_contiguous();
  for (size_t r = 0; r < n && out_direct; ++r) {
    const auto* in = static_cast<const uint8_t*>(inputs[r].raw_data());
    const bool own = r == static_cast<size_t>(rank_) && in == out;
    out_direct = own || !overlap(in, chunk_bytes[r], out, output.nbytes());
  }
  uint8_t* stage = staging(staged + (out_direct ? 0 : output.nbytes()));
  size_t offset = 0;
  for (size_t r = 0; r < n; ++r) {
    if (inputs[r].is_contiguous()) {
      chunks[r] = static_cast<const uint8_t*>(inputs[r].raw_data());
    } else {
      pack(inputs[r], stage + offset);
      chunks[r] = stage + offset;
      offset += chunk_bytes[r];
    }
  }
  uint8_t* result = out_direct ? out : stage + offset;
  ChunkFn finish;
  if (info.reduce_op == ReduceOp::Avg) {
    finish = [&](uint8_t* chunk, size_t count) {
      divide_in_place(chunk, count, info.dtype, size_);
    };
  }
  shm_->reduce_scatter(chunks, chunk_bytes, result, info.dtype, info.reduce_op,
                       reduce_function(info.dtype, info.reduce_op, "reduce_scatter"), finish,
                       options_.timeout, [this] { return abort_reason(); });
  if (!out_direct) unpack(result, output);
}

// Every rank on this host: straight from a contiguous input into contiguous outputs, through
// the staging buffer otherwise.
void ProcessGroupGloo::shm_allgather(const Tensor& input, std::vector<Tensor>& outputs,
                                     const std::vector<size_t>& chunk_bytes) {
  const size_t n = static_cast<size_t>(size_);
  std::vector<uint8_t*> to(n);
  size_t staged = 0;
  for (size_t r = 0; r < n; ++r) {
    if (!outputs[r].is_contiguous()) staged += chunk_bytes[r];
  }
  const size_t mine = static_cast<size_t>(rank_);
  const auto* in = static_cast<const uint8_t*>(input.raw_data());
  // The input is copied in piece by piece as outputs are written, so it must not lie in another
  // rank's output (its own output may be the input itself).
  bool in_direct = input.is_contiguous();
  for (size_t r = 0; r < n && in_direct; ++r) {
    const auto* out = static_cast<const uint8_t*>(outputs[r].raw_data());
    in_direct = (r == mine && out == in) || !overlap(in, input.nbytes(), out, chunk_bytes[r]);
  }
  uint8_t* stage = staging(staged + (in_direct ? 0 : input.nbytes()));
  size_t offset = 0;
  for (size_t r = 0; r < n; ++r) {
    if (outputs[r].is_contiguous()) {
      to[r] = static_cast<uint8_t*>(outputs[r].raw_data());
    } else {
      to[r] = stage + offset;
      offset += chunk_bytes[r];
    }
  }
  if (!in_direct) {
    pack(input, stage + offset);
    in = stage + offset;
  }
  shm_->allgather(in, to, chunk_bytes, input.dtype(), options_.timeout,
                  [this] { return abort_reason(); });
  for (size_t r = 0; r < n; ++r) {
    if (!outputs[r].is_contiguous()) unpack(to[r], outputs[r]);
  }
}

void ProcessGroupGloo::run_barrier(PendingOp& op) {
  if (size_ == 1) return;
  if (shm_) return shm_->barrier(options_.timeout, [this] { return abort_reason(); });
  gloo::BarrierOptions opts(context_);
  opts.setTag(tag(op.work->info()));
  opts.setTimeout(options_.timeout);
  gloo::barrier(opts);
}

}  // namespace dpar::dist::detail
