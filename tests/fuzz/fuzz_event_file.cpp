// The TensorBoard event-file reader (TFRecord framing, masked CRC-32C, Event/Summary protos),
// as tests and tools read files a crashed run may have cut short.
#include "dpar/io/summary_writer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = dpar::fuzz::write_scratch("events.out.tfevents.fuzz", data, size);
  dpar::fuzz::expect_only_dpar_errors("fuzz_event_file",
                                      [&] { (void)dpar::io::read_event_file(path); });
  return 0;
}
