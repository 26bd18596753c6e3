// Every test runs against every Store backend.
#include "rendezvous/store.h"

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "rendezvous/client.h"
#include "rendezvous/server.h"

namespace bt::rendezvous {
namespace {

using namespace std::chrono_literals;

// Hands out stores that all see the same data, as the nodes of one job do.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual Store& Shared() = 0;                      // one store for single-threaded checks
  virtual std::unique_ptr<Store> NewHandle() = 0;   // a further participant
};

class MemoryBackend : public Backend {
 public:
  MemoryBackend() : store_(MakeMemoryStore()) {}
  Store& Shared() override { return *store_; }
  // In-process participants share the one table.
  std::unique_ptr<Store> NewHandle() override { return std::make_unique<Forwarding>(*store_); }

 private:
  class Forwarding : public Store {
   public:
    explicit Forwarding(Store& target) : target_(target) {}
    void Set(const std::string& k, const std::string& v) override { target_.Set(k, v); }
    std::string Get(const std::string& k, std::chrono::milliseconds t) override { return target_.Get(k, t); }
    void Wait(const std::vector<std::string>& k, std::chrono::milliseconds t) override { target_.Wait(k, t); }
    int64_t Add(const std::string& k, int64_t d) override { return target_.Add(k, d); }
    std::vector<std::optional<std::string>> Peek(const std::vector<std::string>& k) override { return target_.Peek(k); }

   private:
    Store& target_;
  };
  std::unique_ptr<Store> store_;
};

class TcpBackend : public Backend {
 public:
  TcpBackend() : server_(ServerOptions{0, "token", 1, 60s, 200ms, 5s, 1s}), shared_(NewHandle()) {}
  Store& Shared() override { return *shared_; }
  std::unique_ptr<Store> NewHandle() override {
    return StoreClient::Connect(ClientOptions{"127.0.0.1", server_.port(), "token", 10s, 200ms, 5s, -1});
  }

 private:
  StoreServer server_;
  std::unique_ptr<Store> shared_;
};

template <typename T>
class StoreTest : public ::testing::Test {
 protected:
  T backend_;
};

using Backends = ::testing::Types<MemoryBackend, TcpBackend>;
class BackendNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, MemoryBackend> ? "memory" : "tcp";
  }
};
TYPED_TEST_SUITE(StoreTest, Backends, BackendNames);

TYPED_TEST(StoreTest, SetThenGet) {
  Store& store = this->backend_.Shared();
  store.Set("a", "1");
  store.Set("binary", std::string("\0\x01\xff", 3));
  EXPECT_EQ(store.Get("a", 1s), "1");
  EXPECT_EQ(store.Get("binary", 1s), std::string("\0\x01\xff", 3));
  store.Set("a", "2");
  EXPECT_EQ(store.Get("a", 1s), "2");
}

TYPED_TEST(StoreTest, GetBlocksUntilAnotherParticipantSets) {
  auto other = this->backend_.NewHandle();
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    other->Set("late", "here");
  });
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(this->backend_.Shared().Get("late", 5s), "here");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 90ms);
  setter.join();
}

TYPED_TEST(StoreTest, PeekReadsManyKeysAtOnceWithoutWaiting) {
  Store& store = this->backend_.Shared();
  std::vector<std::string> keys;
  for (int i = 0; i < 2500; ++i) {  // more than one request's worth (kMaxPeekKeys)
    keys.push_back("peek/" + std::to_string(i));
    if (i % 2 == 0) store.Set(keys.back(), std::to_string(i));
  }
  auto start = std::chrono::steady_clock::now();
  const auto values = store.Peek(keys);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "a missing key must not be waited for";
  ASSERT_EQ(values.size(), keys.size());
  for (int i = 0; i < 2500; ++i) {
    if (i % 2 == 0) {
      EXPECT_EQ(values[size_t(i)], std::to_string(i));
    } else {
      EXPECT_FALSE(values[size_t(i)].has_value()) << i;
    }
  }
}

TYPED_TEST(StoreTest, WaitTimesOutNamingTheMissingKeys) {
  Store& store = this->backend_.Shared();
  store.Set("present", "x");
  try {
    store.Wait({"present", "absent-1", "absent-2"}, 200ms);
    FAIL();
  } catch (const StoreTimeout& error) {
    std::string message = error.what();
    EXPECT_NE(message.find("absent-1"), std::string::npos) << message;
    EXPECT_NE(message.find("absent-2"), std::string::npos) << message;
    EXPECT_EQ(message.find("present"), std::string::npos) << message;
  }
  EXPECT_THROW(store.Get("never", 100ms), StoreTimeout);
}

TYPED_TEST(StoreTest, StoreStaysUsableAfterATimeout) {
  Store& store = this->backend_.Shared();
  EXPECT_THROW(store.Get("k", 50ms), StoreTimeout);
  store.Set("k", "v");
  EXPECT_EQ(store.Get("k", 1s), "v");
}

TYPED_TEST(StoreTest, AddIsAtomicAcrossParticipants) {
  constexpr int kParticipants = 8, kAdds = 200;
  std::vector<std::thread> threads;
  for (int i = 0; i < kParticipants; ++i) {
    threads.emplace_back([&] {
      auto store = this->backend_.NewHandle();
      for (int j = 0; j < kAdds; ++j) store->Add("counter", 1);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(this->backend_.Shared().Add("counter", 0), kParticipants * kAdds);
  EXPECT_EQ(this->backend_.Shared().Add("counter", -5), kParticipants * kAdds - 5);
}

TYPED_TEST(StoreTest, AddOnATextValueIsAnError) {
  Store& store = this->backend_.Shared();
  store.Set("text", "abc");
  EXPECT_THROW(store.Add("text", 1), StoreError);
  EXPECT_EQ(store.Add("fresh", 3), 3);
}

TYPED_TEST(StoreTest, BarrierReleasesEveryoneOnlyWhenAllArrive) {
  constexpr int kParticipants = 6;
  std::atomic<int> arrived{0}, released{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kParticipants; ++i) {
    threads.emplace_back([&, i] {
      auto store = this->backend_.NewHandle();
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * i));
      ++arrived;
      store->Barrier("start", kParticipants, 10s);
      EXPECT_EQ(arrived.load(), kParticipants);
      ++released;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(released.load(), kParticipants);
}

TYPED_TEST(StoreTest, BarrierTimesOutWhenSomeoneIsMissing) {
  EXPECT_THROW(this->backend_.Shared().Barrier("lonely", 2, 200ms), StoreTimeout);
}

TYPED_TEST(StoreTest, LargeValuesRoundTrip) {
  std::string big(4 << 20, 'x');
  big[12345] = '\0';
  this->backend_.Shared().Set("big", big);
  EXPECT_EQ(this->backend_.NewHandle()->Get("big", 5s), big);
}

}  // namespace
}  // namespace bt::rendezvous
