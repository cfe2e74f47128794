#pragma once
// Parameter-server training in the spirit of PaddlePaddle's fleet API. One program serves
// both roles; dpar-launch --run_mode=ps sets TRAINING_ROLE for each process:
//
//   if (dpar::ps::is_server()) {
//     dpar::ps::init_server();
//     dpar::ps::run_server();   // returns when every trainer has called stop_worker()
//     return 0;
//   }
//   dpar::ps::init_worker(model, optimizer, {.mode = dpar::ps::Mode::kSync});
//   for (...) { ...; loss.backward(); dpar::ps::worker().step(batch_size); }
//   dpar::ps::stop_worker();
//
// The classes behind these (ps::Server, ps::ParameterServerTrainer) can be used directly,
// e.g. several of them in one process in tests.
#include "dpar/ps/layout.h"
#include "dpar/ps/ps_env.h"
#include "dpar/ps/server.h"
#include "dpar/ps/trainer.h"

namespace dpar::ps {

// The role this process has in a ps job (from TRAINING_ROLE); both false outside one.
bool is_server();
bool is_worker();

// Creates this process's Server from the environment (its endpoint, id, the trainer count
// and the job token). Throws dpar::Error when the environment is not a server's.
void init_server(Millis timeout = std::chrono::minutes(5));
// Serves until all trainers have finished (then returns) or the job fails (throws).
void run_server();

// Creates the process-wide ParameterServerTrainer from the environment; see trainer.h.
void init_worker(nn::Module& model, optim::Optimizer& optimizer, TrainerOptions options = {});
ParameterServerTrainer& worker();  // throws if init_worker() was not called
// Tells the servers this trainer is done and drops the trainer. Idempotent.
void stop_worker();

}  // namespace dpar::ps
