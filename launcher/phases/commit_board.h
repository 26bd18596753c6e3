// The cross-node commit over the rendezvous store (keys under bt/ckpt/): what node 0
// declared, what each launcher answered for its rank, which launchers replaced lost ones,
// and node 0's outcomes. It only stores and reads; which answers count and when a save
// commits is the commit rule's (checkpoint/commit_rule.h), which node 0's board feeds.
#pragma once

#include <cstdint>
#include <memory>

#include "checkpoint/agent.h"
#include "rendezvous/store.h"

namespace bt::launcher {

// Set by node 0 once it declared again what the last run left open (FinishResumedDeclarations):
// a follower waits for it before answering (WaitForResumedDeclarations).
inline constexpr const char* kResumedDeclarationsKey = "bt/ckpt/resumed";

// `incarnation`: the cycle this launcher joined the job in (0 from the start; a replacement's
// rejoin cycle). A replacement registers itself, so that node 0's rule takes its
// predecessor's open saves as lost and never hears the predecessor again.
std::unique_ptr<checkpoint::CommitBoard> MakeStoreCommitBoard(rendezvous::Store& store, int node_count, int node_rank,
                                                              int64_t incarnation = 0);

}  // namespace bt::launcher
