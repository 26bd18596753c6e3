// The checkpoint phases of a run (DESIGN.md §1): loading checkpoints before the start
// commands, the agent that watches and hands off while they run, and the drain after; and
// the listing behind `bt-launch checkpoints` (tools/commands.h), which reads and verifies
// manifests exactly as the load does.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "checkpoint/agent.h"
#include "env/environment.h"
#include "env/identity.h"
#include "env/job_config.h"
#include "launcher/cli.h"
#include "launcher/supervision/supervisor.h"
#include "rendezvous/store.h"
#include "storage/commit_record.h"
#include "storage/destination.h"

namespace bt::launcher {

// BT_CHECKPOINT_DESTINATION, else launcher.checkpoint.destination, else a directory
// beside the job (file://<root>/var/lib/bt-launch/checkpoints). Credentials from the
// launcher.checkpoint.auth_secret_name secret, else the standard variables, into rclone's
// environment only. Throws LaunchFailure(65).
storage::DestinationSpec ResolveCheckpointDestination(const env::JobConfig& config,
                                                         const env::JobEnvironment& environment,
                                                         const std::optional<std::string>& root,
                                                         const std::optional<std::string>& uri_override = std::nullopt);

// Empties BT_LOAD_CHECKPOINT_DIR/rank-<r>/ before the launcher loads into it: what an earlier
// job on this volume loaded there (a Slurm node's /tmp, a reused root) must not lie beside
// what this job loads. Only then: a job that loads nothing leaves the directory (perhaps the
// user's) alone. Logged when something was there.
void ClearEarlierLoads(const env::JobEnvironment& environment, int node_rank);

// Each load_checkpoint_config reference, this node's part, into
// BT_LOAD_CHECKPOINT_DIR/rank-<r>/, verified against its manifest, with its progress logged;
// a commit whose record lists no part for this node (only rank 0 saved) leaves rank-<r>/
// empty. Throws LaunchFailure(74); `check_stop` runs at least once a second during a
// download and throws to stop it (its partial files are removed).
void LoadCheckpoints(const env::JobConfig& config, const env::JobEnvironment& environment,
                     const storage::DestinationSpec& destination, int node_rank,
                     const std::function<void()>& check_stop);

// This job's newest commit (the record its `latest` pointer names), nullopt when it has none.
// A read the destination fails is tried again twice (`check_stop` called while it waits);
// then LaunchFailure(74): a job that checkpoints never starts from scratch because its
// destination could not be read for a moment (it would train again what it had committed).
std::optional<storage::CommitRecord> ReadLatestCommitted(const storage::DestinationSpec& destination,
                                                         const std::string& job_id,
                                                         const std::function<void()>& check_stop);

// This job's own commit `commit` (a restart, a retried job), this node's part, exactly the
// version the record names, into BT_LOAD_CHECKPOINT_DIR/rank-<r>/, emptied first so that
// nothing of an earlier load lies beside it (and left empty when the record lists no part
// for this node). Files this node still holds unchanged under BT_CHECKPOINT_DIR are
// hard-linked, not downloaded. A transfer the destination failed is tried again twice, with
// `check_stop` called while it waits. Throws LaunchFailure(74).
void LoadOwnCheckpoint(const env::JobEnvironment& environment, const storage::DestinationSpec& destination, int node_rank,
                       const storage::CommitRecord& commit, const std::function<void()>& check_stop = [] {});

// The agent and the cross-node commit it uses; empty when checkpointing is off.
struct CheckpointPhase {
  std::unique_ptr<checkpoint::CommitBoard> board;
  std::unique_ptr<checkpoint::CheckpointAgent> agent;
};

// `store` is the rendezvous store (null for one node, or for the mpi backend); a follower
// waits on it for node 0's resumed saves (up to 20 s), calling `check_stop`, which throws.
// `incarnation`: the cycle this launcher joined the job in (a replacement's rejoin cycle, else
// 0; AgentOptions::incarnation). `on_latest` (node 0 with restarts on): each commit `latest`
// was moved to, on the agent's thread. `serves_the_store`: this launcher is node 0's; rank 0
// elsewhere (a spare took it) commits through the store (AgentOptions::commits_through_board).
CheckpointPhase StartCheckpoints(const env::JobConfig& config, const env::JobEnvironment& environment,
                                 const storage::DestinationSpec& destination, const env::NodeIdentity& identity,
                                 rendezvous::Store* store, const std::function<void()>& check_stop,
                                 int64_t incarnation = 0,
                                 std::function<void(const storage::CommitRecord&)> on_latest = nullptr,
                                 std::shared_ptr<checkpoint::CommitGate> commit_gate = nullptr,
                                 std::function<std::vector<int>()> absent_ranks = nullptr, bool serves_the_store = true);

// Commits what is complete within launcher.checkpoint.drain_timeout_s (on a follower that
// `leader_loss` says is cut off from node 0: only its own uploads, within its bound). Returns
// false (after one error line naming the checkpoint and the reason) when the last complete
// checkpoint was not committed.
bool DrainCheckpoints(CheckpointPhase& phase, const env::JobConfig& config, const JobOutcome& outcome,
                      checkpoint::LeaderLoss leader_loss = {});

// `bt-launch checkpoints` (CheckpointsSubcommand): committed checkpoints per rank; --verify
// re-hashes them, with the load's comparison against the manifest.
int ListCheckpoints(const env::JobConfig& config, const env::JobEnvironment& environment, const CliOptions& cli);

}  // namespace bt::launcher
