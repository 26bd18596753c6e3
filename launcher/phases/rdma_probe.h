// The opt-in RDMA probe (launcher.fabric.probe: ring or all-pairs; docs/FABRIC.md): RC
// queue pairs between node pairs on every rail, connection data through the store, an
// RDMA-write ping-pong, and a latency table at node 0. Without RDMA hardware, or without
// the verbs plugin, it is SKIPPED with the reason on every node, never passed.
#pragma once

#include "env/identity.h"
#include "env/job_config.h"
#include "launcher/phases/fabric.h"
#include "launcher/supervision/peers.h"

namespace bt::launcher {

// Throws LaunchFailure 69 naming both nodes, both devices and the failed verbs step.
void RunRdmaProbe(const env::JobConfig& config, const env::NodeIdentity& identity, Peers* peers,
                  const FabricResult& fabric);

// Adds each port's active MTU (ibv_query_port) when the node has verbs devices and the
// plugin loads; otherwise leaves it unknown.
void AddActiveMtu(rendezvous::fabric::Inventory& inventory);

// The node pairs probed, in the order every node runs them (lower rank first in a pair).
std::vector<std::pair<int, int>> ProbePairs(env::FabricProbe probe, int node_count);

}  // namespace bt::launcher
