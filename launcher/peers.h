// This node's place in a multi-node job: node 0 serves the store, every node joins it,
// a failed or lost peer stops this node's training, and at the end all nodes agree on
// the job's result (the exit barrier).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "env/identity.h"
#include "env/job_config.h"
#include "launcher/signals.h"
#include "launcher/supervisor.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"

namespace bt::launcher {

struct RendezvousEndpoint {
  uint16_t port;
  std::string token;
  bool token_derived;  // from the job id: weaker, warned about once
};

// BT_RENDEZVOUS_PORT, else launcher.rendezvous.port; BT_RENDEZVOUS_TOKEN, else derived.
RendezvousEndpoint ResolveEndpoint(const env::JobConfig& config, const std::string& job_id);

class JobPeers final : public StopRequests {
 public:
  // Serves (node 0), connects and joins, and waits until every node has joined. Throws
  // LaunchFailure: 69 naming the missing or refused nodes, 128+signal when stopped.
  static std::unique_ptr<JobPeers> Join(const env::JobConfig& config, const env::NodeIdentity& identity,
                                        const std::string& job_id, SignalRouter& signals);
  ~JobPeers() override;

  // StopRequests: a peer failed or the leader is gone.
  int fd() const override { return client_->event_fd(); }
  std::optional<std::string> TakeStop() override;

  // Reports this node's outcome, waits for the job's verdict, and returns the exit code
  // every node agrees on: 0, this node's own failure code, or 69 when another failed.
  int Finish(const JobOutcome& outcome, SignalRouter& signals);

  std::vector<rendezvous::NodeInfo> Roster();
  bool is_leader() const { return server_ != nullptr; }

 private:
  JobPeers(const env::JobConfig& config, const env::NodeIdentity& identity);
  void DrainEvents();
  // Takes the leader's events until `done()` holds (true), a shutdown signal arrives (true,
  // `signal_number` set) or `deadline` passes (false).
  bool WaitUntil(const std::function<bool()>& done, SignalRouter& signals,
                 std::chrono::steady_clock::time_point deadline, int& signal_number);

  const env::JobConfig& config_;
  env::NodeIdentity identity_;
  std::unique_ptr<rendezvous::StoreServer> server_;
  std::unique_ptr<rendezvous::StoreClient> client_;
  bool complete_ = false;
  std::optional<rendezvous::PeerEvent> verdict_;
  bool stop_delivered_ = false;
};

}  // namespace bt::launcher
