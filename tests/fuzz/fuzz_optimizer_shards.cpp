// Optimizer shard sets (dpar/distributed/optimizer_shards.h): an index.json and one rank's
// safetensors file (split_two), read for the tiny net's whole-parameter layout and for a layout
// that cuts its first parameter in two, and loaded into its optimizer, as a resumed job reads a
// set written by any number of ranks.
#include <filesystem>

#include "dpar/distributed/optimizer_shards.h"
#include "fuzz_util.h"
#include "tiny_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [index, file] = dpar::fuzz::split_two(data, size);
  const std::filesystem::path dir = dpar::fuzz::scratch_dir() / "set";
  std::filesystem::create_directories(dir);
  dpar::fuzz::write_scratch("set/index.json", reinterpret_cast<const uint8_t*>(index.data()),
                            index.size());
  dpar::fuzz::write_scratch("set/rank-0-of-1.safetensors",
                            reinterpret_cast<const uint8_t*>(file.data()), file.size());
  dpar::fuzz::TinyRun run;
  const dpar::dist::OptimizerLayout whole =
      dpar::dist::whole_parameter_layout(run.net->named_parameters());
  dpar::fuzz::expect_only_dpar_errors("fuzz_optimizer_shards", [&] {
    run.opt.load_state_dict(dpar::dist::read_optimizer_shards(dir.string(), whole, "SGD"));
  });
  dpar::dist::OptimizerLayout cut = whole;
  const int64_t numel = cut.tensors[0][0].end;
  cut.tensors[0] = {{0, 0, numel / 2, 0}};
  cut.tensor_shapes[0] = {numel / 2};
  cut.tensor_strides[0] = {1};
  cut.tensors.push_back({{0, numel / 2, numel, 0}});
  cut.tensor_shapes.push_back({numel - numel / 2});
  cut.tensor_strides.push_back({1});
  dpar::fuzz::expect_only_dpar_errors("fuzz_optimizer_shards", [&] {
    dpar::fuzz::keep(dpar::dist::read_optimizer_shards(dir.string(), cut, "SGD").size());
  });
  return 0;
}
