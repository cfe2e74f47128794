#pragma once
// Where one worker's output goes: its log file (log_dir/workerlog.<local rank>; in ps mode
// serverlog.<i> or workerlog.<i>, see log_file_name in cluster.h), optionally
// the launcher's console, and a short memory of its last lines for the failure report.
// The launcher reads each worker's stdout+stderr from a pipe and hands the bytes here.
#include <deque>
#include <string>
#include <vector>

namespace dpar::launch {

class LogSink {
 public:
  // `path` "" keeps no file; `append` continues a file from an earlier start (restarts).
  // When `echo`, complete lines are copied to the launcher's stdout behind `prefix`.
  // Throws dpar::Error when the file cannot be opened.
  LogSink(std::string path, bool append, bool echo, std::string prefix);
  ~LogSink();
  LogSink(const LogSink&) = delete;
  LogSink& operator=(const LogSink&) = delete;

  void write(const char* data, size_t size);
  // A note for the log file only (restart markers).
  void write_file_only(const std::string& text);
  // Ends a last line that had no newline (echo, tail) and closes the file.
  void finish();
  const std::string& path() const { return path_; }
  // The last `kTailLines` lines written (the unfinished one included).
  std::vector<std::string> tail() const;

  static constexpr size_t kTailLines = 20;

 private:
  void complete_line(const std::string& line);

  std::string path_;
  int fd_ = -1;
  bool echo_;
  std::string prefix_;
  std::string partial_;
  std::deque<std::string> tail_;
};

// Keeps an earlier run's logs from being overwritten: when any of `names` exists in `dir`,
// all of them that exist move to dir/previous.<K> (K = 1, 2, ...: the first unused number,
// so earlier runs stay ordered) and that folder is returned; otherwise "". Throws dpar::Error
// naming the file when a move fails.
std::string move_earlier_logs(const std::string& dir, const std::vector<std::string>& names);

// Writes all of `text` to fd, retrying short writes; errors (a closed console) are ignored
// because losing the echo must never stop the job.
void write_all(int fd, const std::string& text);

}  // namespace dpar::launch
