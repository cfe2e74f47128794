// dpar-launch's parsers, fed what users type and files they write: the command line (--ips,
// --gpus, --nproc_per_node, ps-mode endpoints, ...) and the cluster it describes, a hostfile,
// or a rank table (JSON). The first byte picks the parser; the rest is its text.
#include <string>
#include <vector>

#include "cluster.h"
#include "fuzz_util.h"
#include "options.h"

namespace {

// Command-line words, split at NUL or newline (as a shell would hand them over).
std::vector<std::string> words_of(std::string_view text) {
  std::vector<std::string> words;
  std::string word;
  for (char c : text) {
    if (c == '\0' || c == '\n') {
      words.push_back(word);
      word.clear();
    } else {
      word += c;
    }
  }
  words.push_back(word);
  return words;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  dpar::fuzz::expect_only_dpar_errors("fuzz_launch_parse", [&] {
    namespace launch = dpar::launch;
    switch (data[0] % 4) {
      case 0: {
        const std::vector<std::string> words = words_of(text);
        // --help (and -h) prints the usage and exits 0, as every command line tool does: by
        // design, so such command lines are not fed to the parser.
        for (const std::string& w : words) {
          const std::string name = w.substr(0, w.find('='));
          if (name == "--help" || name == "--h" || name == "-h") return;
        }
        const launch::Options options = launch::parse_options(words);
        const auto gpus = options.gpus.empty() ? std::vector<std::string>()
                                               : launch::parse_gpu_list(options.gpus, "--gpus");
        if (!options.ips.empty()) {
          (void)launch::cluster_from_ips(options.ips, gpus,
                                         static_cast<int>(options.nproc_per_node));
        }
        break;
      }
      case 1:
        (void)launch::cluster_from_hostfile(text, "fuzz.hostfile", {}, 2);
        break;
      case 2:
        (void)launch::cluster_from_hostfile(text, "fuzz.hostfile", {"0", "1", "3"}, 1);
        break;
      default:
        (void)launch::cluster_from_rank_table(text, "fuzz.json");
        break;
    }
  });
  return 0;
}
