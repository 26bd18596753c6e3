#include "launcher/rdma_probe.h"

#include <gtest/gtest.h>

namespace bt::launcher {
namespace {

using Pairs = std::vector<std::pair<int, int>>;

TEST(ProbePairs, RingCoversEveryNodeWithOnePairPerNeighbour) {
  EXPECT_EQ(ProbePairs(env::FabricProbe::kRing, 1), Pairs{});
  EXPECT_EQ(ProbePairs(env::FabricProbe::kRing, 2), (Pairs{{0, 1}}));
  EXPECT_EQ(ProbePairs(env::FabricProbe::kRing, 4), (Pairs{{0, 1}, {0, 3}, {1, 2}, {2, 3}}));
}

TEST(ProbePairs, AllPairsIsEveryUnorderedPairInOrder) {
  EXPECT_EQ(ProbePairs(env::FabricProbe::kAllPairs, 3), (Pairs{{0, 1}, {0, 2}, {1, 2}}));
  EXPECT_EQ(ProbePairs(env::FabricProbe::kAllPairs, 16).size(), 120u);
  EXPECT_EQ(ProbePairs(env::FabricProbe::kOff, 16), Pairs{});
}

}  // namespace
}  // namespace bt::launcher
