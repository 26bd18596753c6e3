// The phases before the run over one in-process store, every node a thread: what each node
// asks of node 0 and what node 0 sends back, as `run` does it (the fabric plan, the ready
// barrier's progress).
#include <atomic>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "launcher/phases/fabric.h"
#include "launcher/phases/ready.h"
#include "rendezvous/store.h"

namespace bt::launcher {
namespace {

using namespace std::chrono_literals;

// One node's handle on the shared store, counting what it asks for.
class CountingStore final : public rendezvous::Store {
 public:
  explicit CountingStore(rendezvous::Store& store) : store_(store) {}
  void Set(const std::string& key, const std::string& value) override { store_.Set(key, value); }
  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override {
    ++gets;
    return store_.Get(key, timeout);
  }
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override { store_.Wait(keys, timeout); }
  int64_t Add(const std::string& key, int64_t delta) override { return store_.Add(key, delta); }
  std::vector<std::optional<std::string>> Peek(const std::vector<std::string>& keys) override {
    peeked_keys += int(keys.size());
    return store_.Peek(keys);
  }

  std::atomic<int> gets{0};
  std::atomic<int> peeked_keys{0};

 private:
  rendezvous::Store& store_;
};

// A node's view of the others: its store handle, and a roster that counts who asks for it
// (on a follower, the roster is a request for 2 KiB per node to node 0).
class CountingPeers final : public Peers {
 public:
  CountingPeers(rendezvous::Store& store, int count) : store_(store), count_(count) {}
  int fd() const override { return -1; }
  std::optional<std::string> TakeStop() override { return std::nullopt; }
  int Finish(const JobOutcome& outcome, SignalRouter&) override { return outcome.exit_code; }
  void Report(const JobOutcome&) override {}
  std::vector<rendezvous::NodeInfo> Roster() override {
    ++roster_calls;
    std::vector<rendezvous::NodeInfo> roster(static_cast<size_t>(count_));
    for (int rank = 0; rank < count_; ++rank) {
      roster[size_t(rank)].rank = rank;
      roster[size_t(rank)].host = "host-" + std::to_string(rank);
    }
    return roster;
  }
  rendezvous::Store* store() override { return &store_; }

  std::atomic<int> roster_calls{0};
  CountingStore store_;

 private:
  int count_;
};

// Nodes alike but for their addresses; each reaches the leader (127.0.0.1) over lo.
rendezvous::fabric::Inventory EthernetOnly(int rank) {
  rendezvous::fabric::Inventory inventory;
  inventory.interfaces.push_back({"lo", true, true, {"127.0.0.1"}});
  inventory.interfaces.push_back({"eth0", true, true, {"10.0.0." + std::to_string(rank + 1)}});
  return inventory;
}

// Runs the fabric phase on `count` nodes at once; returns each node's peers.
std::vector<std::unique_ptr<CountingPeers>> RunFabricPhase(rendezvous::Store& store, int count) {
  std::vector<std::unique_ptr<CountingPeers>> peers;
  for (int rank = 0; rank < count; ++rank) peers.push_back(std::make_unique<CountingPeers>(store, count));
  env::JobConfig config;
  std::vector<std::thread> nodes;
  std::atomic<int> failures{0};
  for (int rank = 0; rank < count; ++rank) {
    nodes.emplace_back([&, rank] {
      env::NodeIdentity identity{rank, count, "127.0.0.1"};
      env::JobEnvironment environment;
      try {
        const FabricResult result = PlanFabricPhase(config, identity, peers[size_t(rank)].get(), EthernetOnly(rank), environment);
        if (result.plan.ForRank(rank) == nullptr) ++failures;
      } catch (const std::exception& error) {
        ADD_FAILURE() << "node " << rank << ": " << error.what();
        ++failures;
      }
    });
  }
  for (auto& node : nodes) node.join();
  EXPECT_EQ(failures, 0);
  return peers;
}

TEST(FabricPhase, FollowersNeverAskForTheRoster) {
  auto store = rendezvous::MakeMemoryStore();
  auto peers = RunFabricPhase(*store, 4);
  for (int rank = 1; rank < 4; ++rank) {
    EXPECT_EQ(peers[size_t(rank)]->roster_calls, 0) << "node " << rank << " fetched the whole roster from node 0";
  }
}

TEST(FabricPhase, WhatNodeZeroSendsEachNodeDoesNotGrowWithTheNodes) {
  auto small = rendezvous::MakeMemoryStore();
  RunFabricPhase(*small, 2);
  auto large = rendezvous::MakeMemoryStore();
  RunFabricPhase(*large, 24);
  const std::string small_plan = small->Get("bt/fabric/plan", 1s);
  const std::string large_plan = large->Get("bt/fabric/plan", 1s);
  // A few bytes may differ (a range of ranks in a warning, "0-1" against "0-23"); a node's
  // entry in the plan is about 150 bytes.
  EXPECT_LT(large_plan.size(), small_plan.size() + 64) << "the plan every follower reads grows with the node count:\n"
                                                       << large_plan;
}

// Node 0 alone, with every other node's inventory already published as `inventory_of` says.
FabricResult PlanOnNodeZero(rendezvous::Store& store, int count, const std::function<std::string(int)>& inventory_of) {
  for (int rank = 1; rank < count; ++rank) {
    store.Set("bt/fabric/inventory/" + std::to_string(rank), inventory_of(rank));
    store.Add("bt/fabric/published", 1);
  }
  CountingPeers peers(store, count);
  env::JobEnvironment environment;
  return PlanFabricPhase(env::JobConfig{}, env::NodeIdentity{0, count, "127.0.0.1"}, &peers, EthernetOnly(0), environment);
}

std::string PublishedInventory(int rank) {
  auto inventory = EthernetOnly(rank);
  inventory.bootstrap_interface = "lo";
  return inventory.ToJson().dump();
}

// Node 0 parses the inventories on several threads: the plan still has every node, in rank order.
TEST(FabricPhase, NodeZeroPlansEveryNodeInRankOrder) {
  auto store = rendezvous::MakeMemoryStore();
  const FabricResult result = PlanOnNodeZero(*store, 300, PublishedInventory);
  ASSERT_EQ(result.plan.nodes.size(), 300u);
  for (int rank = 0; rank < 300; ++rank) EXPECT_EQ(result.plan.nodes[size_t(rank)].rank, rank);
}

// Nodes publish their inventory as MessagePack; node 0 also reads the JSON text (a node of
// an earlier build), and names a node whose bytes are neither.
TEST(FabricPhase, NodeZeroReadsInventoriesPublishedAsMessagePackOrJson) {
  auto packed = [](int rank) {
    const auto bytes = nlohmann::json::to_msgpack(nlohmann::json::parse(PublishedInventory(rank)));
    return std::string(bytes.begin(), bytes.end());
  };
  auto store = rendezvous::MakeMemoryStore();
  const FabricResult result = PlanOnNodeZero(*store, 200, [&](int rank) { return rank % 2 ? packed(rank) : PublishedInventory(rank); });
  ASSERT_TRUE(result.plan.ok) << result.plan.failure;
  ASSERT_EQ(result.plan.nodes.size(), 200u);
  for (int rank = 0; rank < 200; ++rank) EXPECT_EQ(result.plan.nodes[size_t(rank)].rank, rank);
  // Node 0 publishes its own after reading the others', before the plan.
  EXPECT_TRUE(store->Peek({"bt/fabric/inventory/0"}).front());
  EXPECT_EQ(store->Add("bt/fabric/published", 0), 200);

  auto broken = rendezvous::MakeMemoryStore();
  try {
    PlanOnNodeZero(*broken, 50, [&](int rank) { return rank == 17 ? packed(rank).substr(0, 40) : packed(rank); });
    FAIL() << "node 0 planned with a truncated inventory";
  } catch (const LaunchFailure& failure) {
    EXPECT_NE(std::string(failure.what()).find("the inventory of node 17 (host-17"), std::string::npos) << failure.what();
  }
}

// Node 0 parses the inventories that arrived while it waits for the rest: inventories that
// arrive in batches, out of rank order, all end up in the plan in rank order; a node counted
// as published whose inventory is not there is named.
TEST(FabricPhase, NodeZeroParsesInventoriesAsTheyArrive) {
  constexpr int kNodes = 400;
  auto store = rendezvous::MakeMemoryStore();
  std::thread publisher([&] {
    for (int batch = 4; batch >= 0; --batch) {  // the highest ranks first
      std::this_thread::sleep_for(std::chrono::milliseconds(80));
      for (int rank = 1; rank < kNodes; ++rank) {
        if (rank % 5 != batch) continue;
        store->Set("bt/fabric/inventory/" + std::to_string(rank), PublishedInventory(rank));
        store->Add("bt/fabric/published", 1);
      }
    }
  });
  CountingPeers peers(*store, kNodes);
  env::JobEnvironment environment;
  const FabricResult result =
      PlanFabricPhase(env::JobConfig{}, env::NodeIdentity{0, kNodes, "127.0.0.1"}, &peers, EthernetOnly(0), environment);
  publisher.join();
  ASSERT_TRUE(result.plan.ok) << result.plan.failure;
  ASSERT_EQ(result.plan.nodes.size(), size_t(kNodes));
  for (int rank = 0; rank < kNodes; ++rank) EXPECT_EQ(result.plan.nodes[size_t(rank)].rank, rank);

  auto counted_but_missing = rendezvous::MakeMemoryStore();
  for (int rank = 1; rank < 30; ++rank) {
    if (rank != 11) counted_but_missing->Set("bt/fabric/inventory/" + std::to_string(rank), PublishedInventory(rank));
    counted_but_missing->Add("bt/fabric/published", 1);
  }
  CountingPeers few(*counted_but_missing, 30);
  try {
    PlanFabricPhase(env::JobConfig{}, env::NodeIdentity{0, 30, "127.0.0.1"}, &few, EthernetOnly(0), environment);
    FAIL() << "node 0 planned without node 11's inventory";
  } catch (const LaunchFailure& failure) {
    EXPECT_NE(std::string(failure.what()).find("node 11 (host-11"), std::string::npos) << failure.what();
    EXPECT_NE(std::string(failure.what()).find("never published"), std::string::npos) << failure.what();
  }
}

// Of several malformed inventories, parsed on different threads, the first by rank is named.
TEST(FabricPhase, NodeZeroNamesTheFirstNodeWhoseInventoryIsMalformed) {
  auto store = rendezvous::MakeMemoryStore();
  try {
    PlanOnNodeZero(*store, 300, [](int rank) { return rank == 150 || rank == 290 ? "{\"devices\": 7}" : PublishedInventory(rank); });
    FAIL() << "node 0 planned with malformed inventories";
  } catch (const LaunchFailure& failure) {
    EXPECT_EQ(failure.code(), 69);
    EXPECT_NE(std::string(failure.what()).find("the inventory of node 150 (host-150"), std::string::npos) << failure.what();
  }
}

// Five nodes wait in the ready barrier through one progress line (every 10 s); the sixth
// arrives after it. The waiting followers ask node 0 for a counter and one summary key, never
// the roster or a key per node, and every node leaves within a slice of the last arrival.
TEST(ReadyBarrier, WaitingNodesAskLittleOfNodeZeroAndLeaveAsSoonAsItOpens) {
  constexpr int kNodes = 6;
  SignalRouter signals;  // before any thread: they inherit its blocked mask
  auto store = rendezvous::MakeMemoryStore();
  std::vector<std::unique_ptr<CountingPeers>> peers;
  for (int rank = 0; rank < kNodes; ++rank) peers.push_back(std::make_unique<CountingPeers>(*store, kNodes));
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  std::vector<std::chrono::steady_clock::time_point> left(kNodes);
  auto node = [&](int rank) {
    try {
      WaitUntilAllReady(*peers[size_t(rank)], env::NodeIdentity{rank, kNodes, "127.0.0.1"}, deadline, signals);
    } catch (const std::exception& error) {
      ADD_FAILURE() << "node " << rank << ": " << error.what();
    }
    left[size_t(rank)] = std::chrono::steady_clock::now();
  };
  std::vector<std::thread> waiting;
  for (int rank = 0; rank < kNodes - 1; ++rank) waiting.emplace_back(node, rank);
  std::this_thread::sleep_for(10500ms);  // one progress line
  const auto last_arrived = std::chrono::steady_clock::now();
  node(kNodes - 1);
  for (auto& thread : waiting) thread.join();
  for (int rank = 1; rank < kNodes - 1; ++rank) {
    const CountingPeers& follower = *peers[size_t(rank)];
    EXPECT_EQ(follower.roster_calls, 0) << "node " << rank;
    EXPECT_EQ(follower.store_.gets, 0) << "node " << rank << " read keys one by one";
    EXPECT_LE(follower.store_.peeked_keys, 2) << "node " << rank;
  }
  for (int rank = 0; rank < kNodes - 1; ++rank) {
    EXPECT_LT(left[size_t(rank)] - last_arrived, 1s) << "node " << rank << " noticed the open barrier late";
  }
}

}  // namespace
}  // namespace bt::launcher
