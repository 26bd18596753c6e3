// The store server node 0 runs for the whole job: one epoll loop serving every node's
// connection. It holds the key-value table, admits nodes that prove the job token, tracks
// who joined, watches heartbeats, and broadcasts the verdicts (complete, abort, result,
// join timeout). Work per phase is O(nodes): nothing is sent to every node that grows
// with the number of nodes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/cycles.h"
#include "rendezvous/node_info.h"

namespace bt::rendezvous {

struct ServerOptions {
  uint16_t port = 0;  // 0: an ephemeral port (tests)
  std::string token;
  int node_count = 1;
  std::chrono::milliseconds join_timeout{900'000};
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{10'000};
  // After the verdict, how long to keep serving nodes that have not said goodbye.
  std::chrono::milliseconds exit_linger{10'000};
  // A node that proves the token but says it is of another job is refused, naming both
  // (empty: not checked).
  std::string job_id;
  // Asked when a node's job fails or its launcher is lost: a restart of every node instead
  // of an abort (empty: never).
  RestartPolicy restart_policy;
  // How long a restart's barrier waits (for a lost node's launcher to join again, for every
  // node to stop its job) before the job is aborted naming the ranks still awaited.
  std::chrono::milliseconds rejoin_timeout{600'000};
  // Hot spares (docs/SPARES.md): the last `spares` of the node_count launchers run no
  // training rank until a leaving node's rank moves to one; max_failures_per_node cycle
  // failures blamed on one node make it leave when a spare is ready.
  int spares = 0;
  int max_failures_per_node = 2;
};

// Node 0 sets it as it starts the job's commands (with restarts on): a launcher lost before
// then is a failed start (the others are still preparing: a restart would stop a weights
// wait or a cache seed and spend the budget on a cycle that never ran), lost after it a
// failed cycle.
inline constexpr const char* kRunStartedKey = "bt/run/started";

// The ready barrier's counter (launcher/phases/ready.cpp): every launcher adds 1 once it
// has prepared.
inline constexpr const char* kReadyCounterKey = "bt/ready";

// What the leader concluded, once it has.
struct ServerVerdict {
  enum class Kind { kPending, kResult, kAbort, kJoinTimeout } kind = Kind::kPending;
  int failed_rank = -1;
  std::string message;  // one line naming the failed node and cause, or the missing ranks
  int exit_code = 0;    // kAbort: the failed node's reported exit code; 0 when it was lost
};

// Raises the soft open-file limit to the hard one, and the hard one to `wanted` where the
// process may (root with CAP_SYS_RESOURCE). Returns the soft limit now in force.
size_t RaiseOpenFileLimit(size_t wanted);

// Why the leader could not bind `port` on this host now (every address, as it binds), or
// nullopt when it could. `bt-launch doctor` asks on node 0 before the job starts.
std::optional<std::string> PortUnavailable(uint16_t port);

class StoreServer {
 public:
  // Binds and listens; throws StoreError naming the port and the errno text.
  explicit StoreServer(ServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const { return port_; }
  // Blocks until the verdict is out and every node said goodbye (or the linger passed).
  void WaitUntilDrained();
  ServerVerdict verdict() const;
  // The job was aborted because node 0's own launcher did not run for longer than the
  // heartbeat timeout (stopped, starved): to node 0 that is the leader lost.
  bool StalledItself() const;
  std::vector<NodeInfo> roster() const;  // joined nodes, by rank
  // The same without each node's addresses (rank, host, seen_from, pid): what node 0's own
  // phases need, at a fraction of the copy (2 KiB a node, 32 MB at 16,384 nodes, for roster()).
  std::vector<NodeInfo> brief_roster() const;
  std::vector<int> unreported() const;   // nodes running a rank that have not reported an outcome
  // Training ranks whose launcher is not connected now: lost (closed, or silent past the
  // heartbeat timeout, after which their connection is closed), left, or not joined yet.
  // Without spares a rank is its node's slot.
  std::vector<int> absent() const;
  // The nodes (slots) running a training rank now, in slot order (hot spares run none).
  std::vector<int> nodes_running_ranks() const;
  // The job's nodes now (live metrics): ranks with a connected launcher, ranks without one,
  // and connected launchers running no rank (hot spares).
  struct NodeStates {
    int ready = 0;
    int lost = 0;
    int spare = 0;
  };
  NodeStates node_states() const;
  // Node 0's own reads of its table, in-process (thread-safe): the values now, nullopt for
  // a key not set, as `mget` answers; and a wait until the integer counter `key` is at
  // least `at_least` (true), or `timeout` passed (false). Throws StoreError once stopped.
  std::vector<std::optional<std::string>> Peek(const std::vector<std::string>& keys) const;
  bool WaitCounter(const std::string& key, int64_t at_least, std::chrono::milliseconds timeout);
  void Stop();

 private:
  class Loop;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  uint16_t port_ = 0;
};

}  // namespace bt::rendezvous
