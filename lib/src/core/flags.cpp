#include "dpar/core/flags.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace dpar {

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
    if (it == flags_.end())
      throw FlagError(program_ + ": unknown flag --" + name + " (see --help)");
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
