#include "env/environment.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace bt::env {
namespace {

namespace fs = std::filesystem;

class EnvironmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("bt-env-test-" + std::to_string(getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "secrets");
  }
  void TearDown() override { fs::remove_all(root_); }

  JobEnvironment Build(const std::string& config_json, std::vector<std::string> inherited = {},
                       NodeIdentity identity = {}) {
    JobConfig config = ParseJobConfig(config_json, false);
    if (identity.leader_addr.empty()) identity.leader_addr = "127.0.0.1";
    return BuildJobEnvironment(config, identity, PathLayout(root_.string(), identity.rank), inherited);
  }
  void WriteSecret(const std::string& name, const std::string& value) {
    std::ofstream(root_ / "secrets" / name) << value;
  }
  std::string Root() const { return root_.string(); }

  fs::path root_;
};

TEST_F(EnvironmentTest, AlwaysSetVariables) {
  auto vars = Build(R"({"name": "sft", "compute": {"accelerator": "H100:8"}})").variables;
  EXPECT_EQ(vars["BT_TRAINING_JOB_NAME"], "sft");
  EXPECT_EQ(vars["BT_TRAINING_JOB_ID"].rfind("local-", 0), 0u);
  EXPECT_EQ(vars["BT_TRAINING_PROJECT_ID"], "local");
  EXPECT_EQ(vars["BT_TRAINING_PROJECT_NAME"], "local");
  EXPECT_EQ(vars["BT_NUM_GPUS"], "8");
  EXPECT_EQ(vars["BT_RETRY_COUNT"], "0");
  EXPECT_EQ(vars["BT_SCRATCH_DIR"], Root() + "/node-0/mnt/bt-scratch");
  EXPECT_EQ(vars["BT_WORKING_DIR"], Root() + "/node-0/b10/workspace");
  EXPECT_EQ(vars["BT_NODE_RANK"], "0");
  EXPECT_EQ(vars["BT_GROUP_SIZE"], "1");
  EXPECT_EQ(vars["BT_LEADER_ADDR"], "127.0.0.1");
}

TEST_F(EnvironmentTest, LauncherSettingsNameTheJob) {
  auto vars = Build(R"({"launcher": {"job_id": "gvpql31", "project_id": "aghi527", "project_name": "finetunes"}})").variables;
  EXPECT_EQ(vars["BT_TRAINING_JOB_ID"], "gvpql31");
  EXPECT_EQ(vars["BT_TRAINING_JOB_NAME"], "gvpql31");
  EXPECT_EQ(vars["BT_TRAINING_PROJECT_ID"], "aghi527");
  EXPECT_EQ(vars["BT_TRAINING_PROJECT_NAME"], "finetunes");
}

// Two Slurm jobs (or two steps of one) with the same config must not share a job id: the
// derived rendezvous token would let one job's nodes join the other's rendezvous.
TEST_F(EnvironmentTest, UnderSlurmTheJobIdIsTheSlurmJobAndStep) {
  const std::string config = R"({"name": "sft"})";
  EXPECT_EQ(Build(config, {"SLURM_JOB_ID=58", "SLURM_STEP_ID=0"}).variables["BT_TRAINING_JOB_ID"], "slurm-58.0");
  EXPECT_EQ(Build(config, {"SLURM_JOB_ID=59", "SLURM_STEP_ID=0"}).variables["BT_TRAINING_JOB_ID"], "slurm-59.0");
  EXPECT_EQ(Build(config, {"SLURM_JOB_ID=58", "SLURM_STEP_ID=1"}).variables["BT_TRAINING_JOB_ID"], "slurm-58.1");
  EXPECT_EQ(Build(config, {"SLURM_JOB_ID=58"}).variables["BT_TRAINING_JOB_ID"], "slurm-58");
  EXPECT_EQ(Build(config, {"SLURM_JOB_ID=58", "BT_TRAINING_JOB_ID=mine"}).variables["BT_TRAINING_JOB_ID"], "mine");
  EXPECT_EQ(Build(R"({"launcher": {"job_id": "cfg"}})", {"SLURM_JOB_ID=58"}).variables["BT_TRAINING_JOB_ID"], "cfg");
}

// mpirun's ranks can sit in different Slurm steps (its daemons are one srun step, the ranks
// on the batch host are not): a step-derived id would differ between them.
TEST_F(EnvironmentTest, UnderMpirunTheSlurmJobIsNotTheJobId) {
  auto vars = Build(R"({"name": "sft"})", {"SLURM_JOB_ID=58", "SLURM_STEP_ID=0", "OMPI_COMM_WORLD_RANK=1"}).variables;
  EXPECT_EQ(vars["BT_TRAINING_JOB_ID"].rfind("local-", 0), 0u);
}

TEST_F(EnvironmentTest, UnderKubernetesTheJobIdIsTheIndexedJobOrTheLeaderWorkerSetGroup) {
  const std::string config = R"({"name": "sft"})";
  EXPECT_EQ(Build(config, {"JOB_COMPLETION_INDEX=3", "HOSTNAME=trainer-a-3"}).variables["BT_TRAINING_JOB_ID"], "k8s-trainer-a");
  EXPECT_EQ(Build(config, {"JOB_COMPLETION_INDEX=0", "HOSTNAME=trainer-b-0"}).variables["BT_TRAINING_JOB_ID"], "k8s-trainer-b");
  EXPECT_EQ(Build(config, {"LWS_WORKER_INDEX=1", "LWS_LEADER_ADDRESS=lws-2.lws.default"}).variables["BT_TRAINING_JOB_ID"],
            "k8s-lws-2");
  // A hostname that is not <job>-<index> says nothing about the job.
  EXPECT_EQ(Build(config, {"JOB_COMPLETION_INDEX=3", "HOSTNAME=custom"}).variables["BT_TRAINING_JOB_ID"].rfind("local-", 0), 0u);
}

TEST_F(EnvironmentTest, TorchrunCompatibleVariables) {
  NodeIdentity identity{2, 4, "10.0.0.1", "flags", "flags", "flags", false};
  auto vars = Build(R"({"compute": {"node_count": 4, "accelerator": "H200:4"}, "launcher": {"master_port": 29555}})", {},
                    identity)
                  .variables;
  EXPECT_EQ(vars["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(vars["MASTER_PORT"], "29555");
  EXPECT_EQ(vars["NNODES"], "4");
  EXPECT_EQ(vars["NODE_RANK"], "2");
  EXPECT_EQ(vars["NPROC_PER_NODE"], "4");
  EXPECT_EQ(vars["BT_NODE_RANK"], "2");
  EXPECT_EQ(vars["BT_SCRATCH_DIR"], Root() + "/node-2/mnt/bt-scratch");
}

TEST_F(EnvironmentTest, CpuOnlyJobRunsOneProcessPerNode) {
  auto vars = Build("{}").variables;
  EXPECT_EQ(vars["BT_NUM_GPUS"], "0");
  EXPECT_EQ(vars["NPROC_PER_NODE"], "1");
}

TEST_F(EnvironmentTest, CheckpointDirOnlyWhenEnabled) {
  EXPECT_FALSE(Build("{}").variables.contains("BT_CHECKPOINT_DIR"));
  auto vars = Build(R"({"runtime": {"checkpointing_config": {"enabled": true}}})").variables;
  EXPECT_EQ(vars["BT_CHECKPOINT_DIR"], Root() + "/node-0/mnt/ckpts");
  vars = Build(R"({"runtime": {"checkpointing_config": {"enabled": true, "checkpoint_path": "/data/ck"}}})").variables;
  EXPECT_EQ(vars["BT_CHECKPOINT_DIR"], Root() + "/node-0/data/ck");
}

TEST_F(EnvironmentTest, LoadCheckpointDirOnlyWhenEnabled) {
  EXPECT_FALSE(Build("{}").variables.contains("BT_LOAD_CHECKPOINT_DIR"));
  auto vars = Build(R"({"runtime": {"load_checkpoint_config": {"enabled": true}}})").variables;
  EXPECT_EQ(vars["BT_LOAD_CHECKPOINT_DIR"], Root() + "/node-0/tmp/loaded_checkpoints");
}

TEST_F(EnvironmentTest, CacheDirsOnlyWithTheCacheAndSharedAcrossNodes) {
  auto without = Build("{}").variables;
  for (const char* name : {"BT_PROJECT_CACHE_DIR", "BT_TEAM_CACHE_DIR", "BT_RW_CACHE_DIR"}) {
    EXPECT_FALSE(without.contains(name)) << name;
  }
  NodeIdentity node3{3, 4, "h", "", "", "", false};
  auto vars = Build(R"({"compute": {"node_count": 4}, "runtime": {"cache_config": {"enabled": true}}})", {}, node3).variables;
  EXPECT_EQ(vars["BT_PROJECT_CACHE_DIR"], Root() + "/root/.cache/user_artifacts");
  EXPECT_EQ(vars["BT_TEAM_CACHE_DIR"], Root() + "/root/.cache/team_artifacts");
  EXPECT_EQ(vars["BT_RW_CACHE_DIR"], vars["BT_PROJECT_CACHE_DIR"]);
  EXPECT_FALSE(vars.contains("HF_HOME"));
}

TEST_F(EnvironmentTest, LegacyHfMountSetsHfHome) {
  auto vars = Build(R"({"runtime": {"enable_cache": true}})").variables;
  EXPECT_EQ(vars["HF_HOME"], Root() + "/root/.cache/huggingface");
}

TEST_F(EnvironmentTest, WorkingDirOnlyWithBasetenWorkdir) {
  auto environment = Build(R"({"enable_baseten_workdir": false})");
  EXPECT_FALSE(environment.variables.contains("BT_WORKING_DIR"));
  EXPECT_TRUE(environment.working_dir.empty());
  EXPECT_EQ(Build("{}").working_dir, Root() + "/node-0/b10/workspace");
}

TEST_F(EnvironmentTest, InheritedPlatformValuesAreKept) {
  auto vars = Build(R"({"runtime": {"checkpointing_config": {"enabled": true}}})",
                    {"BT_CHECKPOINT_DIR=/platform/ckpt", "BT_TRAINING_JOB_ID=abc123", "MASTER_PORT=1234", "PATH=/bin"})
                  .variables;
  EXPECT_EQ(vars["BT_CHECKPOINT_DIR"], "/platform/ckpt");
  EXPECT_EQ(vars["BT_TRAINING_JOB_ID"], "abc123");
  EXPECT_EQ(vars["MASTER_PORT"], "1234");
  EXPECT_EQ(vars["PATH"], "/bin");
}

TEST_F(EnvironmentTest, UserVariablesWinOverComputedOnes) {
  auto vars = Build(R"({"runtime": {"environment_variables": {"MASTER_PORT": "29999", "BT_SCRATCH_DIR": "/fast"}}})",
                    {"MASTER_PORT=1"})
                  .variables;
  EXPECT_EQ(vars["MASTER_PORT"], "29999");
  EXPECT_EQ(vars["BT_SCRATCH_DIR"], "/fast");
}

TEST_F(EnvironmentTest, ResolvedIdentityReplacesStaleInheritedValues) {
  NodeIdentity identity{1, 2, "10.0.0.9", "flags", "flags", "flags", false};
  auto vars = Build(R"({"compute": {"node_count": 2}})", {"BT_NODE_RANK=0", "BT_GROUP_SIZE=1"}, identity).variables;
  EXPECT_EQ(vars["BT_NODE_RANK"], "1");
  EXPECT_EQ(vars["BT_GROUP_SIZE"], "2");
  EXPECT_EQ(vars["BT_LEADER_ADDR"], "10.0.0.9");
}

TEST_F(EnvironmentTest, MpiLauncherVariablesAreRemoved) {
  auto vars = Build("{}", {"OMPI_COMM_WORLD_RANK=0", "PMIX_RANK=0", "PMI_FD=3", "PRTE_MCA_x=1", "OMPIX=keep"}).variables;
  EXPECT_FALSE(vars.contains("OMPI_COMM_WORLD_RANK"));
  EXPECT_FALSE(vars.contains("PMIX_RANK"));
  EXPECT_FALSE(vars.contains("PMI_FD"));
  EXPECT_FALSE(vars.contains("PRTE_MCA_x"));
  EXPECT_EQ(vars["OMPIX"], "keep");
}

TEST_F(EnvironmentTest, SlurmTaskVariablesAreRemovedJobVariablesKept) {
  auto vars = Build("{}", {"SLURM_PROCID=1", "SLURM_LOCALID=0", "SLURM_NTASKS=2", "SLURM_NPROCS=2", "SLURM_STEP_ID=0",
                           "SLURM_STEP_NODELIST=n[1-2]", "SLURM_JOB_ID=42", "SLURM_JOB_NODELIST=n[1-2]", "SLURM_NODEID=1"})
                  .variables;
  for (const char* removed : {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_ID", "SLURM_STEP_NODELIST"}) {
    EXPECT_FALSE(vars.contains(removed)) << removed;
  }
  EXPECT_EQ(vars["SLURM_JOB_ID"], "42");
  EXPECT_EQ(vars["SLURM_JOB_NODELIST"], "n[1-2]");
  EXPECT_EQ(vars["SLURM_NODEID"], "1");
}

TEST_F(EnvironmentTest, RendezvousTokenStaysWithTheLauncher) {
  auto vars = Build("{}", {"BT_RENDEZVOUS_TOKEN=s3cret", "BT_RENDEZVOUS_PORT=29311"}).variables;
  EXPECT_FALSE(vars.contains("BT_RENDEZVOUS_TOKEN"));
  EXPECT_EQ(vars["BT_RENDEZVOUS_PORT"], "29311");
}

TEST_F(EnvironmentTest, SecretsAreResolvedAndMasked) {
  WriteSecret("hf_access_token", "hf_s3cr3t_value\n");
  auto environment = Build(R"({"runtime": {"environment_variables": {"HF_TOKEN": {"name": "hf_access_token"}, "PLAIN": "visible"}}})");
  EXPECT_EQ(environment.variables["HF_TOKEN"], "hf_s3cr3t_value");
  EXPECT_TRUE(environment.secret_variables.contains("HF_TOKEN"));
  for (const std::string& rendered : {environment.RenderShell(), environment.RenderJson()}) {
    EXPECT_EQ(rendered.find("hf_s3cr3t_value"), std::string::npos);
    EXPECT_NE(rendered.find("visible"), std::string::npos);
    EXPECT_NE(rendered.find(kMaskedSecret), std::string::npos);
  }
  auto json = nlohmann::json::parse(environment.RenderJson());
  EXPECT_EQ(json["HF_TOKEN"], kMaskedSecret);
  EXPECT_EQ(json["PLAIN"], "visible");
}

TEST_F(EnvironmentTest, SecretsDirFromTheEnvironment) {
  fs::create_directories(root_ / "other");
  std::ofstream(root_ / "other" / "tok") << "abc";
  auto environment = Build(R"({"runtime": {"environment_variables": {"T": {"name": "tok"}}}})",
                           {"BT_SECRETS_DIR=" + (root_ / "other").string()});
  EXPECT_EQ(environment.variables["T"], "abc");
}

TEST_F(EnvironmentTest, MissingSecretIsNamedWithoutAValue) {
  try {
    Build(R"({"runtime": {"environment_variables": {"HF_TOKEN": {"name": "hf_access_token"}}}})");
    FAIL();
  } catch (const SecretError& error) {
    std::string message = error.what();
    EXPECT_NE(message.find("runtime.environment_variables.HF_TOKEN: secret \"hf_access_token\" not found at " + Root() +
                           "/secrets/hf_access_token"),
              std::string::npos)
        << message;
  }
}

TEST_F(EnvironmentTest, ShellRenderingQuotesValues) {
  auto environment = Build(R"({"runtime": {"environment_variables": {"Q": "it's $HOME"}}})");
  EXPECT_NE(environment.RenderShell().find("export Q='it'\\''s $HOME'\n"), std::string::npos);
}

TEST_F(EnvironmentTest, DirectoriesAreCreated) {
  auto environment = Build(R"({"runtime": {"checkpointing_config": {"enabled": true}, "cache_config": {"enabled": true}}})");
  CreateDirectories(environment);
  for (const char* name : {"BT_SCRATCH_DIR", "BT_WORKING_DIR", "BT_CHECKPOINT_DIR", "BT_PROJECT_CACHE_DIR", "BT_TEAM_CACHE_DIR"}) {
    EXPECT_TRUE(fs::is_directory(environment.variables[name])) << name;
  }
}

TEST_F(EnvironmentTest, UncreatableDirectoryIsNamed) {
  std::ofstream(root_ / "file") << "x";
  JobEnvironment environment;
  environment.directories = {(root_ / "file" / "sub").string()};
  try {
    CreateDirectories(environment);
    FAIL();
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find((root_ / "file" / "sub").string()), std::string::npos);
  }
}

TEST(PathLayout, WithoutRootPathsAreThePlatformDefaults) {
  PathLayout paths(std::nullopt, 3);
  EXPECT_EQ(paths.NodeLocal("/mnt/ckpts"), "/mnt/ckpts");
  EXPECT_EQ(paths.Shared("/root/.cache"), "/root/.cache");
}

}  // namespace
}  // namespace bt::env
