#include "dpar/ps/ps_env.h"

#include <charconv>
#include <set>

#include "distributed/store_common.h"
#include "dpar/core/error.h"
#include "dpar/distributed/parallel_env.h"

namespace dpar::ps {
namespace {

using Env = std::map<std::string, std::string>;

// The first of `names` that is set (non-empty): {name, value}; {"", ""} when none is.
std::pair<std::string, std::string> first_of(const Env& env,
                                             std::initializer_list<const char*> names) {
  for (const char* name : names) {
    auto it = env.find(name);
    if (it != env.end() && !it->second.empty()) return {name, it->second};
  }
  return {"", ""};
}

int to_int(const std::string& name, const std::string& value) {
  int out = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  DPAR_CHECK(ec == std::errc() && ptr == value.data() + value.size(), "ps environment: ", name, "=",
             value, " is not an integer");
  return out;
}

std::vector<std::string> split_endpoints(const std::string& name, const std::string& value) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  size_t start = 0;
  while (true) {
    const size_t comma = value.find(',', start);
    const std::string entry =
        value.substr(start, comma == std::string::npos ? comma : comma - start);
    const bool ok = dist::detail::split_host_port(entry, nullptr, nullptr);
    DPAR_CHECK(ok, "ps environment: ", name, "=", value, ": entry '", entry,
               "' is not ip:port (port 1..65535)");
    DPAR_CHECK(seen.insert(entry).second, "ps environment: ", name, "=", value,
               ": server endpoint ", entry, " appears twice");
    out.push_back(entry);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

std::string PsEnv::endpoint() const {
  DPAR_CHECK(server_id >= 0 && server_id < static_cast<int>(server_endpoints.size()),
             "ps: this process is not a server of the job");
  return server_endpoints[static_cast<size_t>(server_id)];
}

PsEnv parse_ps_env(const Env& env) {
  PsEnv out;
  auto [role_name, role] = first_of(env, {"TRAINING_ROLE"});
  if (role.empty()) return out;
  if (role == "PSERVER") {
    out.role = Role::kServer;
  } else if (role == "TRAINER") {
    out.role = Role::kTrainer;
  } else {
    DPAR_FAIL("ps environment: TRAINING_ROLE=", role, ": expected PSERVER or TRAINER");
  }
  auto [ep_name, endpoints] =
      first_of(env, {"DPAR_PSERVER_ENDPOINTS", "PADDLE_PSERVERS_IP_PORT_LIST"});
  DPAR_CHECK(!endpoints.empty(), "ps environment: TRAINING_ROLE=", role,
             " but DPAR_PSERVER_ENDPOINTS (or PADDLE_PSERVERS_IP_PORT_LIST) is not set");
  out.server_endpoints = split_endpoints(ep_name, endpoints);
  auto [num_name, num] = first_of(env, {"DPAR_TRAINERS_NUM", "PADDLE_TRAINERS_NUM"});
  DPAR_CHECK(!num.empty(), "ps environment: DPAR_TRAINERS_NUM (or PADDLE_TRAINERS_NUM) is not set");
  out.num_trainers = to_int(num_name, num);
  DPAR_CHECK(out.num_trainers >= 1, "ps environment: ", num_name, "=", num,
             ": expected at least 1 trainer");
  out.job_token = first_of(env, {"DPAR_JOB_TOKEN"}).second;
  if (auto id = first_of(env, {"DPAR_JOB_ID"}).second; !id.empty()) out.job_id = id;

  if (out.role == Role::kTrainer) {
    auto [id_name, id] = first_of(env, {"DPAR_TRAINER_ID", "PADDLE_TRAINER_ID"});
    DPAR_CHECK(!id.empty(),
               "ps environment: a trainer needs DPAR_TRAINER_ID (or PADDLE_TRAINER_ID)");
    out.trainer_id = to_int(id_name, id);
    DPAR_CHECK(out.trainer_id >= 0 && out.trainer_id < out.num_trainers,
               "ps environment: ", id_name, "=", id, " out of range 0..", out.num_trainers - 1,
               " (", num_name, "=", num, ")");
    return out;
  }
  const int servers = static_cast<int>(out.server_endpoints.size());
  auto [sid_name, sid] = first_of(env, {"DPAR_SERVER_ID"});
  std::string current = first_of(env, {"DPAR_CURRENT_ENDPOINT", "PADDLE_CURRENT_ENDPOINT"}).second;
  if (current.empty()) {
    auto ip = first_of(env, {"POD_IP"}).second;
    auto port = first_of(env, {"PADDLE_PORT"}).second;
    if (!ip.empty() && !port.empty()) current = ip + ":" + port;
  }
  int from_endpoint = -1;
  for (int s = 0; s < servers; ++s) {
    if (out.server_endpoints[static_cast<size_t>(s)] == current) from_endpoint = s;
  }
  if (!sid.empty()) {
    out.server_id = to_int(sid_name, sid);
    DPAR_CHECK(out.server_id >= 0 && out.server_id < servers,
               "ps environment: DPAR_SERVER_ID=", sid, " out of range 0..", servers - 1, " (",
               ep_name, " lists ", servers, ")");
    DPAR_CHECK(current.empty() || from_endpoint == out.server_id,
               "ps environment: DPAR_SERVER_ID=", sid, " is ", out.endpoint(), " in ", ep_name,
               ", but this server's endpoint is ", current);
  } else {
    DPAR_CHECK(
        from_endpoint >= 0, "ps environment: this server's endpoint '", current,
        "' (DPAR_CURRENT_ENDPOINT, PADDLE_CURRENT_ENDPOINT or POD_IP:PADDLE_PORT) is not in ",
        ep_name, "=", endpoints);
    out.server_id = from_endpoint;
  }
  return out;
}

PsEnv env_from_environment() { return parse_ps_env(dist::current_environment()); }

}  // namespace dpar::ps
