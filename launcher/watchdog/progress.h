// When this node's job last showed progress: output it wrote, its heartbeat file touched,
// a checkpoint it saved. Written by whatever sees the progress (the output relay's
// threads, the checkpoint watcher), read by the watchdog: lock-free, one steady-clock
// time in nanoseconds.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace bt::launcher::watchdog {

class Progress {
 public:
  using Clock = std::chrono::steady_clock;

  // Something happened now.
  void Note() { Note(Clock::now()); }
  void Note(Clock::time_point when) {
    const int64_t ticks = when.time_since_epoch().count();
    int64_t seen = last_.load(std::memory_order_relaxed);
    // Never backwards: threads may note out of order.
    while (ticks > seen && !last_.compare_exchange_weak(seen, ticks, std::memory_order_relaxed)) {
    }
  }
  // The latest progress, or nullopt-like Clock::time_point{} when none since Reset.
  Clock::time_point last() const { return Clock::time_point(Clock::duration(last_.load(std::memory_order_relaxed))); }
  bool seen() const { return last_.load(std::memory_order_relaxed) != 0; }
  // A new cycle starts with no progress seen.
  void Reset() { last_.store(0, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> last_{0};
};

}  // namespace bt::launcher::watchdog
