#pragma once
// The parameter-server job as dpar-launch --run_mode=ps describes it in each process's
// environment (PaddlePaddle's names are read as a fallback, so a process started by
// paddle.distributed.launch-style tooling also finds its role):
//   TRAINING_ROLE            PSERVER or TRAINER
//   DPAR_PSERVER_ENDPOINTS   ip:port of every server, in server-id order
//                            (PADDLE_PSERVERS_IP_PORT_LIST)
//   DPAR_TRAINERS_NUM        number of trainers (PADDLE_TRAINERS_NUM)
//   DPAR_TRAINER_ID          trainers: their id (PADDLE_TRAINER_ID)
//   DPAR_SERVER_ID           servers: their id; else found from DPAR_CURRENT_ENDPOINT /
//                            PADDLE_CURRENT_ENDPOINT / POD_IP:PADDLE_PORT in the list
//   DPAR_JOB_TOKEN           the job's secret, sent with every call
//   DPAR_JOB_ID              for messages
#include <map>
#include <string>
#include <vector>

namespace dpar::ps {

enum class Role { kNone, kServer, kTrainer };

struct PsEnv {
  Role role = Role::kNone;
  std::vector<std::string> server_endpoints;
  int server_id = -1;   // servers
  int trainer_id = -1;  // trainers
  int num_trainers = 0;
  std::string job_token;
  std::string job_id = "default";
  std::string endpoint() const;  // servers: their own ip:port
};

// Pure function of the variables above. Without TRAINING_ROLE the role is kNone (not a PS
// job). Inconsistent values (an id out of range, a malformed endpoint, a server endpoint not
// in the list) throw dpar::Error naming the variables.
PsEnv parse_ps_env(const std::map<std::string, std::string>& env);
PsEnv env_from_environment();

}  // namespace dpar::ps
