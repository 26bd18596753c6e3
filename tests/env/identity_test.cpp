#include "env/identity.h"

#include <map>

#include <gtest/gtest.h>

namespace bt::env {
namespace {

EnvLookup Env(std::map<std::string, std::string> variables) {
  return [variables](const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

TEST(Identity, NothingMeansOneNode) {
  NodeIdentity identity = ResolveIdentity({}, Env({}), 1);
  EXPECT_EQ(identity.rank, 0);
  EXPECT_EQ(identity.count, 1);
  EXPECT_EQ(identity.leader_addr, "127.0.0.1");
  EXPECT_EQ(identity.rank_source, "default (single node)");
}

TEST(Identity, NothingForAMultiNodeConfigIsAnError) {
  EXPECT_THROW(ResolveIdentity({}, Env({}), 4), IdentityError);
}

TEST(Identity, FlagsWinOverEverything) {
  NodeIdentity identity = ResolveIdentity({"2", "4", "10.0.0.1"},
                                          Env({{"BT_NODE_RANK", "1"}, {"BT_GROUP_SIZE", "4"}, {"BT_LEADER_ADDR", "x"},
                                               {"OMPI_COMM_WORLD_RANK", "3"}}),
                                          4);
  EXPECT_EQ(identity.rank, 2);
  EXPECT_EQ(identity.leader_addr, "10.0.0.1");
  EXPECT_EQ(identity.rank_source, "flags");
  EXPECT_EQ(identity.leader_source, "flags");
}

TEST(Identity, BasetenVariables) {
  NodeIdentity identity = ResolveIdentity(
      {}, Env({{"BT_NODE_RANK", "1"}, {"BT_GROUP_SIZE", "2"}, {"BT_LEADER_ADDR", "leader.svc"}}), 2);
  EXPECT_EQ(identity.rank, 1);
  EXPECT_EQ(identity.count, 2);
  EXPECT_EQ(identity.leader_addr, "leader.svc");
  EXPECT_EQ(identity.rank_source, "BT_* environment");
}

TEST(Identity, BasetenWinsOverMpiAndSlurm) {
  NodeIdentity identity = ResolveIdentity(
      {}, Env({{"BT_NODE_RANK", "1"}, {"BT_GROUP_SIZE", "2"}, {"BT_LEADER_ADDR", "a"}, {"OMPI_COMM_WORLD_RANK", "0"},
               {"OMPI_COMM_WORLD_SIZE", "2"}, {"SLURM_NODEID", "0"}, {"SLURM_NNODES", "2"}}),
      2);
  EXPECT_EQ(identity.rank, 1);
  EXPECT_EQ(identity.rank_source, "BT_* environment");
}

TEST(Identity, OpenMpiOnOneHostUsesLoopback) {
  NodeIdentity identity = ResolveIdentity(
      {}, Env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}), 4);
  EXPECT_EQ(identity.rank, 3);
  EXPECT_EQ(identity.count, 4);
  EXPECT_EQ(identity.leader_addr, "127.0.0.1");
  EXPECT_EQ(identity.rank_source, "Open MPI");
  EXPECT_TRUE(identity.under_mpi);
}

TEST(Identity, OpenMpiAcrossHostsTakesTheLeaderFromBaseten) {
  NodeIdentity identity = ResolveIdentity({}, Env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}, {"BT_LEADER_ADDR", "10.1.1.1"}}),
                                          4);
  EXPECT_EQ(identity.rank, 1);
  EXPECT_EQ(identity.leader_addr, "10.1.1.1");
  EXPECT_EQ(identity.leader_source, "BT_* environment");
}

TEST(Identity, OpenMpiAcrossHostsWithoutLeaderIsAnError) {
  EXPECT_THROW(ResolveIdentity({}, Env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}}),
                               4),
               IdentityError);
}

TEST(Identity, PmixRank) {
  NodeIdentity identity = ResolveIdentity({}, Env({{"PMIX_RANK", "1"}, {"BT_LEADER_ADDR", "h"}}), 2);
  EXPECT_EQ(identity.rank, 1);
  EXPECT_EQ(identity.rank_source, "PMIx");
  EXPECT_EQ(identity.count_source, "compute.node_count");
}

TEST(Identity, SlurmTakesTheFirstHostOfTheNodelist) {
  NodeIdentity identity = ResolveIdentity(
      {}, Env({{"SLURM_NODEID", "2"}, {"SLURM_NNODES", "5"}, {"SLURM_JOB_NODELIST", "gpu[01-03,07],cpu5"}}), 5);
  EXPECT_EQ(identity.rank, 2);
  EXPECT_EQ(identity.count, 5);
  EXPECT_EQ(identity.leader_addr, "gpu01");
  EXPECT_EQ(identity.rank_source, "Slurm");
}

// `sbatch -N4` then `srun -N2 --relative=2`: the step runs on node03-04, SLURM_NODEID is
// step-relative, and both SLURM_JOB_NODELIST and SLURM_NODELIST are the job's list.
TEST(Identity, SlurmStepTakesTheLeaderFromTheStepsNodelist) {
  NodeIdentity identity = ResolveIdentity({}, Env({{"SLURM_NODEID", "0"}, {"SLURM_NNODES", "2"},
                                                   {"SLURM_JOB_NODELIST", "node[01-04]"}, {"SLURM_NODELIST", "node[01-04]"},
                                                   {"SLURM_STEP_NODELIST", "node[03-04]"}}),
                                          2);
  EXPECT_EQ(identity.leader_addr, "node03");
  EXPECT_EQ(identity.leader_source, "Slurm");
}

TEST(Identity, SlurmWithTwoTasksPerNodeIsAnErrorThatNamesTheFix) {
  for (const char* local_id : {"0", "1"}) {
    try {
      ResolveIdentity({}, Env({{"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", local_id},
                               {"SLURM_STEP_NODELIST", "node[01-02]"}}),
                      2);
      ADD_FAILURE() << "two tasks per node accepted (SLURM_LOCALID " << local_id << ")";
    } catch (const IdentityError& error) {
      EXPECT_NE(std::string(error.what()).find("4 tasks on 2 nodes"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("--ntasks-per-node=1"), std::string::npos) << error.what();
    }
  }
}

// The step's counts win over an allocation's SLURM_NTASKS that the step environment kept.
TEST(Identity, SlurmWithOneTaskPerNodeInAStepOfAWiderAllocationIsFine) {
  NodeIdentity identity = ResolveIdentity(
      {}, Env({{"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "0"},
               {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_STEP_NODELIST", "node[01-02]"}}),
      2);
  EXPECT_EQ(identity.rank, 1);
}

TEST(Identity, SlurmTaskCountIsNotCheckedWhenTheRankComesFromElsewhere) {
  NodeIdentity identity = ResolveIdentity(
      {}, Env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"BT_LEADER_ADDR", "node01"},
               {"SLURM_NODEID", "0"}, {"SLURM_NNODES", "2"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "3"}}),
      2);
  EXPECT_EQ(identity.rank_source, "Open MPI");
}

TEST(Identity, KubernetesIndexedJob) {
  NodeIdentity identity = ResolveIdentity({}, Env({{"JOB_COMPLETION_INDEX", "3"}, {"BT_LEADER_ADDR", "job-0.svc"}}), 4);
  EXPECT_EQ(identity.rank, 3);
  EXPECT_EQ(identity.count, 4);
  EXPECT_EQ(identity.rank_source, "Kubernetes Indexed Job");
}

TEST(Identity, LeaderWorkerSet) {
  NodeIdentity identity = ResolveIdentity(
      {}, Env({{"LWS_WORKER_INDEX", "1"}, {"LWS_GROUP_SIZE", "2"}, {"LWS_LEADER_ADDRESS", "lws-0.lws"}}), 2);
  EXPECT_EQ(identity.rank, 1);
  EXPECT_EQ(identity.count, 2);
  EXPECT_EQ(identity.leader_addr, "lws-0.lws");
  EXPECT_EQ(identity.rank_source, "Kubernetes LeaderWorkerSet");
}

TEST(Identity, WithoutAConfigTheCountComesFromTheSource) {
  NodeIdentity identity = ResolveIdentity({"1", "3", "h"}, Env({}), std::nullopt);
  EXPECT_EQ(identity.count, 3);
  EXPECT_EQ(ResolveIdentity({}, Env({}), std::nullopt).count, 1);
}

TEST(Identity, EmptyVariablesCountAsUnset) {
  NodeIdentity identity = ResolveIdentity({}, Env({{"BT_NODE_RANK", ""}, {"BT_GROUP_SIZE", ""}}), 1);
  EXPECT_EQ(identity.rank_source, "default (single node)");
}

TEST(Identity, RankOutsideTheCountIsAnError) {
  try {
    ResolveIdentity({"4", "4", "h"}, Env({}), 4);
    FAIL();
  } catch (const IdentityError& error) {
    EXPECT_STREQ(error.what(), "node rank 4 from flags is outside [0, 4)");
  }
}

TEST(Identity, ANodeCountAboveTheLimitIsAnError) {
  for (const std::string count : {"2147483647", "65537"}) {
    try {
      ResolveIdentity({}, Env({{"BT_NODE_RANK", "0"}, {"BT_GROUP_SIZE", count}, {"BT_LEADER_ADDR", "h"}}), std::nullopt);
      FAIL() << count << " nodes accepted";
    } catch (const IdentityError& error) {
      EXPECT_EQ(std::string(error.what()), "node count " + count + " from BT_* environment is above the limit of 65536 nodes");
    }
  }
  EXPECT_THROW(ResolveIdentity({"0", "2147483647", "h"}, Env({}), std::nullopt), IdentityError);
  EXPECT_EQ(ResolveIdentity({"0", std::to_string(kMaxNodeCount), "h"}, Env({}), std::nullopt).count, kMaxNodeCount);
}

TEST(Identity, CountDisagreeingWithTheConfigIsAnError) {
  try {
    ResolveIdentity({}, Env({{"BT_NODE_RANK", "0"}, {"BT_GROUP_SIZE", "3"}, {"BT_LEADER_ADDR", "h"}}), 2);
    FAIL();
  } catch (const IdentityError& error) {
    EXPECT_STREQ(error.what(), "node count 3 from BT_* environment disagrees with compute.node_count 2");
  }
}

TEST(Identity, MultiNodeWithoutLeaderIsAnError) {
  try {
    ResolveIdentity({"0", "2", std::nullopt}, Env({}), 2);
    FAIL();
  } catch (const IdentityError& error) {
    EXPECT_NE(std::string(error.what()).find("needs a leader address"), std::string::npos);
  }
}

TEST(Identity, GarbageRankIsAnError) {
  try {
    ResolveIdentity({}, Env({{"BT_NODE_RANK", "one"}}), 1);
    FAIL();
  } catch (const IdentityError& error) {
    EXPECT_STREQ(error.what(), "node rank from BT_* environment: expected a non-negative integer, got \"one\"");
  }
  EXPECT_THROW(ResolveIdentity({"-1", std::nullopt, std::nullopt}, Env({}), 1), IdentityError);
}

TEST(SlurmHostlist, Expands) {
  EXPECT_EQ(ExpandSlurmHostlist("gpu[01-03,07],cpu5"),
            (std::vector<std::string>{"gpu01", "gpu02", "gpu03", "gpu07", "cpu5"}));
  EXPECT_EQ(ExpandSlurmHostlist("node1"), (std::vector<std::string>{"node1"}));
  EXPECT_EQ(ExpandSlurmHostlist("a[8-10]"), (std::vector<std::string>{"a8", "a9", "a10"}));
  EXPECT_EQ(ExpandSlurmHostlist("r[1-2]-n[1-2]"), (std::vector<std::string>{"r1-n1", "r1-n2", "r2-n1", "r2-n2"}));
  EXPECT_EQ(ExpandSlurmHostlist("x[098-101]"), (std::vector<std::string>{"x098", "x099", "x100", "x101"}));
}

TEST(SlurmHostlist, RejectsMalformed) {
  EXPECT_THROW(ExpandSlurmHostlist("gpu[01-03"), IdentityError);
  EXPECT_THROW(ExpandSlurmHostlist("gpu01]"), IdentityError);
  EXPECT_THROW(ExpandSlurmHostlist("gpu[3-1]"), IdentityError);
  EXPECT_THROW(ExpandSlurmHostlist("gpu[a-b]"), IdentityError);
}

}  // namespace

// Hot spares: every launcher counts (launcher.spares), and a count of the training nodes
// alone is refused naming both settings.
TEST(Identity, WithSparesTheCountIsEveryLauncher) {
  NodeIdentity identity = ResolveIdentity({"3", "4", "10.0.0.1"}, Env({}), 3, 1);
  EXPECT_EQ(identity.count, 4);
  EXPECT_EQ(identity.training_count(), 3);
  EXPECT_NE(identity.Describe().find("this one a spare"), std::string::npos) << identity.Describe();
  try {
    ResolveIdentity({"0", "3", "10.0.0.1"}, Env({}), 3, 1);
    FAIL() << "a count without the spares was accepted";
  } catch (const IdentityError& error) {
    EXPECT_NE(std::string(error.what()).find("compute.node_count 3 + launcher.spares 1 = 4 launchers"), std::string::npos)
        << error.what();
  }
  EXPECT_THROW(ResolveIdentity({"0", "1", "10.0.0.1"}, Env({}), std::nullopt, 1), IdentityError);  // no training node
}

}  // namespace bt::env
