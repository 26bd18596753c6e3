#include "checkpoint/commit_gate.h"

#include <algorithm>

namespace bt::checkpoint {

void CommitGate::EnterCycle(int64_t cycle) {
  std::lock_guard lock(mutex_);
  entered_ = true;
  cycle_ = std::max(cycle_, cycle);
}

std::optional<storage::CommitRecord> CommitGate::Seal(std::chrono::milliseconds wait) {
  std::unique_lock lock(mutex_);
  if (!entered_) return std::nullopt;
  sealed_through_ = std::max(sealed_through_, cycle_);
  if (finished_.wait_for(lock, wait, [&] { return in_flight_.empty(); })) return std::nullopt;
  // Sent out of order (a later save decided first), the newest in flight may be older than
  // one already written: `latest` then names that one and stays.
  const auto& [newest_seq, newest] = *in_flight_.rbegin();
  if (newest_finished_ && *newest_finished_ > newest_seq) return std::nullopt;
  return newest;
}

bool CommitGate::TryBegin(uint64_t seq, int64_t cycle, const storage::CommitRecord& record) {
  std::lock_guard lock(mutex_);
  if (cycle <= sealed_through_) return false;
  in_flight_.insert_or_assign(seq, record);
  return true;
}

void CommitGate::Finished(uint64_t seq) {
  std::lock_guard lock(mutex_);
  if (in_flight_.erase(seq) == 0) return;
  newest_finished_ = std::max(newest_finished_.value_or(seq), seq);
  finished_.notify_all();
}

}  // namespace bt::checkpoint
