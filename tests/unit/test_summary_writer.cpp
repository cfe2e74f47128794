// TensorBoard event files: CRC-32C against the standard check value, a round trip of scalars
// through SummaryWriter and read_event_file, the append-only naming, and the reader's handling
// of a run killed mid-record (skipped) versus damage inside the file (an error with the offset).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "dpar/io/summary_writer.h"
#include "unit/helpers.h"

using namespace dpar;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A file with `steps` records of two scalars each, closed.
std::string write_run(const TempDir& dir, int steps) {
  io::SummaryWriter tb(dir.path.string());
  for (int s = 1; s <= steps; ++s) {
    tb.add_scalars({{"train/loss", 2.0 / s}, {"rank1/ips", 100.0 + s}}, s, 1.7e9 + s);
  }
  tb.close();
  return tb.path();
}

}  // namespace

TEST_CASE("crc32c matches the Castagnoli check value and TFRecord's mask", "[summary]") {
  const std::string check = "123456789";
  CHECK(io::crc32c(check.data(), check.size()) == 0xE3069283u);
  CHECK(io::crc32c(nullptr, 0) == 0u);
  const uint32_t crc = 0xE3069283u;
  CHECK(io::masked_crc32c(check.data(), check.size()) == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST_CASE("SummaryWriter scalars read back with tags, steps, values and wall times", "[summary]") {
  TempDir dir;
  const std::string path = write_run(dir, 5);
  CHECK(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
  const io::EventFile f = io::read_event_file(path);
  CHECK(f.file_version == "brain.Event:2");
  CHECK(f.problem.empty());
  CHECK(f.records == 6);  // the version record and one per step
  REQUIRE(f.scalars.size() == 10);
  for (int s = 1; s <= 5; ++s) {
    const io::ScalarEvent& loss = f.scalars[static_cast<size_t>(2 * (s - 1))];
    const io::ScalarEvent& ips = f.scalars[static_cast<size_t>(2 * (s - 1) + 1)];
    CHECK(loss.tag == "train/loss");
    CHECK(loss.step == s);
    CHECK(loss.value == static_cast<float>(2.0 / s));
    CHECK(loss.wall_time == 1.7e9 + s);
    CHECK(ips.tag == "rank1/ips");
    CHECK(ips.value == static_cast<float>(100.0 + s));
  }
}

TEST_CASE("every SummaryWriter opens a new file: nothing is rewritten", "[summary]") {
  TempDir dir;
  const std::string first = write_run(dir, 2);
  const std::string before = read_bytes(first);
  const std::string second = write_run(dir, 3);
  CHECK(first != second);
  CHECK(read_bytes(first) == before);
  CHECK(io::read_event_file(second).scalars.size() == 6);
}

TEST_CASE("flush makes records readable while the writer is still open", "[summary]") {
  TempDir dir;
  io::SummaryWriter tb(dir.path.string(), ".rank0");
  tb.add_scalar("train/lr", 0.1, 1);
  tb.flush();
  const io::EventFile f = io::read_event_file(tb.path());
  REQUIRE(f.scalars.size() == 1);
  CHECK(f.scalars[0].tag == "train/lr");
  CHECK(tb.path().size() > 6);
  CHECK(tb.path().substr(tb.path().size() - 6) == ".rank0");
}

TEST_CASE("a record torn or damaged at the end is skipped and reported", "[summary]") {
  TempDir dir;
  const std::string path = write_run(dir, 4);
  const std::string whole = read_bytes(path);
  // Cut into the last record: the first three steps survive.
  for (size_t cut : {size_t{3}, size_t{12}, size_t{20}}) {
    write_bytes(path, whole.substr(0, whole.size() - cut));
    const io::EventFile f = io::read_event_file(path);
    CHECK(f.scalars.size() == 6);
    CHECK_THAT(f.problem, Catch::Contains("end of file"));
  }
  // A whole header whose record lacks even its 4-byte footer: torn, not read past the end
  // (fuzz_event_file: the length check wrapped around and the CRC read ran off the buffer).
  std::string header;
  const uint64_t length = 1000;
  for (int i = 0; i < 8; ++i) header += static_cast<char>((length >> (8 * i)) & 0xff);
  const uint32_t crc = io::masked_crc32c(header.data(), 8);
  for (int i = 0; i < 4; ++i) header += static_cast<char>((crc >> (8 * i)) & 0xff);
  write_bytes(path, whole + header + "ab");
  const io::EventFile torn = io::read_event_file(path);
  CHECK(torn.scalars.size() == 8);
  CHECK_THAT(torn.problem,
             Catch::Contains("a torn record at byte") && Catch::Contains("(end of file) skipped"));

  // A flipped byte in the last record's data: its CRC fails, the record is skipped.
  std::string flipped = whole;
  flipped[whole.size() - 6] ^= 0x40;
  write_bytes(path, flipped);
  const io::EventFile f = io::read_event_file(path);
  CHECK(f.scalars.size() == 6);
  CHECK_THAT(f.problem, Catch::Contains("bad data CRC"));
}

TEST_CASE("damage inside an event file is an error naming the file and offset", "[summary]") {
  TempDir dir;
  const std::string path = write_run(dir, 4);
  std::string bytes = read_bytes(path);
  // Byte 14 lies in the data of the first (version) record, which more records follow.
  bytes[14] ^= 0x01;
  write_bytes(path, bytes);
  const std::string err = error_of([&] { io::read_event_file(path); });
  CHECK_THAT(err, Catch::Contains(path));
  CHECK_THAT(err, Catch::Contains("at byte 0"));
  CHECK_THAT(err, Catch::Contains("corrupt"));
  // A damaged length field in the middle is an error too, not a silent end of the file.
  bytes = read_bytes(write_run(dir, 4));
  const std::string path2 = dir.file("damaged_length");
  bytes[2] ^= 0x10;
  write_bytes(path2, bytes);
  CHECK_THAT(error_of([&] { io::read_event_file(path2); }), Catch::Contains("bad CRC"));
  CHECK_THAT(error_of([&] { io::read_event_file(dir.file("missing")); }),
             Catch::Contains("cannot open"));
}

TEST_CASE("SummaryWriter names a directory it cannot create", "[summary]") {
  TempDir dir;
  write_bytes(dir.file("plain"), "x");
  CHECK_THAT(error_of([&] { io::SummaryWriter tb(dir.file("plain") + "/tb"); }),
             Catch::Contains(dir.file("plain")));
}
