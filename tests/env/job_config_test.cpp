#include "env/job_config.h"

#include <deque>

#include <gtest/gtest.h>

namespace bt::env {
namespace {

struct BadConfig {
  const char* json;
  const char* expected_message;  // the full "path: expectation" prefix or a distinctive part
};

void PrintTo(const BadConfig& bad, std::ostream* out) { *out << bad.json; }

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, IsRejectedWithPathAndExpectation) {
  const BadConfig& bad = GetParam();
  try {
    ParseJobConfig(bad.json, true);
    FAIL() << "accepted: " << bad.json;
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find(bad.expected_message), std::string::npos)
        << "message: " << error.what() << "\nexpected to contain: " << bad.expected_message;
  }
}

const char* kOk = R"("runtime": {"start_commands": ["true"]})";

std::string WithRuntime(const std::string& extra) {
  return std::string(R"({"runtime": {"start_commands": ["true"], )") + extra + "}}";
}

std::vector<BadConfig> BadConfigs() {
  static std::deque<std::string> storage;  // stable addresses for the c_str() below
  auto keep = [](std::string text) { storage.push_back(std::move(text)); return storage.back().c_str(); };
  return {
      {"[1, 2]", "(top level): expected an object, got a array"},
      {"{\"runtime\": ", "(document): expected valid JSON"},
      {keep(std::string("{") + kOk + R"(, "colour": "red"})"), "colour: unknown key"},
      {R"({"runtime": {}})", "runtime.start_commands: expected at least one command"},
      {R"({"runtime": {"start_commands": "train.sh"}})", "runtime.start_commands: expected a list of strings, got a string"},
      {R"({"runtime": {"start_commands": [""]}})", "runtime.start_commands[0]: expected a non-empty string"},
      {R"({"runtime": {"start_commands": ["a", 7]}})", "runtime.start_commands[1]: expected a string, got an integer"},
      {keep(WithRuntime(R"("environment_variables": {"HF_TOKEN": 5})")),
       "runtime.environment_variables.HF_TOKEN: expected a string or {\"name\": SECRET}, got an integer"},
      {keep(WithRuntime(R"("environment_variables": {"HF_TOKEN": {"secret": "x"}})")),
       "runtime.environment_variables.HF_TOKEN.secret: unknown key"},
      {keep(WithRuntime(R"("environment_variables": {"HF_TOKEN": {}})")),
       "runtime.environment_variables.HF_TOKEN.name: required field is missing"},
      {keep(WithRuntime(R"("environment_variables": {"HF_TOKEN": {"name": "../etc/passwd"}})")),
       "runtime.environment_variables.HF_TOKEN.name: expected a secret name without '/'"},
      {keep(WithRuntime(R"("environment_variables": {"1BAD": "x"})")),
       "runtime.environment_variables.1BAD: expected a variable name"},
      {keep(WithRuntime(R"("environment_variables": ["A=1"])")),
       "runtime.environment_variables: expected an object of NAME: value, got a array"},
      {keep(WithRuntime(R"("enable_cache": true, "cache_config": {"enabled": true})")),
       "runtime.enable_cache: cannot be set together with cache_config"},
      {keep(WithRuntime(R"("cache_config": {"enabled": "yes"})")), "runtime.cache_config.enabled: expected true or false, got a string"},
      {keep(WithRuntime(R"("cache_config": {"mount_base_path": "cache"})")),
       "runtime.cache_config.mount_base_path: expected an absolute path, got \"cache\""},
      {keep(WithRuntime(R"("checkpointing_config": {"enabled": true, "checkpoint_path": "ckpts"})")),
       "runtime.checkpointing_config.checkpoint_path: expected an absolute path"},
      {keep(WithRuntime(R"("checkpointing_config": {"volume_size_gib": 0})")),
       "runtime.checkpointing_config.volume_size_gib: expected an integer in [1, 1048576], got 0"},
      {keep(WithRuntime(R"("checkpointing_config": {"enabled": true, "upload": "s3://x"})")),
       "runtime.checkpointing_config.upload: unknown key"},
      {keep(WithRuntime(R"("load_checkpoint_config": {"enabled": true, "checkpoints": [{"job_id": "x"}]})")),
       "runtime.load_checkpoint_config.checkpoints[0].typ: required field is missing"},
      {keep(WithRuntime(R"("load_checkpoint_config": {"checkpoints": [{"typ": "baseten_latest_checkpoint"}]})")),
       "runtime.load_checkpoint_config.checkpoints[0].job_id: required"},
      {keep(WithRuntime(R"("load_checkpoint_config": {"checkpoints": [{"typ": "baseten_latest_checkpoint", "job_id": "../x"}]})")),
       "runtime.load_checkpoint_config.checkpoints[0].job_id: job id \"../x\" is not usable as a path component"},
      {keep(WithRuntime(R"("load_checkpoint_config": {"checkpoints": [{"typ": "baseten_named_checkpoint", "job_id": ".j", "checkpoint_name": "c"}]})")),
       "runtime.load_checkpoint_config.checkpoints[0].job_id: job id \".j\" is not usable as a path component"},
      {keep(R"({"launcher": {"job_id": "a/b"}})"), "launcher.job_id: job id \"a/b\" is not usable as a path component"},
      {keep(WithRuntime(R"("load_checkpoint_config": {"checkpoints": [{"typ": "loops_checkpoint", "run_id": "r"}]})")),
       "runtime.load_checkpoint_config.checkpoints[0].typ: expected one of baseten_latest_checkpoint, baseten_named_checkpoint"},
      {keep(R"({"launcher": {"checkpoint": {"drain_timeout_s": 0}}})"),
       "launcher.checkpoint.drain_timeout_s: expected a number of seconds > 0"},
      {keep(R"({"launcher": {"checkpoint": {"marker": "a/b"}}})"),
       "launcher.checkpoint.marker: expected a file name without '/'"},
      {keep(R"({"launcher": {"checkpoint": {"watch": "fanotify"}}})"),
       "launcher.checkpoint.watch: expected one of auto, inotify, poll"},
      {keep(R"({"runtime": {"start_commands": ["a"], "checkpointing_config": {"enabled": true, "enabled": false}}})"),
       "runtime.checkpointing_config.enabled: duplicate key"},
      {keep(R"({"weights": [{"source": "hf://a/b", "mount_location": "/m", "source": "hf://c/d"}]})"),
       "weights[].source: duplicate key"},
      {keep(R"({"name": "a", "name": "b"})"), "name: duplicate key"},
      {keep(R"({"launcher": {"rendezvous": {"heartbeat_interval_s": 0.0004}}})"),
       "launcher.rendezvous.heartbeat_interval_s: expected at least 0.001 s (1 ms)"},
      {keep(R"({"launcher": {"weights": {"mode": "download"}}})"),
       "launcher.weights.mode: expected one of auto, stage, wait"},
      {keep(R"({"launcher": {"weights": {"timeout_s": -1}}})"), "launcher.weights.timeout_s: expected a number of seconds > 0"},
      {keep(R"({"launcher": {"cache": {"seed_commands": ["ok", ""]}}})"),
       "launcher.cache.seed_commands[1]: expected a non-empty string"},
      {keep(R"({"launcher": {"cache": {"lease_s": 0}}})"), "launcher.cache.lease_s: expected a number of seconds > 0"},
      {keep(R"({"launcher": {"checkpoint": {"bucket": "x"}}})"),
       "launcher.checkpoint.bucket: unknown key"},
      {keep(WithRuntime(R"("load_checkpoint_config": {"checkpoints": [{"typ": "baseten_named_checkpoint", "job_id": "j"}]})")),
       "runtime.load_checkpoint_config.checkpoints[0].checkpoint_name: required field is missing"},
      {keep(WithRuntime(R"("load_checkpoint_config": {"checkpoints": [{"typ": "newest"}]})")),
       "runtime.load_checkpoint_config.checkpoints[0].typ: expected one of"},
      {keep(WithRuntime(R"("load_checkpoint_config": {"download_folder": "./dl"})")),
       "runtime.load_checkpoint_config.download_folder: expected an absolute path"},
      {keep(std::string(R"({"compute": {"node_count": 0}, )") + kOk + "}"),
       "compute.node_count: expected an integer in [1, 65536], got 0"},
      {keep(std::string(R"({"compute": {"node_count": 2.5}, )") + kOk + "}"),
       "compute.node_count: expected an integer in [1, 65536], got a number"},
      {keep(std::string(R"({"compute": {"node_count": "2"}, )") + kOk + "}"),
       "compute.node_count: expected an integer in [1, 65536], got a string"},
      {keep(std::string(R"({"compute": {"accelerator": "X100:8"}, )") + kOk + "}"),
       "compute.accelerator: unknown accelerator \"X100\""},
      {keep(std::string(R"({"compute": {"accelerator": "H100:eight"}, )") + kOk + "}"),
       "compute.accelerator: expected \"TYPE:COUNT\""},
      {keep(std::string(R"({"compute": {"accelerator": {"accelerator": "H100", "count": -1}}, )") + kOk + "}"),
       "compute.accelerator.count: expected an integer in [0, 1024], got -1"},
      {keep(std::string(R"({"compute": {"availability_model": "preemptible"}, )") + kOk + "}"),
       "compute.availability_model: expected one of dedicated, spot"},
      {keep(std::string(R"({"compute": {"gpus": 8}, )") + kOk + "}"), "compute.gpus: unknown key"},
      {keep(std::string(R"({"weights": [{"source": "hf://org/model", "mount_location": "models/m"}], )") + kOk + "}"),
       "weights[0].mount_location: expected an absolute path"},
      {keep(std::string(R"({"weights": [{"source": "hf://a", "mount_location": "/m"}, {"source": "hf://b", "mount_location": "/m/"}], )") + kOk + "}"),
       "weights[1].mount_location: duplicate mount location \"/m\" (also weights[0])"},
      {keep(std::string(R"({"weights": [{"source": "ftp://host/x", "mount_location": "/m"}], )") + kOk + "}"),
       "weights[0].source: expected a URI with scheme"},
      {keep(std::string(R"({"weights": [{"source": "s3://bucket/x@v2", "mount_location": "/m"}], )") + kOk + "}"),
       "weights[0].source: a @revision is allowed only for hf:// sources"},
      {keep(std::string(R"({"weights": [{"source": "s3:///x", "mount_location": "/m"}], )") + kOk + "}"),
       "weights[0].source: expected s3://bucket/path"},
      {keep(std::string(R"({"weights": [{"mount_location": "/m"}], )") + kOk + "}"),
       "weights[0].source: required field is missing"},
      {keep(std::string(R"({"weights": [{"source": "hf://a", "mount_location": "/m", "auth": {"auth_method": "AWS_OIDC"}}], )") + kOk + "}"),
       "weights[0].auth.auth_method: expected one of CUSTOM_SECRET"},
      {keep(std::string(R"({"weights": {"source": "hf://a"}, )") + kOk + "}"), "weights: expected a list of weight sources, got a object"},
      {keep(std::string(R"({"image": {"docker_auth": {"auth_method": "X", "registry": "r"}}, )") + kOk + "}"),
       "image.base_image: required field is missing"},
      {keep(std::string(R"({"interactive_session": {"trigger": "always"}, )") + kOk + "}"),
       "interactive_session.trigger: expected one of on_demand, on_failure, on_startup"},
      {keep(std::string(R"({"enable_baseten_workdir": 1, )") + kOk + "}"), "enable_baseten_workdir: expected true or false, got an integer"},
      {keep(std::string(R"({"launcher": {"grace_period_s": -1}, )") + kOk + "}"),
       "launcher.grace_period_s: expected a number of seconds in [0, 86400], got -1"},
      {keep(std::string(R"({"launcher": {"rendezvous": {"port": 70000}}, )") + kOk + "}"),
       "launcher.rendezvous.port: expected an integer in [1, 65535], got 70000"},
      {keep(std::string(R"({"launcher": {"rendezvous": {"backend": "etcd"}}, )") + kOk + "}"),
       "launcher.rendezvous.backend: expected one of mpi, tcp, got \"etcd\""},
      {keep(std::string(R"({"launcher": {"rendezvous": {"heartbeat_interval_s": 5, "heartbeat_timeout_s": 6}}, )") + kOk + "}"),
       "launcher.rendezvous.heartbeat_timeout_s: expected at least twice heartbeat_interval_s"},
      {keep(std::string(R"({"launcher": {"rendezvous": {"join_timeout_s": 0}}, )") + kOk + "}"),
       "launcher.rendezvous.join_timeout_s: expected an integer in [1, 604800], got 0"},
      {keep(std::string(R"({"launcher": {"rendezvous_port": 1}, )") + kOk + "}"), "launcher.rendezvous_port: unknown key"},
      {keep(std::string(R"({"name": "", )") + kOk + "}"), "name: expected a non-empty string"},
      {keep(std::string(R"({"launcher": {"restart": {"max_restarts": -1}}, )") + kOk + "}"),
       "launcher.restart.max_restarts: expected an integer in [0, 10000], got -1"},
      {keep(std::string(R"({"launcher": {"restart": {"rejoin_timeout_s": 0}}, )") + kOk + "}"),
       "launcher.restart.rejoin_timeout_s: expected a number of seconds > 0, got 0"},
      {keep(std::string(R"({"launcher": {"restart": {"max_cycles_without_progress": 0}}, )") + kOk + "}"),
       "launcher.restart.max_cycles_without_progress: expected an integer in [1, 10000], got 0"},
      {keep(std::string(R"({"launcher": {"restart": {"max_restart": 1}}, )") + kOk + "}"), "launcher.restart.max_restart: unknown key"},
      {keep(std::string(R"({"launcher": {"watchdog": {"stall_timeout_s": "never"}}, )") + kOk + "}"),
       "launcher.watchdog.stall_timeout_s: expected \"auto\" or a number of seconds (0: off)"},
      {keep(std::string(R"({"launcher": {"watchdog": {"stall_timeout_s": -5}}, )") + kOk + "}"),
       "launcher.watchdog.stall_timeout_s: expected a number of seconds in [0, 1e7] (0: off), got -5"},
      {keep(std::string(R"({"launcher": {"watchdog": {"startup_timeout_s": "1h"}}, )") + kOk + "}"),
       "launcher.watchdog.startup_timeout_s: expected a number of seconds in [0, 1e7] (0: off), got \"1h\""},
      {keep(std::string(R"({"launcher": {"watchdog": {"auto_min_s": 0}}, )") + kOk + "}"),
       "launcher.watchdog.auto_min_s: expected a number of seconds > 0, got 0"},
      {keep(std::string(R"({"launcher": {"watchdog": {"report_dir": ""}}, )") + kOk + "}"), "launcher.watchdog.report_dir"},
      {keep(std::string(R"({"launcher": {"watchdog": {"stall_timeout": 5}}, )") + kOk + "}"),
       "launcher.watchdog.stall_timeout: unknown key"},
      {keep(std::string(R"({"launcher": {"progress": {"step_pattern": "step \\d+"}}, )") + kOk + "}"),
       "launcher.progress.step_pattern: expected exactly one group (the step number), got 0"},
      {keep(std::string(R"({"launcher": {"progress": {"step_pattern": "(epoch (\\d+)) step"}}, )") + kOk + "}"),
       "launcher.progress.step_pattern: expected exactly one group (the step number), got 2"},
      {keep(std::string(R"({"launcher": {"progress": {"step_pattern": "step (\\d+"}}, )") + kOk + "}"),
       "launcher.progress.step_pattern: not a regular expression"},
      {keep(std::string(R"({"launcher": {"progress": {"straggler_ratio": 1}}, )") + kOk + "}"),
       "launcher.progress.straggler_ratio: expected a number above 1 (1.2: 20% slower), got 1"},
      {keep(std::string(R"({"launcher": {"metrics": {"port": 0}}, )") + kOk + "}"),
       "launcher.metrics.port"},
      {keep(std::string(R"({"launcher": {"metrics": {"port": "9400"}}, )") + kOk + "}"),
       "launcher.metrics.port"},
      {keep(std::string(R"({"launcher": {"metrics": {"path": "/m"}}, )") + kOk + "}"),
       "launcher.metrics.path: unknown key"},
      {keep(std::string(R"({"launcher": {"metrics": {"port": 29500}}, )") + kOk + "}"),
       "launcher.metrics.port: 29500 is also a MASTER_PORT of the training (launcher.master_port 29500)"},
      {keep(std::string(R"({"launcher": {"metrics": {"port": 29515}, "restart": {"max_restarts": 1}}, )") + kOk + "}"),
       "launcher.metrics.port: 29515 is also a MASTER_PORT of the training (launcher.master_port 29500 to 29515, one per "
       "restart cycle)"},
      {keep(std::string(R"({"launcher": {"metrics": {"port": 29400}, "rendezvous": {"port": 29400}}, )") + kOk + "}"),
       "launcher.metrics.port: 29400 is also launcher.rendezvous.port"},
      {keep(std::string(R"({"launcher": {"health": {"enabled": "yes"}}, )") + kOk + "}"),
       "launcher.health.enabled: expected \"auto\", true or false"},
      {keep(std::string(R"({"launcher": {"health": {"interval_s": 0}}, )") + kOk + "}"),
       "launcher.health.interval_s: expected a number of seconds in [0.1, 86400], got 0"},
      {keep(std::string(R"({"launcher": {"health": {"expect_gpus": 8.5}}, )") + kOk + "}"),
       "launcher.health.expect_gpus: expected \"auto\" or a number of GPUs"},
      {keep(std::string(R"({"launcher": {"health": {"expect_gpus": -1}}, )") + kOk + "}"),
       "launcher.health.expect_gpus: expected an integer in [0, 1024], got -1"},
      {keep(std::string(R"({"launcher": {"health": {"on_unhealthy": "reboot"}}, )") + kOk + "}"),
       "launcher.health.on_unhealthy"},
      {keep(std::string(R"({"launcher": {"spares": -1}, )") + kOk + "}"), "launcher.spares: expected an integer in [0, 1024]"},
      {keep(std::string(R"({"launcher": {"spares": 1}, )") + kOk + "}"),
       "launcher.spares: 1 spare(s) need launcher.restart.max_restarts above 0"},
      {keep(std::string(R"({"launcher": {"spares": 1, "restart": {"max_restarts": 1}, "rendezvous": {"backend": "mpi"}}, )") +
            kOk + "}"),
       "launcher.spares: the mpi rendezvous backend"},
      {keep(std::string(R"({"launcher": {"restart": {"max_failures_per_node": 0}}, )") + kOk + "}"),
       "launcher.restart.max_failures_per_node: expected an integer in [1, 10000], got 0"},
  };
}

INSTANTIATE_TEST_SUITE_P(Config, BadConfigTest, ::testing::ValuesIn(BadConfigs()),
                         [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(JobConfig, ParsesAFullTrainingJob) {
  JobConfig config = ParseJobConfig(R"({
    "name": "llama-sft",
    "image": {"base_image": "pytorch/pytorch:2.4.0"},
    "compute": {"node_count": 2, "accelerator": "H100:8", "availability_model": "spot"},
    "runtime": {
      "start_commands": ["pip install -r requirements.txt", "./run.sh"],
      "environment_variables": {"WANDB_PROJECT": "sft", "HF_TOKEN": {"name": "hf_access_token"}},
      "cache_config": {"enabled": true, "mount_base_path": "/cache"},
      "checkpointing_config": {"enabled": true, "checkpoint_path": "/ckpt", "volume_size_gib": 700},
      "load_checkpoint_config": {"enabled": true, "checkpoints": [{"typ": "baseten_latest_checkpoint", "job_id": "abc"}]}
    },
    "weights": [{"source": "hf://meta-llama/Llama-3.1-8B@main", "mount_location": "/app/models/llama"}],
    "launcher": {"grace_period_s": 120, "rendezvous": {"port": 29311, "join_timeout_s": 60, "backend": "mpi"}}
  })", true);
  EXPECT_EQ(config.name, "llama-sft");
  EXPECT_EQ(config.compute.node_count, 2);
  ASSERT_TRUE(config.compute.accelerator);
  EXPECT_EQ(config.compute.accelerator->type, "H100");
  EXPECT_EQ(config.compute.accelerator->count, 8);
  EXPECT_EQ(config.runtime.start_commands.size(), 2u);
  EXPECT_EQ(config.runtime.environment_variables.at("WANDB_PROJECT").literal, "sft");
  EXPECT_EQ(config.runtime.environment_variables.at("HF_TOKEN").secret_name, "hf_access_token");
  EXPECT_TRUE(config.runtime.cache_config.enabled);
  EXPECT_EQ(config.runtime.cache_config.mount_base_path, "/cache");
  EXPECT_EQ(config.runtime.checkpointing_config.checkpoint_path, "/ckpt");
  ASSERT_EQ(config.runtime.load_checkpoint_config.checkpoints.size(), 1u);
  EXPECT_EQ(config.runtime.load_checkpoint_config.checkpoints[0].job_id, "abc");
  EXPECT_EQ(config.weights.at(0).mount_location, "/app/models/llama");
  EXPECT_DOUBLE_EQ(config.launcher.grace_period_s, 120);
  EXPECT_EQ(config.launcher.rendezvous.port, 29311);
  EXPECT_EQ(config.launcher.rendezvous.backend, RendezvousBackend::kMpi);
}

TEST(JobConfig, DefaultsMatchThePlatform) {
  JobConfig config = DefaultJobConfig();
  EXPECT_EQ(config.compute.node_count, 1);
  EXPECT_TRUE(config.enable_baseten_workdir);
  EXPECT_FALSE(config.runtime.cache_config.enabled);
  EXPECT_TRUE(config.runtime.cache_config.require_cache_affinity);
  EXPECT_FALSE(config.runtime.checkpointing_config.enabled);
  EXPECT_DOUBLE_EQ(config.launcher.grace_period_s, 30);
  EXPECT_EQ(config.launcher.rendezvous.port, 29300);
  EXPECT_EQ(config.launcher.rendezvous.join_timeout_s, 900);
  EXPECT_EQ(config.launcher.restart.max_restarts, 0);
  EXPECT_DOUBLE_EQ(config.launcher.restart.rejoin_timeout_s, 600);
  EXPECT_EQ(config.launcher.restart.max_cycles_without_progress, 3);
  EXPECT_FALSE(config.launcher.watchdog.stall_timeout_s);  // auto
  EXPECT_DOUBLE_EQ(config.launcher.watchdog.auto_min_s, 900);
  EXPECT_DOUBLE_EQ(config.launcher.watchdog.startup_timeout_s, 3600);
  EXPECT_TRUE(config.launcher.watchdog.enabled());
}

TEST(JobConfig, ReadsTheWatchdogSettings) {
  JobConfig config = ParseJobConfig(std::string(R"({"launcher": {"watchdog": {"stall_timeout_s": 120, "auto_min_s": 60,
                                                   "startup_timeout_s": 0, "stack_timeout_s": 5, "report_dir": "/logs"}}, )") +
                                        kOk + "}",
                                    true);
  EXPECT_EQ(config.launcher.watchdog.stall_timeout_s, 120);
  EXPECT_DOUBLE_EQ(config.launcher.watchdog.startup_timeout_s, 0);
  EXPECT_DOUBLE_EQ(config.launcher.watchdog.stack_timeout_s, 5);
  EXPECT_EQ(config.launcher.watchdog.report_dir, "/logs");
  config = ParseJobConfig(std::string(R"({"launcher": {"watchdog": {"stall_timeout_s": 0, "startup_timeout_s": 0}}, )") + kOk + "}",
                          true);
  EXPECT_FALSE(config.launcher.watchdog.enabled());
  config = ParseJobConfig(std::string(R"({"launcher": {"watchdog": {"stall_timeout_s": "auto"}}, )") + kOk + "}", true);
  EXPECT_FALSE(config.launcher.watchdog.stall_timeout_s);
}

TEST(JobConfig, ReadsTheRestartSettings) {
  JobConfig config = ParseJobConfig(std::string(R"({"launcher": {"restart": {"max_restarts": 2, "rejoin_timeout_s": 30,
                                                   "max_cycles_without_progress": 1}}, )") + kOk + "}", true);
  EXPECT_EQ(config.launcher.restart.max_restarts, 2);
  EXPECT_DOUBLE_EQ(config.launcher.restart.rejoin_timeout_s, 30);
  EXPECT_EQ(config.launcher.restart.max_cycles_without_progress, 1);
}

TEST(JobConfig, DeprecatedEnableCacheBecomesCacheConfig) {
  JobConfig config = ParseJobConfig(R"({"runtime": {"start_commands": ["x"], "enable_cache": true}})", true);
  EXPECT_TRUE(config.runtime.cache_config.enabled);
  EXPECT_TRUE(config.runtime.cache_config.enable_legacy_hf_mount);
}

TEST(JobConfig, NullMeansAbsentForOptionalFields) {
  JobConfig config = ParseJobConfig(R"({"name": null, "runtime": {"start_commands": ["x"], "cache_config": null}})", true);
  EXPECT_FALSE(config.name);
  EXPECT_FALSE(config.runtime.cache_config.enabled);
}

// Every record that names the job is JSON: a job id that is not UTF-8 made writing them throw.
TEST(JobConfig, AJobIdIsOneComponentOfUtf8Text) {
  for (const std::string good : {"job-1", "trainingjob_abc", "ünïcode", "a..b"}) {
    EXPECT_NO_THROW(ValidateJobId(good, "BT_TRAINING_JOB_ID")) << good;
  }
  for (const std::string& bad : std::vector<std::string>{"", "..", ".", ".hidden", "a/b", "../x", std::string("a\0b", 3), "job-\xff"}) {
    try {
      ValidateJobId(bad, "BT_TRAINING_JOB_ID");
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const ConfigError& error) {
      EXPECT_EQ(std::string(error.what()).rfind("BT_TRAINING_JOB_ID: job id ", 0), 0u) << error.what();
    }
  }
}

TEST(JobConfig, StartCommandMayComeFromTheCommandLine) {
  EXPECT_NO_THROW(ParseJobConfig("{}", false));
  EXPECT_THROW(ParseJobConfig("{}", true), ConfigError);
}

TEST(JobConfig, SameTextSameDigest) {
  EXPECT_EQ(ParseJobConfig("{}", false).source_digest, ParseJobConfig("{}", false).source_digest);
  EXPECT_NE(ParseJobConfig("{}", false).source_digest, ParseJobConfig(R"({"name": "x"})", false).source_digest);
}

TEST(JobConfig, LoadsInlineJsonFromTheEnvironment) {
  JobConfig config = LoadJobConfig(std::nullopt, R"(  {"name": "inline", "runtime": {"start_commands": ["x"]}})", true);
  EXPECT_EQ(config.name, "inline");
}

TEST(JobConfig, MissingFileIsNamed) {
  try {
    LoadJobConfig(std::string("/nonexistent/job.json"), nullptr, true);
    FAIL();
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent/job.json: cannot read config file"), std::string::npos);
  }
}

TEST(JobConfig, ErrorsFromAFileNameTheFile) {
  try {
    LoadJobConfig(std::nullopt, "/nonexistent/from-env.json", true);
    FAIL();
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent/from-env.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace bt::env
