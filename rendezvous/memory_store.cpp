#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "rendezvous/store.h"

namespace bt::rendezvous {
namespace {

// All callers in one process share one map; waiting is a condition variable.
class MemoryStore final : public Store {
 public:
  void Set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard lock(mutex_);
      values_[key] = value;
    }
    changed_.notify_all();
  }

  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override {
    Wait({key}, timeout);
    std::lock_guard lock(mutex_);
    return values_.at(key);
  }

  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mutex_);
    auto all_present = [&] {
      for (const auto& key : keys) {
        if (!values_.contains(key)) return false;
      }
      return true;
    };
    if (changed_.wait_for(lock, timeout, all_present)) return;
    std::string missing;
    for (const auto& key : keys) {
      if (!values_.contains(key)) missing += (missing.empty() ? "" : ", ") + key;
    }
    throw StoreTimeout("timed out after " + std::to_string(timeout.count()) + " ms waiting for " + missing);
  }

  int64_t Add(const std::string& key, int64_t delta) override {
    int64_t value = 0;
    {
      std::lock_guard lock(mutex_);
      auto it = values_.find(key);
      value = AddToCounter(key, it == values_.end() ? nullptr : &it->second, delta);
      values_[key] = std::to_string(value);
    }
    changed_.notify_all();
    return value;
  }

  std::vector<std::optional<std::string>> Peek(const std::vector<std::string>& keys) override {
    std::lock_guard lock(mutex_);
    std::vector<std::optional<std::string>> values;
    for (const auto& key : keys) {
      auto it = values_.find(key);
      values.push_back(it == values_.end() ? std::nullopt : std::optional<std::string>(it->second));
    }
    return values;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

}  // namespace

int64_t AddToCounter(const std::string& key, const std::string* stored, int64_t delta) {
  if (stored == nullptr) return delta;
  try {
    size_t used = 0;
    int64_t value = std::stoll(*stored, &used);
    if (used == stored->size()) return value + delta;
  } catch (const std::exception&) {
  }
  throw StoreError("add on key \"" + key + "\": its value is not an integer");
}

bool Store::WaitCounter(const std::string& key, int64_t at_least, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (Add(key, 0) < at_least) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= std::chrono::milliseconds(0)) return false;
    std::this_thread::sleep_for(std::min(left, kCounterPoll));
  }
  return true;
}

void Store::Barrier(const std::string& name, int64_t participants, std::chrono::milliseconds timeout) {
  const std::string done_key = "barrier/" + name + "/done";
  if (Add("barrier/" + name + "/count", 1) == participants) Set(done_key, "1");
  Wait({done_key}, timeout);
}

std::unique_ptr<Store> MakeMemoryStore() { return std::make_unique<MemoryStore>(); }

}  // namespace bt::rendezvous
