// The store keys by which a checkpoint leader that is not node 0's launcher (training rank 0
// moved to a hot spare, docs/SPARES.md) tells node 0's restart decision about its commits.
// In-process, node 0's agent and its decision share a checkpoint::CommitGate; across
// processes the same gate lives in node 0's table, which only the server's thread changes,
// so the leader's begin and the decision's seal are each one atomic step there:
//
//   bt/ckpt/commit/<n>            {"cycle": c, "record": "<record text>"}: the commit of
//                                 declaration n, a save of cycle c, the leader is about to write
//   bt/ckpt/commit/<n>/<c>        its state, a counter (added to, never set): the leader adds 1
//                                 to begin (1: on its way), reads it again before each try to
//                                 write (still 1), and adds 1 once written (2). Once a restart's
//                                 decision sealed cycle c, the server creates such a counter at
//                                 kCommitSealed (BornSealed): a begin that reads more than 1
//                                 never writes; a lost leader's begun ones are revoked
//   bt/ckpt/latest                {"declaration": n, "record": "<record text>"}: the commit
//                                 `latest` names, set by the leader once written, before its
//                                 state reads 2
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace bt::rendezvous {

inline constexpr const char* kCommitLatestKey = "bt/ckpt/latest";
// The leader's declaration counter (launcher/phases/commit_board.cpp): how many there are.
inline constexpr const char* kCommitDeclaredKey = "bt/ckpt/declared";
// The training ranks whose launcher is gone now (a JSON array): answered by the server itself
// to a Peek, never stored. A save still missing such a rank's answer can never commit.
inline constexpr const char* kAbsentRanksKey = "bt/ckpt/absent";
inline constexpr int64_t kCommitSealed = int64_t(1) << 40;
// The cycle from which the launcher running rank 0 now may begin commits (a number): set when
// the one before it stopped committing. Node 0 sets it once its hand-over ended; the server
// when it settled a leader on a spare that left. A new leader waits for it, so that no commit
// of its own is written before the last of its predecessor's (`latest` would move back).
inline constexpr const char* kHandedOverKey = "bt/ckpt/handed_over";

std::string CommitProposalKey(uint64_t declaration);
std::string CommitStateKey(uint64_t declaration, int64_t cycle);
// The leader's declaration `n` ({"name","save","cycle",...}) and its outcome (a counter: 1
// committed, 2 abandoned; launcher/phases/commit_board.cpp).
std::string DeclarationKey(uint64_t declaration);
std::string OutcomeKey(uint64_t declaration);
inline constexpr int64_t kOutcomeCommitted = 1;
inline constexpr int64_t kOutcomeAbandoned = 2;

// Whether `key` is the state of a commit of a cycle up to `sealed_through`: created by an add,
// it starts at kCommitSealed instead of 0.
bool BornSealed(std::string_view key, int64_t sealed_through);

// What the leader told node 0's table about its commits, as a restart's decision reads it
// after sealing: record texts, nullopt where none.
struct RemoteCommits {
  std::optional<std::string> latest;      // the record `latest` names now
  std::optional<std::string> on_its_way;  // the newest commit begun and not written, when newer than `latest`
};

// On the server's thread, when the launcher running rank 0 was lost: nothing it declared of
// `cycle` or before can commit any more. Every commit it began and had not written is revoked
// (its state made more than 1), so that its uploader, should that launcher come back, never
// writes it (CommitStillBegun), and no decision names a commit that may never be written; and
// every such save without an outcome gets one (committed when its commit was written,
// abandoned otherwise), so that no follower's drain waits for an outcome nobody would set.
// Only that launcher's own saves are settled: those of `since` (the cycle it took rank 0 in)
// to `cycle`. An earlier leader's (node 0's, whose agent still writes what it had begun) are
// that leader's to settle.
void SettleLostLeadersSaves(std::unordered_map<std::string, std::string>& table, int64_t since, int64_t cycle,
                            int64_t declared);

// The leader before the one of `cycle` writes nothing more: kHandedOverKey says so. It only
// ever rises (a later word about an earlier cycle must not hold the current leader back).
void MarkHandedOver(std::unordered_map<std::string, std::string>& table, int64_t cycle);

// The cycle in kHandedOverKey (node 0's Set, or the table's value); nullopt for text that is not one.
std::optional<int64_t> HandedOverCycle(std::string_view text);

// On the server's thread, once a restart's decision sealed cycle `cycle` (and every one
// before): what is committed and what is on its way. `declared` is the job's declaration
// count (kCommitDeclaredKey). Values that do not parse are skipped: they name no commit the
// decision could resume from.
RemoteCommits ReadRemoteCommits(const std::unordered_map<std::string, std::string>& table, int64_t cycle,
                                int64_t declared);

}  // namespace bt::rendezvous
