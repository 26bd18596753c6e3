#include "env/identity.h"

#include <charconv>
#include <cstdlib>

namespace bt::env {
namespace {

// One source's view of the identity; any field may be missing.
struct Candidate {
  std::string source;
  std::optional<std::string> rank;
  std::optional<std::string> count;
  std::optional<std::string> leader;
};

int ParseNonNegative(const std::string& text, const std::string& what) {
  int value = -1;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < 0) {
    throw IdentityError(what + ": expected a non-negative integer, got \"" + text + "\"");
  }
  return value;
}

Candidate FromFlags(const IdentityFlags& flags) {
  return {"flags", flags.node_rank, flags.node_count, flags.leader_addr};
}

Candidate FromBaseten(const EnvLookup& env) {
  return {"BT_* environment", env("BT_NODE_RANK"), env("BT_GROUP_SIZE"), env("BT_LEADER_ADDR")};
}

// mpirun starts every rank with OMPI_COMM_WORLD_*; PMIx launchers set PMIX_RANK. When
// every rank is on this host, the leader is reachable on loopback.
Candidate FromOpenMpi(const EnvLookup& env) {
  Candidate candidate{"Open MPI", env("OMPI_COMM_WORLD_RANK"), env("OMPI_COMM_WORLD_SIZE"), std::nullopt};
  if (!candidate.rank) {
    candidate.rank = env("PMIX_RANK");
    if (candidate.rank) candidate.source = "PMIx";
  }
  auto local_size = env("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (local_size && candidate.count && *local_size == *candidate.count) candidate.leader = "127.0.0.1";
  return candidate;
}

// Rank and count are the step's (SLURM_NODEID, SLURM_NNODES), so the leader must be the
// step's first node too: a step on nodes 3-4 of an allocation (`srun -N2 --relative=2`)
// has none of the job list's first node. SLURM_NODELIST is also the job's list (22.05).
Candidate FromSlurm(const EnvLookup& env) {
  Candidate candidate{"Slurm", env("SLURM_NODEID"), env("SLURM_NNODES"), std::nullopt};
  if (!candidate.count) candidate.count = env("SLURM_JOB_NUM_NODES");
  auto nodelist = env("SLURM_STEP_NODELIST");
  if (!nodelist) nodelist = env("SLURM_JOB_NODELIST");
  if (!nodelist) nodelist = env("SLURM_NODELIST");
  if (candidate.rank && nodelist) {
    auto hosts = ExpandSlurmHostlist(*nodelist);
    if (!hosts.empty()) candidate.leader = hosts.front();
  }
  return candidate;
}

// bt-launch is one task per node: it starts the per-GPU workers itself. A second task on a
// node would serve or join the rendezvous as a second copy of its rank, which fails later
// in ways that do not name the cause (port in use, rendezvous closed, a join timeout).
// srun does this whenever the allocation asked for more tasks per node (the usual GPU
// script's --ntasks-per-node=8), so say it at once.
void RequireOneSlurmTaskPerNode(const EnvLookup& env) {
  auto tasks = env("SLURM_STEP_NUM_TASKS");
  auto nodes = env("SLURM_STEP_NUM_NODES");
  if (!tasks || !nodes) {
    tasks = env("SLURM_NTASKS");
    nodes = env("SLURM_NNODES");
  }
  auto local_id = env("SLURM_LOCALID");
  const bool extra_tasks = tasks && nodes && ParseNonNegative(*tasks, "SLURM_NTASKS") > ParseNonNegative(*nodes, "SLURM_NNODES");
  const bool second_on_node = local_id && ParseNonNegative(*local_id, "SLURM_LOCALID") > 0;
  if (!extra_tasks && !second_on_node) return;
  throw IdentityError("srun started " + tasks.value_or("?") + " tasks on " + nodes.value_or("?") +
                      " nodes (SLURM_LOCALID " + local_id.value_or("?") +
                      "), but bt-launch runs once per node and starts the per-GPU workers itself: "
                      "run it with `srun --ntasks-per-node=1` (or -n equal to -N)");
}

// LeaderWorkerSet names its leader and size; an Indexed Job gives only the index.
Candidate FromKubernetes(const EnvLookup& env) {
  if (auto worker = env("LWS_WORKER_INDEX")) {
    return {"Kubernetes LeaderWorkerSet", worker, env("LWS_GROUP_SIZE"), env("LWS_LEADER_ADDRESS")};
  }
  return {"Kubernetes Indexed Job", env("JOB_COMPLETION_INDEX"), std::nullopt, std::nullopt};
}

bool IsMpiLaunched(const EnvLookup& env) {
  return env("OMPI_COMM_WORLD_RANK") || env("PMIX_RANK") || env("PMI_RANK");
}

}  // namespace

EnvLookup ProcessEnvLookup() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

std::string NodeIdentity::Describe() const {
  if (spares > 0) {
    return "node " + std::to_string(rank) + " of " + std::to_string(count) + " launchers, " + std::to_string(spares) +
           " of them spares (" + (rank >= count - spares ? "this one a spare" : "this one training rank " + std::to_string(rank)) +
           "; rank from " + rank_source + ", count from " + count_source + "), leader " + leader_addr + " (from " +
           leader_source + ")";
  }
  return "node " + std::to_string(rank) + " of " + std::to_string(count) + " (rank from " + rank_source +
         ", count from " + count_source + "), leader " + leader_addr + " (from " + leader_source + ")";
}

NodeIdentity ResolveIdentity(const IdentityFlags& flags, const EnvLookup& env, std::optional<int> config_node_count,
                             int spares) {
  // An empty variable counts as unset: container specs often declare them empty.
  EnvLookup present = [&env](const std::string& name) -> std::optional<std::string> {
    auto value = env(name);
    if (value && value->empty()) return std::nullopt;
    return value;
  };
  const std::vector<Candidate> candidates = {FromFlags(flags), FromBaseten(present), FromOpenMpi(present),
                                             FromSlurm(present), FromKubernetes(present)};
  std::optional<std::pair<std::string, std::string>> rank, count, leader;
  for (const Candidate& candidate : candidates) {
    if (!rank && candidate.rank) rank = {*candidate.rank, candidate.source};
    if (!count && candidate.count) count = {*candidate.count, candidate.source};
    if (!leader && candidate.leader) leader = {*candidate.leader, candidate.source};
  }

  if (rank && rank->second == "Slurm") RequireOneSlurmTaskPerNode(present);

  NodeIdentity identity;
  identity.under_mpi = IsMpiLaunched(present);
  identity.rank = rank ? ParseNonNegative(rank->first, "node rank from " + rank->second) : 0;
  identity.rank_source = rank ? rank->second : "default (single node)";
  identity.spares = spares;
  // Every launcher counts, spares included: what the orchestrator started (its completions,
  // srun -N, mpirun -np).
  const std::optional<int> launchers = config_node_count ? std::optional<int>(*config_node_count + spares) : std::nullopt;
  identity.count = count ? ParseNonNegative(count->first, "node count from " + count->second) : launchers.value_or(1);
  identity.count_source = count ? count->second : (rank && config_node_count ? "compute.node_count" : "default (single node)");
  if (identity.count < 1) throw IdentityError("node count from " + identity.count_source + " must be at least 1");
  if (identity.count > kMaxNodeCount) {
    throw IdentityError("node count " + std::to_string(identity.count) + " from " + identity.count_source +
                        " is above the limit of " + std::to_string(kMaxNodeCount) + " nodes");
  }
  if (!rank && !count && config_node_count.value_or(1) > 1) {
    throw IdentityError("compute.node_count is " + std::to_string(*config_node_count) +
                        " but no node identity was found (give --node-rank/--node-count/--leader-addr, "
                        "BT_NODE_RANK/BT_GROUP_SIZE/BT_LEADER_ADDR, or start under mpirun, Slurm or Kubernetes)");
  }
  if (config_node_count && identity.count != *launchers) {
    const std::string expected = spares == 0 ? "compute.node_count " + std::to_string(*config_node_count)
                                             : "compute.node_count " + std::to_string(*config_node_count) +
                                                   " + launcher.spares " + std::to_string(spares) + " = " +
                                                   std::to_string(*launchers) + " launchers";
    throw IdentityError("node count " + std::to_string(identity.count) + " from " + identity.count_source +
                        " disagrees with " + expected);
  }
  if (identity.count <= spares) {
    throw IdentityError("node count " + std::to_string(identity.count) + " from " + identity.count_source +
                        " leaves no training node beside launcher.spares " + std::to_string(spares));
  }
  if (identity.rank >= identity.count) {
    throw IdentityError("node rank " + std::to_string(identity.rank) + " from " + identity.rank_source +
                        " is outside [0, " + std::to_string(identity.count) + ")");
  }
  if (leader) {
    identity.leader_addr = leader->first;
    identity.leader_source = leader->second;
  } else if (identity.count == 1) {
    identity.leader_addr = "127.0.0.1";
    identity.leader_source = "default (single node)";
  } else {
    throw IdentityError("a " + std::to_string(identity.count) +
                        "-node job needs a leader address: give --leader-addr or BT_LEADER_ADDR");
  }
  return identity;
}

std::vector<std::string> ExpandSlurmHostlist(const std::string& hostlist) {
  // Split on commas that are outside brackets, then expand each bracket group in turn.
  std::vector<std::string> items;
  std::string current;
  int depth = 0;
  for (char c : hostlist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) throw IdentityError("Slurm hostlist \"" + hostlist + "\": unmatched ']'");
    if (c == ',' && depth == 0) {
      if (!current.empty()) items.push_back(current);
      current.clear();
      continue;
    }
    current += c;
  }
  if (depth != 0) throw IdentityError("Slurm hostlist \"" + hostlist + "\": unmatched '['");
  if (!current.empty()) items.push_back(current);

  std::vector<std::string> hosts;
  for (const std::string& item : items) {
    auto open = item.find('[');
    if (open == std::string::npos) {
      hosts.push_back(item);
      continue;
    }
    auto close = item.find(']', open);
    const std::string prefix = item.substr(0, open);
    const std::string ranges = item.substr(open + 1, close - open - 1);
    const std::string suffix = item.substr(close + 1);
    size_t start = 0;
    while (start <= ranges.size()) {
      size_t comma = ranges.find(',', start);
      std::string range = ranges.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      auto dash = range.find('-');
      std::string low = range.substr(0, dash);
      std::string high = dash == std::string::npos ? low : range.substr(dash + 1);
      int from = ParseNonNegative(low, "Slurm hostlist \"" + hostlist + "\" range");
      int to = ParseNonNegative(high, "Slurm hostlist \"" + hostlist + "\" range");
      if (to < from || to - from > 1'000'000) {
        throw IdentityError("Slurm hostlist \"" + hostlist + "\": bad range \"" + range + "\"");
      }
      for (int n = from; n <= to; ++n) {
        std::string number = std::to_string(n);
        if (number.size() < low.size()) number.insert(0, low.size() - number.size(), '0');  // keep zero padding
        for (const std::string& tail : ExpandSlurmHostlist(suffix.empty() ? "" : suffix)) {
          hosts.push_back(prefix + number + tail);
        }
        if (suffix.empty()) hosts.push_back(prefix + number);
      }
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return hosts;
}

}  // namespace bt::env
