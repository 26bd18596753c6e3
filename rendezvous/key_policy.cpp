#include "rendezvous/key_policy.h"

#include <array>
#include <charconv>
#include <algorithm>

namespace bt::rendezvous {
namespace {

// Who writes a key of the launcher's namespace.
enum class Writer {
  kServer,   // the leader's server itself (bt/roster): no connection
  kOwner,    // the node whose rank the key names ({rank} below)
  kTrainer,  // the node that runs the training rank the key names (a spare once it took it)
  kCounter,  // a counter every joined node adds to (the leader alone may set it)
  kCheckpointLeader,  // node 0, or the node running training rank 0: it commits the job's checkpoints
  kCommitState,       // a counter only the checkpoint leader adds to; nobody sets it (rendezvous/commit_keys.h)
};

struct KeyRule {
  std::string_view pattern;  // '/'-separated; "*" is any one segment, "{rank}" and "rank-{rank}" the writer's rank
  Writer writer;
};

// Every key of bt/ that a node other than the leader writes; any other bt/ key is the
// leader's (node 0's). Each phase's keys are named where the phase is (launcher/phases/).
constexpr std::array kRules = {
    KeyRule{"bt/roster", Writer::kServer},
    KeyRule{"bt/ckpt/absent", Writer::kServer},  // rendezvous/commit_keys.h
    KeyRule{"bt/phase/{rank}", Writer::kOwner},
    KeyRule{"bt/ready", Writer::kCounter},
    KeyRule{"bt/fabric/inventory/{rank}", Writer::kOwner},
    KeyRule{"bt/fabric/plan/readers", Writer::kCounter},
    KeyRule{"bt/fabric/published", Writer::kCounter},
    KeyRule{"bt/fabric/probe/ready/{rank}", Writer::kOwner},
    KeyRule{"bt/fabric/probe/result/{rank}", Writer::kOwner},
    KeyRule{"bt/fabric/probe/qp/*/*/{rank}", Writer::kOwner},
    KeyRule{"bt/nccl/gpus/{rank}", Writer::kOwner},
    KeyRule{"bt/nccl/result/{rank}", Writer::kOwner},
    KeyRule{"bt/ckpt/answer/*/rank-{rank}/*", Writer::kTrainer},  // launcher/phases/commit_board.cpp
    KeyRule{"bt/ckpt/launchers/rank-{rank}", Writer::kTrainer},
    KeyRule{"bt/ckpt/declared", Writer::kCheckpointLeader},
    KeyRule{"bt/ckpt/declared/*", Writer::kCheckpointLeader},
    KeyRule{"bt/ckpt/resumed", Writer::kCheckpointLeader},
    KeyRule{"bt/ckpt/outcome/*", Writer::kCheckpointLeader},
    KeyRule{"bt/ckpt/closed", Writer::kCheckpointLeader},
    KeyRule{"bt/ckpt/draining", Writer::kCheckpointLeader},
    KeyRule{"bt/ckpt/commit/*", Writer::kCheckpointLeader},  // rendezvous/commit_keys.h
    KeyRule{"bt/ckpt/commit/*/*", Writer::kCommitState},
    KeyRule{"bt/ckpt/latest", Writer::kCheckpointLeader},
    KeyRule{"bt/hang/*/stacks/{rank}", Writer::kOwner},
    KeyRule{"bt/hang/*/answered", Writer::kCounter},
    KeyRule{"bt/health/node/{rank}", Writer::kOwner},  // launcher/phases/health.cpp
    KeyRule{"bt/health/published", Writer::kCounter},
    KeyRule{"bt/report/lane/{rank}", Writer::kOwner},  // launcher/report/recorder.cpp
};

// The '/'-separated segments of a key or pattern, one at a time ("a/" has two, the second
// empty): the server matches every set and add against the rules on its loop, so nothing
// here allocates.
class Segments {
 public:
  explicit Segments(std::string_view text) : rest_(text) {}
  bool Next(std::string_view& segment) {
    if (done_) return false;
    const size_t slash = rest_.find('/');
    segment = rest_.substr(0, slash);
    done_ = slash == std::string_view::npos;
    rest_.remove_prefix(done_ ? rest_.size() : slash + 1);
    return true;
  }

 private:
  std::string_view rest_;
  bool done_ = false;
};

std::optional<int> ParseRank(std::string_view text) {
  int rank = -1;
  if (text.empty() || text.size() > 9) return std::nullopt;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), rank);
  if (error != std::errc() || end != text.data() + text.size() || rank < 0) return std::nullopt;
  return rank;
}

// Whether `key` has the shape of `pattern`; `owner` gets the rank a {rank} segment names.
bool Matches(std::string_view pattern, std::string_view key, std::optional<int>& owner) {
  Segments wanted(pattern), had(key);
  std::string_view want, have;
  while (wanted.Next(want)) {
    if (!had.Next(have)) return false;
    const size_t placeholder = want.find("{rank}");
    if (placeholder != std::string_view::npos) {
      if (have.substr(0, placeholder) != want.substr(0, placeholder)) return false;
      owner = ParseRank(have.substr(std::min(placeholder, have.size())));
      if (!owner) return false;
    } else if (want != "*" && want != have) {
      return false;
    }
  }
  return !had.Next(have);
}

std::string Quoted(std::string_view key) { return "\"" + std::string(key) + "\""; }

}  // namespace

std::optional<std::string> WriteRefusal(std::string_view key, KeyWrite write, int rank, std::optional<int> training_rank) {
  if (!key.starts_with(kLauncherKeyPrefix)) return std::nullopt;
  if (rank < 0) return "writes " + Quoted(key) + " without having joined: the launcher's keys (" +
                       std::string(kLauncherKeyPrefix) + ") are written by the job's nodes only";
  for (const KeyRule& rule : kRules) {
    std::optional<int> owner;
    if (!Matches(rule.pattern, key, owner)) continue;
    switch (rule.writer) {
      case Writer::kServer:
        return "writes " + Quoted(key) + ", which only the leader's server writes";
      case Writer::kOwner:
        if (write == KeyWrite::kRead || *owner == rank) return std::nullopt;
        return "node " + std::to_string(rank) + " writes " + Quoted(key) + ", which belongs to node " +
               std::to_string(*owner);
      case Writer::kTrainer:
        if (write == KeyWrite::kRead || *owner == training_rank.value_or(rank)) return std::nullopt;
        return "node " + std::to_string(rank) + " writes " + Quoted(key) + ", which belongs to the node running rank " +
               std::to_string(*owner) + (training_rank ? " (it runs " + (*training_rank < 0 ? std::string("none, a spare") : "rank " + std::to_string(*training_rank)) + ")" : "");
      case Writer::kCheckpointLeader:
        if (write == KeyWrite::kRead || rank == 0 || training_rank == 0) return std::nullopt;
        return "node " + std::to_string(rank) + " writes " + Quoted(key) +
               ", which only the checkpoint leader (node 0, or the node running rank 0) writes";
      case Writer::kCommitState:
        if (write == KeyWrite::kRead || (write == KeyWrite::kAdd && (rank == 0 || training_rank == 0))) return std::nullopt;
        return "node " + std::to_string(rank) + (write == KeyWrite::kSet ? " sets " : " adds to ") + Quoted(key) +
               ", a commit's state that only the checkpoint leader adds to";
      case Writer::kCounter:
        if (write != KeyWrite::kSet || rank == 0) return std::nullopt;
        return "node " + std::to_string(rank) + " sets the counter " + Quoted(key) + ", which nodes only add to";
    }
  }
  if (write == KeyWrite::kRead || rank == 0) return std::nullopt;
  return "node " + std::to_string(rank) + " writes " + Quoted(key) + ", which only the leader (node 0) writes";
}

std::optional<std::string> KeySizeRefusal(std::string_view key) {
  if (key.size() <= kMaxKeyBytes) return std::nullopt;
  return "a key of " + std::to_string(key.size()) + " bytes (at most " + std::to_string(kMaxKeyBytes) + ")";
}

std::optional<std::string> ValueSizeRefusal(std::string_view key, size_t value_bytes) {
  if (value_bytes <= kMaxValueBytes) return std::nullopt;
  return "a value of " + std::to_string(value_bytes) + " bytes for " + Quoted(key) + " (at most " +
         std::to_string(kMaxValueBytes) + ")";
}

}  // namespace bt::rendezvous
