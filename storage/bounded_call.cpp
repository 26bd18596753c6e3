#include "storage/bounded_call.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace bt::storage {

bool FinishesWithin(std::chrono::milliseconds bound, std::function<void()> call) {
  struct Done {
    std::mutex mutex;
    std::condition_variable changed;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  std::thread([done, call = std::move(call)] {
    try {
      call();
    } catch (...) {
      // The call's own: it reports through what it captured.
    }
    std::lock_guard lock(done->mutex);
    done->done = true;
    done->changed.notify_all();
  }).detach();
  std::unique_lock lock(done->mutex);
  return done->changed.wait_for(lock, bound, [&] { return done->done; });
}

}  // namespace bt::storage
