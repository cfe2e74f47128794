#include "dpar/io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "dpar/autograd/grad_mode.h"

namespace dpar::io {

// The format is little-endian; dpar writes and reads tensor memory as is.
static_assert(std::endian::native == std::endian::little, "safetensors io assumes little-endian");

namespace {

using Json = nlohmann::ordered_json;

// Same cap as the reference implementation: a header beyond this is corruption, not weights.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr const char* kMetadataKey = "__metadata__";

const char* dtype_tag(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f16:
      return "F16";
    case DType::bf16:
      return "BF16";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
  }
  return "?";
}

bool parse_dtype_tag(const std::string& tag, DType& out) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i64, DType::u8}) {
    if (tag == dtype_tag(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

// ---- writing -----------------------------------------------------------------------------
// A POSIX file so the data can be fsync'ed before the rename makes it visible.
class OutFile {
 public:
  explicit OutFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    DPAR_CHECK(fd_ >= 0, "save_safetensors: cannot create ", path, ": ", std::strerror(errno));
  }
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      DPAR_CHECK(w > 0, "save_safetensors: writing ", path_, " failed: ", std::strerror(errno));
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  void sync_and_close() {
    DPAR_CHECK(::fsync(fd_) == 0, "save_safetensors: fsync of ", path_,
               " failed: ", std::strerror(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    DPAR_CHECK(rc == 0, "save_safetensors: closing ", path_, " failed: ", std::strerror(errno));
  }

 private:
  std::string path_;
  int fd_ = -1;
};

void write_file(const std::string& tmp, const std::string& header, const std::vector<Tensor>& blobs,
                const ProgressCallback& progress) {
  OutFile out(tmp);
  uint64_t n = header.size();
  int64_t total = static_cast<int64_t>(sizeof(n) + header.size());
  for (const Tensor& t : blobs) total += static_cast<int64_t>(t.nbytes());
  out.write(&n, sizeof(n));
  out.write(header.data(), header.size());
  int64_t written = static_cast<int64_t>(sizeof(n) + header.size());
  if (progress) progress(written, total);
  for (const Tensor& t : blobs) {
    if (t.numel() > 0) out.write(t.raw_data(), t.nbytes());
    written += static_cast<int64_t>(t.nbytes());
    if (progress) progress(written, total);
  }
  out.sync_and_close();
}

// ---- reading -----------------------------------------------------------------------------
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  DPAR_FAIL("load_safetensors: ", path, ": ", problem);
}

uint64_t as_u64(const Json& v, const std::string& path, const std::string& what) {
  // The parser stores non-negative integers as unsigned; negatives and floats are rejected.
  if (!v.is_number_unsigned())
    fail(path, what + " must be a non-negative integer, got " + v.dump());
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& path, const std::string& name, const Json& info) {
  const std::string where = "tensor '" + name + "'";
  if (!info.is_object()) fail(path, where + ": expected an object, got " + info.dump());
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!info.contains(key)) fail(path, where + ": missing \"" + key + "\"");
  }
  Entry e;
  e.name = name;
  const Json& dtype = info["dtype"];
  if (!dtype.is_string()) fail(path, where + ": dtype must be a string, got " + dtype.dump());
  if (!parse_dtype_tag(dtype.get<std::string>(), e.dtype)) {
    fail(path,
         where + ": unsupported dtype " + dtype.dump() + " (dpar reads F32, F16, BF16, I64, U8)");
  }
  const Json& shape = info["shape"];
  if (!shape.is_array()) fail(path, where + ": shape must be an array, got " + shape.dump());
  uint64_t numel = 1;
  for (const Json& d : shape) {
    const uint64_t size = as_u64(d, path, where + ": shape entry");
    if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, size, &numel)) {
      fail(path, where + ": shape " + shape.dump() + " is too large");
    }
    e.shape.push_back(static_cast<int64_t>(size));
  }
  const Json& offsets = info["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(path, where + ": data_offsets must be [begin, end], got " + offsets.dump());
  }
  e.begin = as_u64(offsets[0], path, where + ": data offset");
  e.end = as_u64(offsets[1], path, where + ": data offset");
  if (e.end < e.begin) fail(path, where + ": data_offsets " + offsets.dump() + " end before begin");
  uint64_t expected = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.dtype)), &expected) ||
      expected != e.end - e.begin) {
    fail(path, where + ": shape " + shape.dump() + " of " + dtype.get<std::string>() + " needs " +
                   std::to_string(numel) + " x " + std::to_string(dtype_size(e.dtype)) +
                   " bytes, but data_offsets " + offsets.dump() + " span " +
                   std::to_string(e.end - e.begin));
  }
  return e;
}

// Offsets must tile [0, data_bytes) exactly: no byte read twice, none left unexplained.
void check_layout(const std::string& path, std::vector<const Entry*> order, uint64_t data_bytes) {
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : order) {
    if (e->end > data_bytes) {
      fail(path, "tensor '" + e->name + "': data_offsets [" + std::to_string(e->begin) + ", " +
                     std::to_string(e->end) + ") run past the " + std::to_string(data_bytes) +
                     " data bytes in the file (truncated?)");
    }
    if (e->begin < covered) {
      fail(path, "tensor '" + e->name + "' [" + std::to_string(e->begin) + ", " +
                     std::to_string(e->end) + ") overlaps tensor '" + previous->name + "' [" +
                     std::to_string(previous->begin) + ", " + std::to_string(previous->end) + ")");
    }
    if (e->begin > covered) {
      fail(path, "data bytes [" + std::to_string(covered) + ", " + std::to_string(e->begin) +
                     ") belong to no tensor");
    }
    covered = e->end;
    previous = e;
  }
  if (covered != data_bytes) {
    fail(path, "data bytes [" + std::to_string(covered) + ", " + std::to_string(data_bytes) +
                   ") belong to no tensor");
  }
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const Metadata& metadata, const ProgressCallback& progress) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  std::vector<Tensor> blobs;
  blobs.reserve(tensors.size());
  std::unordered_set<std::string> seen;
  uint64_t offset = 0;
  NoGradGuard no_grad;
  for (const auto& [name, t] : tensors) {
    DPAR_CHECK(!name.empty() && name != kMetadataKey, "save_safetensors: ", path,
               ": invalid tensor name '", name, "'");
    DPAR_CHECK(seen.insert(name).second, "save_safetensors: ", path, ": tensor '", name,
               "' appears twice");
    DPAR_CHECK(t.defined(), "save_safetensors: ", path, ": tensor '", name, "' is undefined");
    Tensor host = t.detach().to(Device::cpu()).contiguous();
    const uint64_t n = host.nbytes();
    header[name] = {{"dtype", dtype_tag(host.dtype())},
                    {"shape", host.shape()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
    blobs.push_back(std::move(host));
  }
  std::string text = header.dump();
  // Pad with spaces (still valid JSON) so the data starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  try {
    write_file(tmp, text, blobs, progress);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    DPAR_FAIL("save_safetensors: cannot rename ", tmp, " to ", path, ": ", std::strerror(err));
  }
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) fail(path, std::string("cannot open: ") + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const auto end_pos = in.tellg();
  if (end_pos < 0) fail(path, "cannot determine the file size");
  const uint64_t file_size = static_cast<uint64_t>(end_pos);
  in.seekg(0, std::ios::beg);
  if (file_size < 8) {
    fail(path, "truncated: " + std::to_string(file_size) +
                   " bytes, too short for the 8-byte header length");
  }
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), sizeof(header_len));
  if (header_len > file_size - 8) {
    fail(path, "header length " + std::to_string(header_len) + " exceeds the " +
                   std::to_string(file_size - 8) + " bytes after the length field (truncated?)");
  }
  if (header_len > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(header_len) + " exceeds the 100 MiB limit");
  }
  std::string text(header_len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_len));
  if (!in) fail(path, "could not read the header");

  // Duplicate top-level keys would silently shadow each other; the parser callback sees them.
  std::unordered_set<std::string> keys;
  std::string duplicate;
  auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key) {
      const auto key = parsed.get<std::string>();
      if (!keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text, on_event);
  } catch (const Json::exception& e) {
    fail(path, std::string("invalid JSON header: ") + e.what());
  }
  if (!header.is_object()) fail(path, "header is not a JSON object: " + header.dump());
  if (!duplicate.empty()) fail(path, "tensor '" + duplicate + "' appears twice in the header");

  SafetensorsHeader result;
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == kMetadataKey) {
      if (!info.is_object()) fail(path, "__metadata__ must be an object, got " + info.dump());
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string()) {
          fail(path, "__metadata__ value of '" + k + "' must be a string, got " + v.dump());
        }
        result.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, info));
  }
  const uint64_t data_start = 8 + header_len;
  std::vector<const Entry*> order;
  for (const Entry& e : entries) order.push_back(&e);
  check_layout(path, order, file_size - data_start);
  for (const Entry& e : entries) {
    result.entries.push_back({e.name, e.dtype, e.shape, data_start + e.begin, e.end - e.begin});
  }
  return result;
}

Tensor read_safetensors_entry(const std::string& path, const SafetensorsEntry& entry) {
  Tensor t = Tensor::empty(entry.shape, entry.dtype);
  DPAR_CHECK(t.nbytes() == entry.nbytes, "read_safetensors_entry: ", path, ": tensor '", entry.name,
             "' has ", entry.nbytes, " bytes for shape ", entry.shape);
  if (t.nbytes() == 0) return t;
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) fail(path, std::string("cannot open: ") + std::strerror(errno));
  in.seekg(static_cast<std::streamoff>(entry.offset), std::ios::beg);
  in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
  if (!in) fail(path, "could not read the data of tensor '" + entry.name + "' (truncated?)");
  return t;
}

SafetensorsContents load_safetensors(const std::string& path) {
  SafetensorsHeader header = read_safetensors_header(path);
  SafetensorsContents result;
  result.metadata = std::move(header.metadata);
  for (const SafetensorsEntry& e : header.entries) {
    result.tensors.emplace_back(e.name, read_safetensors_entry(path, e));
  }
  return result;
}

}  // namespace dpar::io
