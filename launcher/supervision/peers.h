// This node's place in a multi-node job: node 0 serves the store, every node joins it,
// a failed or lost peer stops this node's training, and at the end all nodes agree on
// the job's result (the exit barrier).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "env/identity.h"
#include "env/job_config.h"
#include "launcher/exit_codes.h"
#include "launcher/supervision/signals.h"
#include "launcher/supervision/supervisor.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"

namespace bt::launcher {

struct RendezvousEndpoint {
  uint16_t port;
  std::string token;
  bool token_derived;  // from the job id: weaker, warned about once
};

// The token from BT_RENDEZVOUS_TOKEN_FILE (its first line) or BT_RENDEZVOUS_TOKEN, read
// once; the variable is then removed from the launcher's environment and its value
// overwritten in the process's original environment block. "" when neither is set.
const std::string& RendezvousTokenFromEnvironment();

// "localhost", ::1 or 127.0.0.0/8: an address that reaches node 0 only from its own host.
bool IsLoopback(const std::string& host);

// BT_RENDEZVOUS_PORT, else launcher.rendezvous.port. Throws LaunchFailure (65) for a
// variable that is no port.
uint16_t RendezvousPort(const env::JobConfig& config);

// RendezvousPort; the token above, else derived.
RendezvousEndpoint ResolveEndpoint(const env::JobConfig& config, const std::string& job_id);

// The other nodes of the job, as the run sees them. As StopRequests: a peer failed or
// the leader is gone.
class Peers : public StopRequests {
 public:
  // Reports this node's outcome, waits for the job's verdict, and returns the exit code
  // every node agrees on: 0, this node's own failure code, or 69 when another failed.
  virtual int Finish(const JobOutcome& outcome, SignalRouter& signals) = 0;
  // Reports this node's outcome now (so the others stop at once), before a checkpoint drain;
  // Finish then only waits for the verdict.
  virtual void Report(const JobOutcome& outcome) = 0;
  virtual std::vector<rendezvous::NodeInfo> Roster() = 0;
  // The roster without each node's addresses: cheap on node 0 (its own server's), the
  // whole roster elsewhere.
  virtual std::vector<rendezvous::NodeInfo> BriefRoster() { return Roster(); }
  // The rendezvous store during the run (null for backends without one).
  virtual rendezvous::Store* store() { return nullptr; }
  // On node 0: the ranks whose launcher is not connected now (empty elsewhere, and for
  // backends without a leader's server).
  virtual std::vector<int> AbsentRanks() { return {}; }
  // Node 0: the job's nodes by state now (live metrics); nullopt elsewhere.
  virtual std::optional<rendezvous::StoreServer::NodeStates> NodeStates() { return std::nullopt; }
  // This node's address on its connection to the leader ("" when there is none).
  virtual std::string LocalAddress() { return ""; }
  // Node 0's wall clock minus this node's (0 on node 0, and where it is not known): the
  // job's report draws every node on node 0's clock (launcher/report/recorder.h).
  virtual std::chrono::nanoseconds LeaderClockOffset() { return {}; }
  // What a node that another node's failure stopped exits with, once TakeStop said so:
  // that node's code, so the scheduler sees one result for the job; 69 when it was lost.
  virtual int StopExitCode() { return kExitUnavailable; }

  // Restart in place (launcher/supervision/restart.h); backends without a leader that
  // pushes decisions (mpi) never restart.
  // The cycle this node's outcome and barrier arrivals belong to.
  virtual void BeginCycle(int64_t) {}
  // After this node's report: the leader's answer, a restart (true) or the job's verdict.
  virtual bool AwaitRestartOrVerdict(SignalRouter&, int& signal_number) {
    signal_number = 0;
    return false;
  }
  // The newest restart the leader pushed for a later cycle than this node's, once.
  virtual std::optional<rendezvous::PeerEvent> TakeRestart() { return std::nullopt; }
  // This launcher joined in place of a lost one: the restart of the cycle it meets the
  // others in (it runs no cycle before), once.
  virtual std::optional<rendezvous::PeerEvent> TakeRejoin() { return std::nullopt; }
  // Tells the leader this node is ready for `cycle` (its job took `stopped_s` to stop) and
  // waits until every node is (true), a newer restart or a verdict arrives, a shutdown
  // signal comes, `leaving` says this node leaves (checked every quarter second), or
  // `deadline` passes (false).
  virtual bool AwaitCycleStart(int64_t, double /*stopped_s*/, std::chrono::steady_clock::time_point, SignalRouter&,
                               int& signal_number, const std::function<bool()>& /*leaving*/ = {}) {
    signal_number = 0;
    return false;
  }
  // The leader's go for the cycle AwaitCycleStart passed, with the restart's figures.
  virtual rendezvous::Message CycleGo() { return {}; }
  // Hot spares (launcher.spares, docs/SPARES.md). Whether this launcher runs a training rank
  // now: false for a spare, and for a node whose rank the newest restart moved to one.
  virtual bool RunsARank() { return true; }
  // Node 0: the nodes (slots) running a training rank now, in order; every node of
  // `node_count` where there are no spares.
  virtual std::vector<int> NodesRunningRanks(int node_count) {
    std::vector<int> nodes(size_t(std::max(node_count, 0)));
    for (int node = 0; node < node_count; ++node) nodes[size_t(node)] = node;
    return nodes;
  }
  // Before the first cycle: the slot of each rank as node 0 decided it from every node's
  // health (a node that cannot train starts as a spare). Returns this node's training rank
  // (-1: none).
  virtual int StartWithRanks(const std::vector<int>& /*slots*/) { return 0; }
  // A spare, prepared: tells the leader so and waits until it is given a rank (true: then
  // TakeRejoin says which, and the cycle), the job's verdict comes, a shutdown signal
  // (`signal_number`), or `leaving` says it leaves (checked every quarter second).
  virtual bool AwaitRank(SignalRouter&, int& signal_number, const std::function<bool()>& /*leaving*/ = {}) {
    signal_number = 0;
    return false;
  }
  // Where the job's MASTER_ADDR points when training rank 0 runs on another launcher than
  // node 0's (a spare took it): that node's address as node 0 sees it; nullopt otherwise.
  virtual std::optional<std::string> MasterAddress() { return std::nullopt; }
  // This launcher serves the rendezvous store (node 0 of the tcp backend): when its rank moves
  // to a spare it stays, deciding restarts, and runs no command (docs/SPARES.md).
  virtual bool ServesTheStore() const { return false; }
  // Node 0 running no rank: waits, however long, until the leader pushes a restart (true) or
  // the job's verdict comes or a shutdown signal (`signal_number`) (false); `every_slice`
  // runs between the waits (four times a second).
  virtual bool AwaitRestart(SignalRouter&, int& signal_number, const std::function<void()>& /*every_slice*/) {
    signal_number = 0;
    return false;
  }
  // The job's verdict (abort, lost leader) when one came.
  virtual std::optional<std::string> Verdict() { return std::nullopt; }
  // Node 0 cannot be reached any more (cut off, or gone): nothing this node sends it counts,
  // so no checkpoint can be committed. Thread-safe: the checkpoint drain asks on its thread.
  virtual bool LeaderLost() { return false; }

  // Hangs (launcher/watchdog, docs/PROTOCOL.md "Hangs"); backends without a leader that
  // pushes (mpi) watch each node alone.
  virtual bool SharesHangs() const { return false; }
  // This node's job made no progress for `quiet` (for the log) in `cycle`; `stalled` false:
  // it makes progress again.
  virtual void ReportStall(int64_t /*cycle*/, const std::string& /*quiet*/, bool /*stalled*/) {}
  // Node 0: the hang fails `cycle`, blamed on node `rank`.
  virtual void DeclareHang(int64_t /*cycle*/, int /*rank*/, const std::string& /*cause*/, int /*exit_code*/) {}
  // `handler` runs on the thread that takes stops (the supervisor's) when the leader asks for
  // this node's stacks; it must only hand the request on.
  using StackRequestHandler = std::function<void(const rendezvous::PeerEvent&)>;
  virtual void OnStackRequest(StackRequestHandler /*handler*/) {}
};

// Joins with the configured backend and returns once every node has joined. Throws
// LaunchFailure: 69 naming the missing or refused nodes, 128+signal when stopped.
// `restart_policy` (node 0, launcher.restart): what the leader answers a failed cycle with.
std::unique_ptr<Peers> JoinPeers(const env::JobConfig& config, const env::NodeIdentity& identity,
                                 const std::string& job_id, SignalRouter& signals,
                                 rendezvous::RestartPolicy restart_policy = {});

// The tcp backend: node 0 serves the store, every node joins it and keeps a heartbeat.
class TcpPeers final : public Peers {
 public:
  static std::unique_ptr<TcpPeers> Join(const env::JobConfig& config, const env::NodeIdentity& identity,
                                        const std::string& job_id, SignalRouter& signals,
                                        rendezvous::RestartPolicy restart_policy = {});
  ~TcpPeers() override;

  int fd() const override { return client_->event_fd(); }
  std::optional<std::string> TakeStop() override;
  std::vector<int> AbsentRanks() override { return server_ ? server_->absent() : std::vector<int>{}; }
  std::optional<rendezvous::StoreServer::NodeStates> NodeStates() override {
    if (!server_) return std::nullopt;
    return server_->node_states();
  }
  int Finish(const JobOutcome& outcome, SignalRouter& signals) override;
  void Report(const JobOutcome& outcome) override;
  std::vector<rendezvous::NodeInfo> Roster() override;
  std::vector<rendezvous::NodeInfo> BriefRoster() override { return server_ ? server_->brief_roster() : Roster(); }
  // Node 0's: its client, with reads of what is there now served by its own server
  // in-process (LeaderStore); every other node's: its client.
  rendezvous::Store* store() override;
  std::string LocalAddress() override { return client_->LocalAddress(); }
  std::chrono::nanoseconds LeaderClockOffset() override {
    return server_ ? std::chrono::nanoseconds{0} : client_->handshake().clock_offset.value_or(std::chrono::nanoseconds{0});
  }
  int StopExitCode() override;
  void BeginCycle(int64_t cycle) override;
  bool AwaitRestartOrVerdict(SignalRouter& signals, int& signal_number) override;
  std::optional<rendezvous::PeerEvent> TakeRestart() override;
  std::optional<rendezvous::PeerEvent> TakeRejoin() override;
  rendezvous::Message CycleGo() override { return cycle_go_; }
  bool RunsARank() override {
    DrainEvents();
    return training_rank_ >= 0;
  }
  bool AwaitRank(SignalRouter& signals, int& signal_number, const std::function<bool()>& leaving = {}) override;
  int StartWithRanks(const std::vector<int>& slots) override;
  std::vector<int> NodesRunningRanks(int node_count) override {
    return server_ ? server_->nodes_running_ranks() : Peers::NodesRunningRanks(node_count);
  }
  bool AwaitCycleStart(int64_t cycle, double stopped_s, std::chrono::steady_clock::time_point deadline, SignalRouter& signals,
                       int& signal_number, const std::function<bool()>& leaving = {}) override;
  std::optional<std::string> Verdict() override;
  std::optional<std::string> MasterAddress() override {
    DrainEvents();
    return master_addr_;
  }
  bool ServesTheStore() const override { return server_ != nullptr; }
  bool AwaitRestart(SignalRouter& signals, int& signal_number, const std::function<void()>& every_slice) override;
  // Node 0 too: its own launcher stalled past the heartbeat timeout and the others left.
  bool LeaderLost() override { return client_->LeaderLost() || (server_ && server_->StalledItself()); }
  bool SharesHangs() const override { return true; }
  void ReportStall(int64_t cycle, const std::string& quiet, bool stalled) override;
  void DeclareHang(int64_t cycle, int rank, const std::string& cause, int exit_code) override;
  void OnStackRequest(StackRequestHandler handler) override;

 private:
  TcpPeers(const env::JobConfig& config, const env::NodeIdentity& identity);
  void DrainEvents();
  void OnCycleEvent(rendezvous::PeerEvent event);
  void NoteMasterAddress(const rendezvous::Message& decision);
  // Takes the leader's events until `done()` holds (true), a shutdown signal arrives (true,
  // `signal_number` set) or `deadline` passes (false).
  bool WaitUntil(const std::function<bool()>& done, SignalRouter& signals,
                 std::chrono::steady_clock::time_point deadline, int& signal_number);

  const env::JobConfig& config_;
  env::NodeIdentity identity_;
  std::unique_ptr<rendezvous::StoreServer> server_;
  std::unique_ptr<rendezvous::StoreClient> client_;
  std::unique_ptr<rendezvous::Store> leader_store_;  // node 0 only; uses server_ and client_
  bool complete_ = false;
  std::optional<rendezvous::PeerEvent> verdict_;
  bool stop_delivered_ = false;
  bool reported_ = false;
  int64_t cycle_ = 0;
  std::optional<rendezvous::PeerEvent> restart_;  // pushed for a cycle after cycle_, not yet taken
  std::optional<rendezvous::PeerEvent> rejoin_;   // this launcher replaced a lost one: the cycle to meet in
  bool preparing_rejoin_ = false;                 // it did, and has begun no cycle yet (no job to stop)
  bool cycle_started_ = false;                    // the leader's go for cycle_ came
  rendezvous::Message cycle_go_;                  // that go
  int training_rank_;                             // -1: none (RunsARank)
  std::optional<std::string> master_addr_;        // MasterAddress()
  // A go for the cycle of a restart not taken yet: the barrier passed without this launcher
  // (node 0 running no rank), which must not wait for it.
  std::optional<rendezvous::PeerEvent> early_go_;
  std::mutex stack_request_mutex_;
  StackRequestHandler stack_request_handler_;
};

// The mpi backend (under mpirun): node info exchanged with MPI collectives through the
// plugin. Liveness during the run is mpirun's: it stops every rank when one exits non-zero.
class MpiPeers final : public Peers {
 public:
  static std::unique_ptr<MpiPeers> Join(const env::NodeIdentity& identity);
  int fd() const override { return -1; }
  std::optional<std::string> TakeStop() override { return std::nullopt; }
  int Finish(const JobOutcome& outcome, SignalRouter&) override { return outcome.exit_code; }
  void Report(const JobOutcome&) override {}
  std::vector<rendezvous::NodeInfo> Roster() override { return roster_; }

 private:
  std::vector<rendezvous::NodeInfo> roster_;
};

}  // namespace bt::launcher
