#pragma once
// Command-line flags for dpar's programs. Flags are declared with a default and a help text,
// then parsed from argv:
//   Flags flags("train", "Trains MobileNetV3");
//   auto& epochs = flags.add_int("epochs", 3, "passes over the training data");
//   auto rest = flags.parse(argc, argv);   // throws FlagError on any bad input
// Accepted spellings: --name=value, --name value, and '_' or '-' inside the name
// (--log_dir == --log-dir). Booleans accept --flag, --flag=true|false|1|0|yes|no|True|False.
// "--" ends flags; with allow_positional, the first non-flag argument also ends them (for
// launchers: everything after the program name belongs to the program).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dpar/core/error.h"

namespace dpar {

// Bad command line: programs print what() and exit with status 2.
class FlagError : public Error {
 public:
  using Error::Error;
};

class Flags {
 public:
  Flags(std::string program, std::string description);

  std::string& add_string(const std::string& name, std::string def, std::string help);
  int64_t& add_int(const std::string& name, int64_t def, std::string help);
  double& add_double(const std::string& name, double def, std::string help);
  bool& add_bool(const std::string& name, bool def, std::string help);
  // Another spelling for an existing flag (e.g. --devices for --gpus).
  void add_alias(const std::string& alias, const std::string& name);
  // The value a string flag takes when given bare (`--tensorboard` alone, or followed by another
  // flag), like argparse's nargs='?' const: `--tensorboard` -> output/tb, `--tensorboard DIR`.
  void set_implicit_value(const std::string& name, std::string value);

  // Parses argv[1..]; returns the positional arguments (and everything after them when
  // allow_positional). --help prints usage() and exits 0.
  std::vector<std::string> parse(int argc, const char* const* argv, bool allow_positional = false);
  std::vector<std::string> parse(const std::vector<std::string>& args,
                                 bool allow_positional = false);

  bool was_set(const std::string& name) const;  // given on the command line
  std::string usage() const;

 private:
  enum class Kind { String, Int, Double, Bool };
  struct Flag {
    Kind kind;
    std::string help;
    std::string default_text;
    std::optional<std::string> implicit_value;
    bool set = false;
    std::unique_ptr<std::string> s;
    std::unique_ptr<int64_t> i;
    std::unique_ptr<double> d;
    std::unique_ptr<bool> b;
  };
  static std::string canonical(const std::string& name);
  // "did you mean --nproc-per-node?" for a mistyped or shortened name, or "".
  std::string suggestion(const std::string& name) const;
  Flag& declare(const std::string& name, Kind kind, std::string help, std::string default_text);
  void assign(const std::string& name, Flag& flag, const std::string& value);

  std::string program_;
  std::string description_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> aliases_;
};

// Runs body() and turns exceptions into one line on stderr and an exit status: 2 for
// FlagError (bad usage), 1 for any other error. For main(): return run_main("train", [&]{...});
int run_main(const char* program, const std::function<int()>& body);

}  // namespace dpar
