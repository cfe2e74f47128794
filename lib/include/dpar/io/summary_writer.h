#pragma once
// TensorBoard event files: what torch.utils.tensorboard's SummaryWriter and Paddle's VisualDL
// users expect to point `tensorboard --logdir` at.
//
//   io::SummaryWriter tb("output/tb");           // events.out.tfevents.<time>.<host>.<pid>.<n>
//   tb.add_scalar("train/loss", 0.42, step);
//   tb.flush();                                   // after each log line: a crash loses at most
//                                                 // what came after the last flush
//
// A file is TFRecord framing (length, masked CRC-32C of the length, a serialized
// tensorboard.Event, masked CRC-32C of it) around the messages of lib/proto/
// tensorboard_event.proto. Every writer opens a new file and only appends to it, so a resumed
// run adds a file beside the old ones and never rewrites what a reader may be reading.
//
// read_event_file() reads such a file back (tests, tools): every CRC is checked; a torn or
// corrupt record at the end (a run killed mid-write) is skipped and reported in
// EventFile::problem, while damage followed by more data is an error naming file and offset.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace dpar::io {

struct ScalarEvent {
  double wall_time = 0;  // seconds since the Unix epoch
  int64_t step = 0;
  std::string tag;
  float value = 0;
};

class SummaryWriter {
 public:
  // Creates `dir` if needed and opens a new event file in it; throws dpar::Error naming the
  // path when it cannot. `file_suffix` is appended to the file name (tensorboardX's
  // filename_suffix), e.g. to tell ranks apart.
  explicit SummaryWriter(const std::string& dir, const std::string& file_suffix = "");
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  // wall_time < 0: now.
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time = -1);
  // Several scalars of one step in one record (what a log line produces).
  void add_scalars(const std::vector<std::pair<std::string, double>>& values, int64_t step,
                   double wall_time = -1);
  // Hands the buffered records to the OS (fflush), so they survive the process dying.
  void flush();
  // flush() and fsync(); further calls are errors. The destructor closes quietly.
  void close();

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::FILE* file_ = nullptr;
};

struct EventFile {
  std::string file_version;          // "brain.Event:2" for files TensorBoard writes
  std::vector<ScalarEvent> scalars;  // in file order
  int64_t records = 0;               // valid records read, file_version included
  std::string problem;               // empty, or what was skipped at the end and where
};

EventFile read_event_file(const std::string& path);

// The TFRecord checksum: CRC-32C (Castagnoli, ISA-L's crc32_iscsi), rotated and offset so that
// a CRC over data containing CRCs stays well distributed.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace dpar::io
