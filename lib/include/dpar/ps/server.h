#pragma once
// A parameter server: holds one shard of the flat parameter vector (see layout.h) and the
// optimizer state for it, and serves trainers over gRPC (lib/proto/ps.proto).
//
// Modes (chosen by trainer 0 when it initialises the server; every trainer must agree):
//   sync   each step waits for every trainer's gradient, averages them weighted by samples,
//          applies the optimizer once; pulls block until that version exists.
//   async  every push is applied on arrival with the pusher's learning rate; pulls return the
//          latest values, or (with max_staleness >= 0) wait until no trainer is more than
//          max_staleness pushes behind the puller.
//   geo    trainers optimise locally and every k steps push parameter deltas, which the
//          server adds scaled by 1/trainers (model averaging); no optimizer runs here.
// The learning rate of a server-side step is the one the trainer sent with its push, so the
// trainer's schedule (warmup, cosine, step) applies unchanged.
//
// Failure behaviour: a sync step that still lacks some trainers' gradients after `timeout`
// fails every waiting call and run() with an error naming the missing trainer ids; so does a
// job where no unfinished trainer has called for `timeout` (all of them died).
#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace dpar::ps {

using Millis = std::chrono::milliseconds;

struct ServerOptions {
  std::string endpoint;  // ip:port to listen on (only this address, never 0.0.0.0); port 0
                         // picks a free port, which endpoint() then names
  int server_id = 0;
  int num_servers = 1;
  int num_trainers = 1;
  std::string job_token;  // calls must carry it; "" accepts only calls without a token
  Millis timeout{std::chrono::minutes(5)};
  // Progress lines ("ps server 0: initialised by trainer 0 ...") go here; empty: stderr.
  std::function<void(const std::string&)> log;
};

class Server {
 public:
  // Binds the endpoint; throws dpar::Error naming it when it is in use or not local.
  explicit Server(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves until every trainer has finished (returns) or the job failed (throws dpar::Error
  // with the reason, e.g. the ids of trainers that stopped sending gradients).
  void run();
  // Makes run() return and refuses further calls (ABORTED). Idempotent.
  void stop();
  std::string endpoint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpar::ps
