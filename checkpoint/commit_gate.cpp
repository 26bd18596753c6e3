#include "checkpoint/commit_gate.h"

#include <algorithm>

namespace bt::checkpoint {

void CommitGate::EnterCycle(int64_t cycle) {
  std::lock_guard lock(mutex_);
  entered_ = true;
  cycle_ = std::max(cycle_, cycle);
}

bool CommitGate::Seal(std::chrono::milliseconds wait) {
  std::unique_lock lock(mutex_);
  if (!entered_) return true;
  sealed_through_ = std::max(sealed_through_, cycle_);
  return finished_.wait_for(lock, wait, [&] { return in_flight_.empty(); });
}

bool CommitGate::TryBegin(uint64_t seq, int64_t cycle) {
  std::lock_guard lock(mutex_);
  if (cycle <= sealed_through_) return false;
  in_flight_.insert(seq);
  return true;
}

void CommitGate::Finished(uint64_t seq) {
  std::lock_guard lock(mutex_);
  if (in_flight_.erase(seq) > 0) finished_.notify_all();
}

}  // namespace bt::checkpoint
