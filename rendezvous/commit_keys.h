// The store keys by which a checkpoint leader that is not node 0's launcher (training rank 0
// moved to a hot spare, docs/SPARES.md) tells node 0's restart decision about its commits.
// In-process, node 0's agent and its decision share a checkpoint::CommitGate; across
// processes the same gate is a small state machine per declaration in node 0's table, which
// only the server's thread changes, so the leader's step and the decision's seal are each
// one atomic store operation:
//
//   bt/ckpt/commit/<declaration>          the commit record the leader is about to write
//                                         ({"cycle": c, "record": "<record text>"}), set first
//   bt/ckpt/commit/<declaration>/state    a counter: the leader adds 1 to begin (1: on its
//                                         way) and 1 once written (2); a restart's decision
//                                         adds kCommitSealed to every state of a save of the
//                                         failed cycle or before: a leader whose begin reads
//                                         kCommitSealed or more never writes that commit, and a
//                                         state that read 1 is on its way, and named
//   bt/ckpt/latest                        {"declaration": n, "record": "<record text>"}: the
//                                         commit `latest` names, set by the leader once written
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

namespace bt::rendezvous {

inline constexpr const char* kCommitLatestKey = "bt/ckpt/latest";
// The leader's declaration counter (launcher/phases/commit_board.cpp): how many there are.
inline constexpr const char* kCommitDeclaredKey = "bt/ckpt/declared";
// The training ranks whose launcher is gone now (a JSON array): answered by the server itself
// to a Peek, never stored. A save still missing such a rank's answer can never commit.
inline constexpr const char* kAbsentRanksKey = "bt/ckpt/absent";
inline constexpr int64_t kCommitSealed = int64_t(1) << 40;

std::string CommitProposalKey(uint64_t declaration);
std::string CommitStateKey(uint64_t declaration);

// What the leader told node 0's table about its commits, as a restart's decision reads it
// after sealing: record texts, nullopt where none.
struct RemoteCommits {
  std::optional<std::string> latest;      // the record `latest` names now
  std::optional<std::string> on_its_way;  // the newest commit begun and not written, when newer than `latest`
};

// On the server's thread, before a restart's decision: seals every commit of `cycle` and
// before that has not begun (it never will), and returns what is committed and on its way.
// `declared` is the job's declaration count (bt/ckpt/declared). Values the leader wrote
// that do not parse are skipped: they name no commit the decision could resume from.
RemoteCommits SealRemoteCommits(std::unordered_map<std::string, std::string>& table, int64_t cycle, int64_t declared);

}  // namespace bt::rendezvous
