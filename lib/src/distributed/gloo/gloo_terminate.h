#pragma once
// Gloo's event-loop thread throws (GLOO_ENFORCE) when a frame on a connection cannot be placed:
// a frame header corrupted in transit or forged names a slot nobody posted, or more bytes than
// the receive holds. Nothing catches it on that thread, so the process ends in std::terminate
// with only Gloo's source location. It cannot go on either: the thread dies holding the pair's
// lock. So dpar's terminate handler (installed with the first Gloo group, chaining to the one
// before it) writes one line per live Gloo group first, naming the rank and the collective it
// was running, and what Gloo reported, and writes the flight record (flight_recorder.h).
#include <functional>
#include <string>

namespace dpar::dist::detail {

// describe() is called from the terminate handler while the process dies; it must not block.
void note_gloo_group(const void* group, std::function<std::string()> describe);
void forget_gloo_group(const void* group);

}  // namespace dpar::dist::detail
