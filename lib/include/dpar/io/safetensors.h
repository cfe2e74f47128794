#pragma once
// The .safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of
// JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the raw little-endian tensor bytes; offsets are
// relative to the end of the header. Readable by PyTorch tooling, so weights move both ways.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dpar/core/progress.h"
#include "dpar/tensor/tensor.h"

namespace dpar::io {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

struct SafetensorsContents {
  NamedTensors tensors;  // in header order (the order they were saved in)
  Metadata metadata;
};

// Writes F32/F16/BF16/I64/U8 tensors of any layout or device as contiguous little-endian
// copies, in the given order. The file is written to "<path>.tmp", synced and renamed over
// path, so a crash never leaves a half-written file under the final name. Names must be
// unique, non-empty and not "__metadata__". progress, when given, hears (bytes written, bytes
// in all) after each tensor.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const Metadata& metadata = {}, const ProgressCallback& progress = {});

// Reads and validates a file: any malformed input (truncation, a header length beyond the
// file, invalid JSON, an unknown dtype, offsets out of range, overlapping or leaving gaps, a
// byte span that does not match shape x dtype size) throws a dpar::Error naming the file and
// the problem. Tensors come back contiguous on the CPU.
SafetensorsContents load_safetensors(const std::string& path);

// The header alone, validated as load_safetensors validates the file (offsets inside it, no
// overlaps or gaps), for readers that need a few tensors of a large file: sharded optimizer
// checkpoints read only the byte ranges of their own slices.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t offset = 0;  // of its first byte, from the start of the file
  uint64_t nbytes = 0;
};
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in header order
  Metadata metadata;
};
SafetensorsHeader read_safetensors_header(const std::string& path);
// One tensor, read from its byte range only (a contiguous CPU tensor).
Tensor read_safetensors_entry(const std::string& path, const SafetensorsEntry& entry);

}  // namespace dpar::io
