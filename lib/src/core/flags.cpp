#include "dpar/core/flags.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <vector>

namespace dpar {
namespace {

// Levenshtein distance, for "did you mean" on a mistyped flag.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// A number such as "-1" or "-0.5" is a value, not a flag.
bool looks_numeric(const std::string& arg) {
  return arg.size() > 1 && (std::isdigit(static_cast<unsigned char>(arg[1])) || arg[1] == '.');
}

}  // namespace

Flags::Flags(std::string program, std::string description)
    : program_(std::move(program)), description_(std::move(description)) {}

std::string Flags::canonical(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    if (c == '_') c = '-';
  }
  return out;
}

Flags::Flag& Flags::declare(const std::string& name, Kind kind, std::string help,
                            std::string default_text) {
  const std::string key = canonical(name);
  DPAR_CHECK(!flags_.count(key) && !aliases_.count(key), program_, ": flag --", name,
             " declared twice");
  Flag& f = flags_[key];
  f.kind = kind;
  f.help = std::move(help);
  f.default_text = std::move(default_text);
  order_.push_back(key);
  return f;
}

std::string& Flags::add_string(const std::string& name, std::string def, std::string help) {
  Flag& f = declare(name, Kind::String, std::move(help), def.empty() ? "\"\"" : def);
  f.s = std::make_unique<std::string>(std::move(def));
  return *f.s;
}
int64_t& Flags::add_int(const std::string& name, int64_t def, std::string help) {
  Flag& f = declare(name, Kind::Int, std::move(help), std::to_string(def));
  f.i = std::make_unique<int64_t>(def);
  return *f.i;
}
double& Flags::add_double(const std::string& name, double def, std::string help) {
  char text[64];
  std::snprintf(text, sizeof text, "%g", def);
  Flag& f = declare(name, Kind::Double, std::move(help), text);
  f.d = std::make_unique<double>(def);
  return *f.d;
}
bool& Flags::add_bool(const std::string& name, bool def, std::string help) {
  Flag& f = declare(name, Kind::Bool, std::move(help), def ? "true" : "false");
  f.b = std::make_unique<bool>(def);
  return *f.b;
}

void Flags::add_alias(const std::string& alias, const std::string& name) {
  DPAR_CHECK(flags_.count(canonical(name)), program_, ": alias --", alias, " names unknown flag --",
             name);
  aliases_[canonical(alias)] = canonical(name);
}

void Flags::set_implicit_value(const std::string& name, std::string value) {
  auto it = flags_.find(canonical(name));
  DPAR_CHECK(it != flags_.end() && it->second.kind == Kind::String, program_,
             ": an implicit value needs a string flag, not --", name);
  it->second.implicit_value = std::move(value);
}

void Flags::assign(const std::string& name, Flag& flag, const std::string& value) {
  auto bad = [&](const char* expected) {
    throw FlagError(program_ + ": --" + name + "=" + value + ": expected " + expected);
  };
  switch (flag.kind) {
    case Kind::String:
      *flag.s = value;
      break;
    case Kind::Int: {
      size_t used = 0;
      try {
        *flag.i = std::stoll(value, &used);
      } catch (const std::exception&) {
        bad("an integer");
      }
      if (used != value.size()) bad("an integer");
      break;
    }
    case Kind::Double: {
      size_t used = 0;
      try {
        *flag.d = std::stod(value, &used);
      } catch (const std::exception&) {
        bad("a number");
      }
      if (used != value.size()) bad("a number");
      break;
    }
    case Kind::Bool:
      if (value == "true" || value == "True" || value == "1" || value == "yes") {
        *flag.b = true;
      } else if (value == "false" || value == "False" || value == "0" || value == "no") {
        *flag.b = false;
      } else {
        bad("true or false");
      }
      break;
  }
  flag.set = true;
}

std::vector<std::string> Flags::parse(int argc, const char* const* argv, bool allow_positional) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse(args, allow_positional);
}

std::vector<std::string> Flags::parse(const std::vector<std::string>& args, bool allow_positional) {
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      positional.insert(positional.end(), args.begin() + static_cast<long>(i) + 1, args.end());
      break;
    }
    // "-n 2": a short flag is never a program name, and none is defined, so say which long
    // flag was meant instead of trying to run a program called "-n".
    if (arg.size() > 1 && arg[0] == '-' && arg[1] != '-' && !looks_numeric(arg)) {
      const std::string name =
          arg.substr(1, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 1);
      if (name == "h") {
        std::cout << usage();
        std::exit(0);
      }
      const std::string hint = suggestion(name);
      throw FlagError(program_ + ": unknown flag " + arg.substr(0, name.size() + 1) +
                      " (flags start with --; " + (hint.empty() ? "" : hint + " ") + "see --help)");
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      if (allow_positional) {
        positional.insert(positional.end(), args.begin() + static_cast<long>(i), args.end());
        break;
      }
      throw FlagError(program_ + ": unexpected argument '" + arg +
                      "' (flags are --name=value; see --help)");
    }
    const size_t eq = arg.find('=');
    std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (name == "help" || name == "h") {
      std::cout << usage();
      std::exit(0);
    }
    std::string key = canonical(name);
    if (auto a = aliases_.find(key); a != aliases_.end()) key = a->second;
    auto it = flags_.find(key);
    if (it == flags_.end()) {
      const std::string hint = suggestion(name);
      throw FlagError(program_ + ": unknown flag --" + name + " (" +
                      (hint.empty() ? "" : hint + " ") + "see --help)");
    }
    Flag& flag = it->second;
    if (eq != std::string::npos) {
      assign(name, flag, arg.substr(eq + 1));
    } else if (flag.kind == Kind::Bool &&
               (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0 ||
                !(args[i + 1] == "true" || args[i + 1] == "false" || args[i + 1] == "True" ||
                  args[i + 1] == "False"))) {
      *flag.b = true;
      flag.set = true;
    } else if (flag.implicit_value && (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0)) {
      assign(name, flag, *flag.implicit_value);
    } else {
      if (i + 1 >= args.size()) throw FlagError(program_ + ": --" + name + " needs a value");
      assign(name, flag, args[++i]);
    }
  }
  return positional;
}

std::string Flags::suggestion(const std::string& name) const {
  const std::string key = canonical(name);
  std::vector<std::string> names = order_;
  for (const auto& [alias, target] : aliases_) names.push_back(alias);
  // A prefix ("-n", "--nproc") names every flag it starts; otherwise the nearest names within
  // a third of the name's length (at least 2 edits).
  std::vector<std::string> picks;
  for (const std::string& n : names) {
    if (key.size() < n.size() && n.compare(0, key.size(), key) == 0) picks.push_back(n);
  }
  if (picks.empty()) {
    const size_t limit = std::max<size_t>(2, key.size() / 3);
    size_t best = limit + 1;
    for (const std::string& n : names) {
      const size_t d = edit_distance(key, n);
      if (d > limit) continue;
      if (d < best) {
        best = d;
        picks.clear();
      }
      if (d == best) picks.push_back(n);
    }
  }
  if (picks.empty()) return "";
  std::sort(picks.begin(), picks.end());
  std::string out = picks.size() == 1 ? "did you mean --" : "did you mean one of --";
  for (size_t i = 0; i < picks.size() && i < 4; ++i) out += (i ? ", --" : "") + picks[i];
  return out + "?";
}

bool Flags::was_set(const std::string& name) const {
  auto it = flags_.find(canonical(name));
  return it != flags_.end() && it->second.set;
}

std::string Flags::usage() const {
  std::string out = "usage: " + program_ + " [flags]\n" + description_ + "\n\nflags:\n";
  for (const std::string& key : order_) {
    const Flag& f = flags_.at(key);
    std::string line = "  --" + key;
    line.resize(std::max<size_t>(line.size() + 1, 28), ' ');
    out += line + f.help + " (default " + f.default_text + ")\n";
  }
  return out;
}

int run_main(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const FlagError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace dpar
