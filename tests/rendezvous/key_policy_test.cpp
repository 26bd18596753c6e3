// Who may write which key of the launcher's namespace, and what checking it costs the
// leader's loop, which checks every set and add.
#include "rendezvous/key_policy.h"

#include <cstdlib>
#include <new>

#include <gtest/gtest.h>

namespace {

// Allocations made by this thread while counting is on: the check runs on the server's loop
// for every write, so an allocation there is paid once per request at every node count.
thread_local bool counting_allocations = false;
thread_local int allocations = 0;

}  // namespace

void* operator new(std::size_t size) {
  if (counting_allocations) ++allocations;
  if (void* memory = std::malloc(size == 0 ? 1 : size)) return memory;
  throw std::bad_alloc();
}
void operator delete(void* memory) noexcept { std::free(memory); }
void operator delete(void* memory, std::size_t) noexcept { std::free(memory); }

namespace bt::rendezvous {
namespace {

int AllocationsOf(std::string_view key, KeyWrite write, int rank) {
  allocations = 0;
  counting_allocations = true;
  const bool refused = WriteRefusal(key, write, rank).has_value();
  counting_allocations = false;
  EXPECT_FALSE(refused) << key;
  return allocations;
}

TEST(KeyPolicy, AWriteThatIsAllowedIsCheckedWithoutAllocating) {
  EXPECT_EQ(AllocationsOf("bt/fabric/inventory/7", KeyWrite::kSet, 7), 0);
  EXPECT_EQ(AllocationsOf("bt/ready", KeyWrite::kAdd, 3), 0);
  EXPECT_EQ(AllocationsOf("bt/ckpt/answer/3/rank-12/joined-0", KeyWrite::kSet, 12), 0);
  EXPECT_EQ(AllocationsOf("bt/fabric/plan", KeyWrite::kSet, 0), 0);
  EXPECT_EQ(AllocationsOf("job/anything/at/all", KeyWrite::kSet, 5), 0);
}

// With hot spares the checkpoint keys are the training rank's, whichever node runs it: the
// spare that took rank 1 writes them, the node that ran it before (and a spare) cannot.
TEST(KeyPolicy, CheckpointKeysBelongToTheNodeRunningTheirRank) {
  EXPECT_FALSE(WriteRefusal("bt/ckpt/launchers/rank-1", KeyWrite::kSet, 3, 1));
  EXPECT_FALSE(WriteRefusal("bt/ckpt/answer/7/rank-1/joined-2", KeyWrite::kSet, 3, 1));
  const auto before = WriteRefusal("bt/ckpt/launchers/rank-1", KeyWrite::kSet, 1, -1);
  ASSERT_TRUE(before);
  EXPECT_NE(before->find("belongs to the node running rank 1 (it runs none, a spare)"), std::string::npos) << *before;
  EXPECT_TRUE(WriteRefusal("bt/ckpt/answer/7/rank-1/joined-0", KeyWrite::kSet, 2, -1));
  // The node's own keys stay its slot's.
  EXPECT_FALSE(WriteRefusal("bt/phase/3", KeyWrite::kSet, 3, 1));
  EXPECT_TRUE(WriteRefusal("bt/phase/1", KeyWrite::kSet, 3, 1));
}

// The keys by which the job's checkpoints are committed are the checkpoint leader's: node 0,
// or the node running training rank 0 once a spare took it; no other node can forge what node
// 0's restart decision resumes from (rendezvous/commit_keys.h), and the absent ranks are the
// server's own.
TEST(KeyPolicy, CommitKeysBelongToNodeZeroOrTheNodeRunningRankZero) {
  for (const char* key : {"bt/ckpt/latest", "bt/ckpt/commit/4", "bt/ckpt/declared",
                          "bt/ckpt/declared/4", "bt/ckpt/outcome/4", "bt/ckpt/closed", "bt/ckpt/draining",
                          "bt/ckpt/resumed"}) {
    EXPECT_FALSE(WriteRefusal(key, KeyWrite::kSet, 0, -1)) << key;  // node 0 whose rank moved: its hand-over
    EXPECT_FALSE(WriteRefusal(key, KeyWrite::kSet, 3, 0)) << key;   // the spare running rank 0
    EXPECT_FALSE(WriteRefusal(key, KeyWrite::kRead, 2, 1)) << key;  // any node reads
    const auto forged = WriteRefusal(key, KeyWrite::kAdd, 2, 1);
    ASSERT_TRUE(forged) << key;
    EXPECT_NE(forged->find("only the checkpoint leader"), std::string::npos) << *forged;
    EXPECT_TRUE(WriteRefusal(key, KeyWrite::kSet, 1)) << key;       // no spares: node 0's alone
    EXPECT_TRUE(WriteRefusal(key, KeyWrite::kSet, 4, -1)) << key;   // a spare
  }
  // A commit's state is only ever added to: no set can undo a decision's seal.
  EXPECT_FALSE(WriteRefusal("bt/ckpt/commit/4/2", KeyWrite::kAdd, 3, 0));
  EXPECT_FALSE(WriteRefusal("bt/ckpt/commit/4/2", KeyWrite::kAdd, 0, -1));
  EXPECT_TRUE(WriteRefusal("bt/ckpt/commit/4/2", KeyWrite::kSet, 3, 0));
  EXPECT_TRUE(WriteRefusal("bt/ckpt/commit/4/2", KeyWrite::kSet, 0));
  EXPECT_TRUE(WriteRefusal("bt/ckpt/commit/4/2", KeyWrite::kAdd, 2, 1));
  EXPECT_TRUE(WriteRefusal("bt/ckpt/absent", KeyWrite::kSet, 0));
  EXPECT_TRUE(WriteRefusal("bt/ckpt/absent", KeyWrite::kSet, 3, 0));
}

TEST(KeyPolicy, EachSegmentOfTheKeyMatchesOneOfThePattern) {
  EXPECT_FALSE(WriteRefusal("bt/phase/3", KeyWrite::kSet, 3));
  const auto other = WriteRefusal("bt/phase/4", KeyWrite::kSet, 3);
  ASSERT_TRUE(other);
  EXPECT_NE(other->find("belongs to node 4"), std::string::npos) << *other;
  // One segment more or fewer than the pattern is not that rule's key: the leader's.
  for (const char* key : {"bt/phase/3/x", "bt/phase", "bt/phase/"}) {
    const auto why = WriteRefusal(key, KeyWrite::kSet, 3);
    ASSERT_TRUE(why) << key;
    EXPECT_NE(why->find("only the leader (node 0) writes"), std::string::npos) << *why;
  }
  // "*" matches any one segment, the empty one too.
  EXPECT_FALSE(WriteRefusal("bt/hang//answered", KeyWrite::kAdd, 3));
  EXPECT_FALSE(WriteRefusal("bt/fabric/probe/qp//1/3", KeyWrite::kSet, 3));
  EXPECT_TRUE(WriteRefusal("bt/fabric/probe/qp//1/4", KeyWrite::kSet, 3));
  // A launcher answers for its own rank only, whichever cycle it joined in.
  EXPECT_FALSE(WriteRefusal("bt/ckpt/answer/7/rank-3/joined-2", KeyWrite::kSet, 3));
  EXPECT_TRUE(WriteRefusal("bt/ckpt/answer/7/rank-4/joined-0", KeyWrite::kSet, 3));
  EXPECT_FALSE(WriteRefusal("bt/ckpt/launchers/rank-3", KeyWrite::kSet, 3));
}

}  // namespace
}  // namespace bt::rendezvous
