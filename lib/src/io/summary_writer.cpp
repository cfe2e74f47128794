// TensorBoard event files (see dpar/io/summary_writer.h for the format and guarantees).
#include "dpar/io/summary_writer.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/crc32c.h"
#include "dpar/core/error.h"
#include "dpar/core/sysinfo.h"
#include "tensorboard_event.pb.h"

namespace dpar::io {
namespace {

constexpr const char* kFileVersion = "brain.Event:2";
// Record header: uint64 length, uint32 masked CRC of those 8 bytes; trailer: uint32 masked CRC.
constexpr size_t kHeaderBytes = 12;
constexpr size_t kFooterBytes = 4;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

// Several writers in one process (or one second) must not pick the same name.
std::string new_event_file_name(const std::string& suffix) {
  static std::atomic<int> counter{0};
  const auto seconds = static_cast<long long>(now_seconds());
  return "events.out.tfevents." + std::to_string(seconds) + "." + sysinfo::hostname() + "." +
         std::to_string(::getpid()) + "." + std::to_string(counter++) + suffix;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) { return detail::crc32c(data, size); }

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

SummaryWriter::SummaryWriter(const std::string& dir, const std::string& file_suffix) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DPAR_CHECK(!ec, "SummaryWriter: cannot create the event directory ", dir, ": ", ec.message());
  path_ = (std::filesystem::path(dir) / new_event_file_name(file_suffix)).string();
  // "x": never open an existing file, so nothing a reader holds is ever rewritten.
  file_ = std::fopen(path_.c_str(), "wbx");
  DPAR_CHECK(file_ != nullptr, "SummaryWriter: cannot create ", path_, ": ", std::strerror(errno));
  tensorboard::Event first;
  first.set_wall_time(now_seconds());
  first.set_file_version(kFileVersion);
  write_record(first.SerializeAsString());
  flush();
}

SummaryWriter::~SummaryWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t step,
                               double wall_time) {
  add_scalars({{tag, value}}, step, wall_time);
}

void SummaryWriter::add_scalars(const std::vector<std::pair<std::string, double>>& values,
                                int64_t step, double wall_time) {
  tensorboard::Event event;
  event.set_wall_time(wall_time < 0 ? now_seconds() : wall_time);
  event.set_step(step);
  for (const auto& [tag, value] : values) {
    tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  write_record(event.SerializeAsString());
}

void SummaryWriter::write_record(const std::string& data) {
  DPAR_CHECK(file_ != nullptr, "SummaryWriter: ", path_, " is closed");
  std::string record;
  record.reserve(kHeaderBytes + data.size() + kFooterBytes);
  put_le(record, data.size(), 8);
  put_le(record, masked_crc32c(record.data(), 8), 4);
  record += data;
  put_le(record, masked_crc32c(data.data(), data.size()), 4);
  DPAR_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size(),
             "SummaryWriter: writing ", path_, " failed: ", std::strerror(errno));
}

void SummaryWriter::flush() {
  DPAR_CHECK(file_ != nullptr, "SummaryWriter: ", path_, " is closed");
  DPAR_CHECK(std::fflush(file_) == 0, "SummaryWriter: flushing ", path_,
             " failed: ", std::strerror(errno));
}

void SummaryWriter::close() {
  flush();
  const int sync_rc = ::fsync(::fileno(file_));
  const int sync_errno = errno;
  const int close_rc = std::fclose(file_);
  file_ = nullptr;
  DPAR_CHECK(sync_rc == 0 && close_rc == 0, "SummaryWriter: closing ", path_,
             " failed: ", std::strerror(sync_rc != 0 ? sync_errno : errno));
}

EventFile read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DPAR_CHECK(in.good(), "read_event_file: cannot open ", path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* base = reinterpret_cast<const unsigned char*>(bytes.data());
  EventFile out;
  size_t offset = 0;
  // What is wrong with the record at `offset`, or "" when it is whole and its CRCs match.
  auto damage = [&](size_t& record_end) -> std::string {
    if (bytes.size() - offset < kHeaderBytes) return "a torn record header";
    const uint64_t length = get_le(base + offset, 8);
    // Fewer bytes than a footer after the header must not wrap the subtraction (fuzz_event_file
    // found the read past the end); a protobuf message is at most 2 GiB.
    const size_t after_header = bytes.size() - offset - kHeaderBytes;
    const bool length_fits = after_header >= kFooterBytes &&
                             length <= after_header - kFooterBytes &&
                             length <= static_cast<uint64_t>(INT32_MAX);
    if (get_le(base + offset + 8, 4) != masked_crc32c(base + offset, 8)) {
      // Unknown length: only when the claimed one ends the file is it the last record.
      if (!length_fits || offset + kHeaderBytes + length + kFooterBytes != bytes.size()) {
        record_end = offset;  // reported as damage followed by more bytes
      }
      return "a record length with a bad CRC";
    }
    if (!length_fits) return "a torn record";
    record_end = offset + kHeaderBytes + length + kFooterBytes;
    if (get_le(base + offset + kHeaderBytes + length, 4) !=
        masked_crc32c(base + offset + kHeaderBytes, length)) {
      return "a record with a bad data CRC";
    }
    return "";
  };
  while (offset < bytes.size()) {
    size_t record_end = bytes.size();
    const std::string problem = damage(record_end);
    if (!problem.empty()) {
      // A killed writer leaves at most its last record unfinished; anything after a damaged
      // record means the file itself was corrupted.
      DPAR_CHECK(record_end == bytes.size(), "read_event_file: ", path, ": ", problem, " at byte ",
                 offset, " with more data after it: the file is corrupt");
      out.problem = problem + " at byte " + std::to_string(offset) + " (end of file) skipped";
      break;
    }
    const uint64_t length = get_le(base + offset, 8);
    tensorboard::Event event;
    DPAR_CHECK(event.ParseFromArray(base + offset + kHeaderBytes, static_cast<int>(length)),
               "read_event_file: ", path, ": the record at byte ", offset,
               " is not a tensorboard.Event");
    if (event.has_file_version()) out.file_version = event.file_version();
    for (const tensorboard::Summary::Value& v : event.summary().value()) {
      out.scalars.push_back({event.wall_time(), event.step(), v.tag(), v.simple_value()});
    }
    ++out.records;
    offset = record_end;
  }
  return out;
}

}  // namespace dpar::io
