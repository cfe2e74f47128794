#include "log_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "dpar/core/error.h"

namespace dpar::launch {

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string move_earlier_logs(const std::string& dir, const std::vector<std::string>& names) {
  namespace fs = std::filesystem;
  std::vector<fs::path> earlier;
  for (const std::string& name : names) {
    std::error_code ec;
    if (fs::exists(fs::path(dir) / name, ec)) earlier.push_back(fs::path(dir) / name);
  }
  if (earlier.empty()) return "";
  fs::path target;
  for (int k = 1;; ++k) {
    target = fs::path(dir) / ("previous." + std::to_string(k));
    std::error_code ec;
    if (!fs::exists(target, ec)) break;
  }
  std::error_code ec;
  fs::create_directory(target, ec);
  DPAR_CHECK(!ec, "dpar-launch: cannot create ", target.string(),
             " for the earlier run's logs: ", ec.message());
  for (const fs::path& file : earlier) {
    fs::rename(file, target / file.filename(), ec);
    DPAR_CHECK(!ec, "dpar-launch: cannot move the earlier run's log ", file.string(), " to ",
               target.string(), ": ", ec.message());
  }
  return target.string();
}

LogSink::LogSink(std::string path, bool append, bool echo, std::string prefix)
    : path_(std::move(path)), echo_(echo), prefix_(std::move(prefix)) {
  if (path_.empty()) return;
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC);
  fd_ = ::open(path_.c_str(), flags, 0644);
  DPAR_CHECK(fd_ >= 0, "dpar-launch: cannot open log file ", path_, ": ", std::strerror(errno));
}

LogSink::~LogSink() {
  if (fd_ >= 0) ::close(fd_);
}

void LogSink::write(const char* data, size_t size) {
  if (fd_ >= 0) write_all(fd_, std::string(data, size));
  // A program printing progress without newlines must not grow memory without bound, so a
  // very long unfinished line is treated as a line of its own.
  constexpr size_t kMaxLine = 64 * 1024;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      complete_line(partial_);
      partial_.clear();
    } else {
      partial_ += data[i];
      if (partial_.size() >= kMaxLine) {
        complete_line(partial_);
        partial_.clear();
      }
    }
  }
}

void LogSink::write_file_only(const std::string& text) {
  if (fd_ >= 0) write_all(fd_, text);
}

void LogSink::complete_line(const std::string& line) {
  if (echo_) write_all(STDOUT_FILENO, prefix_ + line + "\n");
  tail_.push_back(line);
  if (tail_.size() > kTailLines) tail_.pop_front();
}

void LogSink::finish() {
  if (!partial_.empty()) {
    complete_line(partial_);
    partial_.clear();
  }
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

std::vector<std::string> LogSink::tail() const {
  std::vector<std::string> out(tail_.begin(), tail_.end());
  if (!partial_.empty()) {
    out.push_back(partial_);
    if (out.size() > kTailLines) out.erase(out.begin());
  }
  return out;
}

}  // namespace dpar::launch
