// The checkpoint loader: a training checkpoint (safetensors + CRC + the training state as JSON)
// read back and restored into a model and optimizer, as --resume and load_model_weights do.
// The state JSON is checked before the checksum would catch a random change, so the same bytes
// also go straight to the state parser.
#include "dpar/io/checkpoint.h"
#include "fuzz_util.h"
#include "io/checkpoint_format.h"
#include "tiny_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = dpar::fuzz::write_scratch("input.ckpt", data, size);
  dpar::fuzz::expect_only_dpar_errors("fuzz_checkpoint", [&] {
    const dpar::io::Checkpoint ckpt = dpar::io::load_checkpoint(path);
    dpar::fuzz::TinyRun run;
    dpar::io::restore_checkpoint(ckpt, *run.net, &run.opt, nullptr, path);
  });
  dpar::fuzz::expect_only_dpar_errors("fuzz_checkpoint", [&] {
    (void)dpar::io::detail::state_from_json(std::string(reinterpret_cast<const char*>(data), size),
                                            "fuzz");
  });
  return 0;
}
