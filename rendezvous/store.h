// The key-value store every node shares during a job, c10d-style: one small interface
// with interchangeable backends (in-process, and the TCP client of node 0's server).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace bt::rendezvous {

// Wait or Get ran past its timeout; what() names the keys still missing.
class StoreTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The store cannot be used any more (connection lost, server gone, rejected).
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A join the leader refused because the job had already ended with every node's success
// (a replaced pod started after the others finished): nothing is left to do.
class JobAlreadySucceeded : public StoreError {
 public:
  using StoreError::StoreError;
};

class Store {
 public:
  virtual ~Store() = default;

  virtual void Set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists, as c10d's get does.
  virtual std::string Get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Blocks until every key exists.
  virtual void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Adds to an integer counter (created at 0) and returns the new value, atomically.
  virtual int64_t Add(const std::string& key, int64_t delta) = 0;
  // The values of `keys` as they are now, nullopt for a key not set: never waits. For
  // progress reports that read many nodes' keys at once (one request, not one a key).
  virtual std::vector<std::optional<std::string>> Peek(const std::vector<std::string>& keys) = 0;

  // Blocks until the integer counter `key` is at least `at_least` (true) or `timeout`
  // passed (false). This default reads the counter every kCounterPoll; node 0's own store
  // waits on its server's table instead, woken by the add that reaches it.
  virtual bool WaitCounter(const std::string& key, int64_t at_least, std::chrono::milliseconds timeout);
  static constexpr std::chrono::milliseconds kCounterPoll{20};

  // Returns once `participants` callers have entered the barrier `name`. Each name is
  // used once per job (the keys are not reset).
  void Barrier(const std::string& name, int64_t participants, std::chrono::milliseconds timeout);
};

std::unique_ptr<Store> MakeMemoryStore();

// The value after adding `delta` to a stored counter (`stored` is null when the key is
// absent). Throws StoreError when the stored value is not an integer. Shared by backends
// so that they agree.
int64_t AddToCounter(const std::string& key, const std::string* stored, int64_t delta);

}  // namespace bt::rendezvous
