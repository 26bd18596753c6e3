#include "launcher/phases/nccl_preflight.h"
#include "launcher/phases/rdma_probe.h"

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

// nccl-tests' worked example: 16 ranks, 8 GiB in 40 ms -> 214.7 GB/s algbw, 402.6 busbw.
TEST(NcclPreflightFormula, BusBandwidthIsNcclTests) {
  EXPECT_NEAR(AllReduceBusBandwidth(8589934592.0, 0.040, 16), 402.65, 0.01);
  EXPECT_EQ(AllReduceBusBandwidth(1e9, 0.1, 1), 0);  // one rank moves nothing
  EXPECT_NEAR(AllReduceBusBandwidth(1e9, 0.1, 2), 10.0, 1e-9);
}

}  // namespace
}  // namespace bt::launcher
