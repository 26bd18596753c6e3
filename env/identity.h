// Which node this process is: rank, node count and leader address, each taken from the
// highest-precedence source that provides it (flags, BT_*, Open MPI/PMIx, Slurm,
// Kubernetes, else a single node).
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace bt::env {

// The most nodes one job may have: far above the largest real training job (thousands of
// nodes), and low enough that a typo such as 2147483647 is refused before node 0 sizes its
// roster and connection tables by it.
inline constexpr int kMaxNodeCount = 1 << 16;

// Reads one environment variable; nullopt when unset. Tests pass a map instead of getenv.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup ProcessEnvLookup();

struct IdentityFlags {
  std::optional<std::string> node_rank;
  std::optional<std::string> node_count;
  std::optional<std::string> leader_addr;
};

// With hot spares (launcher.spares) `rank` is the launcher's slot and `count` every
// launcher's; the training ranks are 0..training_count()-1, and the slot that runs each can
// change at a restart (docs/SPARES.md).
struct NodeIdentity {
  int rank = 0;
  int count = 1;
  std::string leader_addr;  // "127.0.0.1" for a single node
  std::string rank_source;
  std::string count_source;
  std::string leader_source;
  bool under_mpi = false;  // started by mpirun: MPI variables must not reach the job
  int spares = 0;          // launcher.spares: the last `spares` slots start as hot spares

  int training_count() const { return count - spares; }

  std::string Describe() const;
};

// Bad identity input; `what()` names the source and the value. Exit 65.
class IdentityError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `config_node_count` is compute.node_count: a count from any source must agree with it.
// nullopt (no config given) means any count goes, one node when no source says.
// `spares` (launcher.spares): that many launchers beyond compute.node_count, counted by
// every source as launchers are.
NodeIdentity ResolveIdentity(const IdentityFlags& flags, const EnvLookup& env, std::optional<int> config_node_count,
                             int spares = 0);

// Expands a Slurm hostlist such as "gpu[01-03,07],cpu5" into host names, in order.
std::vector<std::string> ExpandSlurmHostlist(const std::string& hostlist);

}  // namespace bt::env
