#pragma once
// Ring reduce-scatter with uneven chunks, built on Gloo's unbound buffers (Gloo has no
// reduce-scatter for unbound buffers, and its old-style ReduceScatterHalvingDoubling needs
// per-call setup and a fixed reduction type). Each rank sends (N-1)/N of the data once, half
// of what an allreduce of the concatenation would send.
#include <gloo/context.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "distributed/gloo/reduce_functions.h"
#include "dpar/distributed/store.h"

namespace dpar::dist::detail {

// buffer holds the concatenation of size() chunks (chunk_bytes[r] bytes for rank r, equal on
// every rank). On return chunk rank() holds the reduction over all ranks; the other chunks
// hold partial sums. scratch is reused between calls. Throws gloo::Exception on timeout or
// transport failure.
void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& context, uint8_t* buffer,
                         const std::vector<size_t>& chunk_bytes, size_t element_size,
                         ReduceFn reduce, uint32_t tag, Millis timeout,
                         std::vector<uint8_t>& scratch);

}  // namespace dpar::dist::detail
