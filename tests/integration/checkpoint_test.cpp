// Checkpoint handoff through the real binary: trainings written as shell scripts that save
// the way frameworks do, a file:// destination the test can break and repair, and the
// launcher killed, stopped and restarted. Every process is bounded and reaped.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "storage/commit_record.h"
#include "tests/support/launcher_process.h"

namespace bt::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr const char* kJob = "ckpt-job";

// A start command that saves checkpoint-N in the Hugging Face Trainer's order, in
// `subdirectory` of BT_CHECKPOINT_DIR when one is given ("run1/").
std::string HfSave(int step, const std::string& weights_bytes = "200000", const std::string& subdirectory = "") {
  std::string dir = "$BT_CHECKPOINT_DIR/" + subdirectory + "checkpoint-" + std::to_string(step);
  return "mkdir -p " + dir + " && head -c " + weights_bytes + " /dev/urandom > " + dir + "/model.safetensors.bin && echo '{}' > " +
         dir + "/config.json && echo '{\"global_step\": " + std::to_string(step) + "}' > " + dir + "/trainer_state.json";
}

class CheckpointJob : public ::testing::Test {
 protected:
  std::string Remote() const { return dir_.path() + "/remote"; }
  // Where node `rank`'s committed part of checkpoint `name` is under `remote`: the version
  // its commit record names (rank-<r>/ itself for a checkpoint committed without one).
  std::string Part(const std::string& name, int rank = 0, const std::string& remote = "") const {
    const std::string base = remote.empty() ? Remote() : remote;
    const std::string record = base + "/" + storage::CommitRecordPath(kJob, name);
    if (!fs::exists(record)) return base + "/" + kJob + "/rank-" + std::to_string(rank);
    storage::CommitRecord commit = storage::CommitRecord::FromText(ReadFile(record), record);
    auto root = storage::PartRoot(commit, rank);
    return root ? base + "/" + *root : base + "/no-part-for-rank-" + std::to_string(rank);
  }
  std::string CheckpointDir(int rank = 0) const { return dir_.path() + "/root/node-" + std::to_string(rank) + "/mnt/ckpts"; }

  std::string Config(const std::vector<std::string>& commands, const std::string& destination = "",
                     double drain_timeout_s = 30, const std::string& extra_runtime = "") {
    nlohmann::json config = {
        {"runtime", {{"start_commands", commands}, {"checkpointing_config", {{"enabled", true}}}}},
        {"launcher",
         {{"job_id", kJob},
          {"grace_period_s", 5},
          {"checkpoint",
           {{"destination", destination.empty() ? "file://" + Remote() : destination},
            {"drain_timeout_s", drain_timeout_s},
            {"scan_interval_s", 0.5},
            {"quiet_period_s", 2}}}}}};
    if (!extra_runtime.empty()) config["runtime"].update(nlohmann::json::parse(extra_runtime));
    return dir_.Write("job-" + std::to_string(++configs_) + ".json", config.dump());
  }

  LaunchSpec Run(const std::string& config, std::chrono::milliseconds timeout = 60s) {
    return {{"run", "--config", config, "--root", dir_.path() + "/root"}, {}, {"BT_JOB_CONFIG"}, std::nullopt, timeout};
  }

  std::string Latest() const { return ReadFile(Remote() + "/" + kJob + "/latest"); }
  void RunTwoNodesSavingOneCheckpoint(const std::string& subdirectory);
  std::pair<ProcessResult, ProcessResult> RunTwoNodes(const std::string& node0, const std::string& node1,
                                                      double drain_timeout_s = 30);

  ProcessResult Checkpoints(bool verify) {
    LaunchSpec spec{{"checkpoints", "--config", dir_.path() + "/job-1.json", "--root", dir_.path() + "/root", "--format", "json"}};
    if (verify) spec.args.push_back("--verify");
    return RunLauncher(spec);
  }

  TempDir dir_;
  int configs_ = 0;
};

TEST_F(CheckpointJob, CommitsEveryCheckpointEvenWhenRotationDeletesItRightAway) {
  // save_total_limit=1: the Trainer deletes the older checkpoint right after the next save
  // (a save takes a moment: the sleeps stand for the training steps in between).
  std::string config = Config({HfSave(1) + " && sleep 0.3 && " + HfSave(2) + " && rm -rf $BT_CHECKPOINT_DIR/checkpoint-1 && sleep 0.3 && " +
                               HfSave(3) + " && rm -rf $BT_CHECKPOINT_DIR/checkpoint-2"});
  ProcessResult result = RunLauncher(Run(config));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(Latest(), "checkpoint-3\n");
  for (int step = 1; step <= 3; ++step) {
    const std::string name = "checkpoint-" + std::to_string(step);
    EXPECT_EQ(fs::file_size(Part(name) + "/" + name + "/model.safetensors.bin"), 200000u) << name;
    EXPECT_TRUE(fs::exists(Part(name) + "/" + name + ".bt-manifest.json")) << name;
  }
  ProcessResult listing = Checkpoints(true);
  ASSERT_EQ(listing.exit_code, 0) << listing.err;
  auto json = nlohmann::json::parse(listing.out);
  EXPECT_EQ(json["latest"], "checkpoint-3");
  ASSERT_EQ(json["checkpoints"].size(), 3u);
  for (const auto& row : json["checkpoints"]) EXPECT_TRUE(row["verified"].get<bool>()) << row.dump();
  EXPECT_TRUE(fs::is_empty(CheckpointDir() + "/.bt-checkpoint/staging")) << "staging is emptied after the upload";
}

// Linux names are bytes: "notes-\xff.txt" made the agent thread throw (the launcher aborted,
// exit 134) and the journal kept it with U+FFFD, so a restart could never upload it.
TEST_F(CheckpointJob, ANameThatIsNotUtf8IsCommittedByteForByte) {
  const std::string odd = "notes-\xff.txt";
  std::string config = Config({"mkdir -p $BT_CHECKPOINT_DIR/checkpoint-1 && printf odd > \"$BT_CHECKPOINT_DIR/checkpoint-1/$(printf 'notes-\\377.txt')\" && " +
                               HfSave(1)});
  ProcessResult result = RunLauncher(Run(config));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(Latest(), "checkpoint-1\n");
  EXPECT_EQ(ReadFile(Part("checkpoint-1") + "/checkpoint-1/" + odd), "odd");
  const std::string journal = ReadFile(CheckpointDir() + "/.bt-checkpoint/journal.jsonl");
  EXPECT_EQ(journal.find("\xef\xbf\xbd"), std::string::npos) << "the journal replaced a byte with U+FFFD";
}

// The job id is joined into every destination path: "../../outside" wrote checkpoints,
// manifests and `latest` outside the destination.
TEST_F(CheckpointJob, AJobIdThatIsNotOnePathComponentIsAConfigError) {
  for (const std::string job_id : {"../../outside", "a/b", ".hidden", "..", "job-\xff"}) {
    LaunchSpec spec = Run(Config({HfSave(1)}));
    spec.set_env["BT_TRAINING_JOB_ID"] = job_id;
    ProcessResult result = RunLauncher(spec);
    EXPECT_EQ(result.exit_code, 65) << job_id << "\n" << result.err;
    EXPECT_NE(result.err.find("BT_TRAINING_JOB_ID"), std::string::npos) << result.err;
  }
  EXPECT_FALSE(fs::exists(dir_.path() + "/outside"));
  EXPECT_FALSE(fs::exists(Remote())) << "something was uploaded";
  nlohmann::json config = nlohmann::json::parse(ReadFile(Config({"true"})));
  config["launcher"]["job_id"] = "../escape";
  ProcessResult from_config = RunLauncher(Run(dir_.Write("bad-id.json", config.dump())));
  EXPECT_EQ(from_config.exit_code, 65) << from_config.err;
  EXPECT_NE(from_config.err.find("launcher.job_id"), std::string::npos) << from_config.err;
}

// `checkpoints --job-id` and a load's job id are joined into destination paths as `run`'s is.
TEST_F(CheckpointJob, AJobIdFromTheCommandLineOrALoadReferenceThatIsNotOnePathComponentIsAConfigError) {
  const std::string config = Config({"true"});
  for (const std::string job_id : {"../x", "a/b", ".hidden", "..", "job-\xff"}) {
    ProcessResult result = RunLauncher({{"checkpoints", "--config", config, "--root", dir_.path() + "/root", "--job-id", job_id}});
    EXPECT_EQ(result.exit_code, 65) << job_id << "\n" << result.err;
    EXPECT_NE(result.err.find("--job-id: job id"), std::string::npos) << job_id << "\n" << result.err;
  }
  LaunchSpec from_environment{{"checkpoints", "--config", config, "--root", dir_.path() + "/root"}};
  from_environment.set_env["BT_TRAINING_JOB_ID"] = "../../outside";
  ProcessResult listing = RunLauncher(from_environment);
  EXPECT_EQ(listing.exit_code, 65) << listing.err;
  EXPECT_NE(listing.err.find("BT_TRAINING_JOB_ID: job id"), std::string::npos) << listing.err;

  for (const std::string typ : {"baseten_latest_checkpoint", "baseten_named_checkpoint"}) {
    nlohmann::json reference = {{"typ", typ}, {"job_id", "../escape"}};
    if (typ == "baseten_named_checkpoint") reference["checkpoint_name"] = "checkpoint-1";
    nlohmann::json load = nlohmann::json::parse(ReadFile(config));
    load["runtime"]["load_checkpoint_config"] = {{"enabled", true}, {"checkpoints", {reference}}};
    ProcessResult result = RunLauncher(Run(dir_.Write("bad-load-" + typ + ".json", load.dump())));
    EXPECT_EQ(result.exit_code, 65) << typ << "\n" << result.err;
    EXPECT_NE(result.err.find("runtime.load_checkpoint_config.checkpoints[0].job_id: job id"), std::string::npos)
        << typ << "\n" << result.err;
  }
  EXPECT_FALSE(fs::exists(dir_.path() + "/escape"));
  EXPECT_FALSE(fs::exists(dir_.path() + "/outside"));
}

// A committed part whose manifest is gone cannot be loaded: `--verify` skipped it, and
// said every checkpoint was verified.
TEST_F(CheckpointJob, VerifyReportsACommittedPartWithoutItsManifest) {
  ProcessResult result = RunLauncher(Run(Config({HfSave(1)})));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::string manifest = Part("checkpoint-1") + "/checkpoint-1.bt-manifest.json";
  ASSERT_TRUE(fs::remove(manifest));
  ProcessResult verified = Checkpoints(true);
  EXPECT_EQ(verified.exit_code, 74) << verified.out << verified.err;
  const std::string relative = manifest.substr(Remote().size() + 1);
  EXPECT_NE(verified.err.find(relative), std::string::npos) << verified.err;
  auto json = nlohmann::json::parse(verified.out);
  ASSERT_EQ(json["checkpoints"].size(), 1u) << json.dump();
  const auto& row = json["checkpoints"][0];
  EXPECT_EQ(row["rank"], 0) << row.dump();
  EXPECT_EQ(row["name"], "checkpoint-1") << row.dump();
  EXPECT_FALSE(row["verified"].get<bool>()) << row.dump();
  EXPECT_NE(row["problems"][0].get<std::string>().find(relative), std::string::npos) << row.dump();
  EXPECT_NE(row["problems"][0].get<std::string>().find("node 0"), std::string::npos) << row.dump();
  ProcessResult listed = Checkpoints(false);
  EXPECT_EQ(listed.exit_code, 0) << "only --verify fails on it:\n" << listed.err;
  EXPECT_NE(listed.err.find(relative), std::string::npos) << listed.err;
}

// Defect 25: the commit record carries its save, so `--verify` fails a record whose parts
// come from two cycles or that lacks a rank (it passed them before); a record of format 1
// (written before) is still read and verified as it was.
TEST_F(CheckpointJob, VerifyFailsARecordMixingCyclesOrLackingARank) {
  ProcessResult result = RunLauncher(Run(Config({HfSave(1)})));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::string path = Remote() + "/" + storage::CommitRecordPath(kJob, "checkpoint-1");
  const storage::CommitRecord record = storage::CommitRecord::FromText(ReadFile(path), path);
  EXPECT_EQ(record.rank_count, 1) << ReadFile(path);
  EXPECT_EQ(record.part_cycles.at(0), record.cycle);
  ProcessResult good = Checkpoints(true);
  EXPECT_EQ(good.exit_code, 0) << good.out << good.err;

  storage::CommitRecord mixed = record;
  mixed.part_cycles[0] = record.cycle + 1;
  WriteFile(path, mixed.ToText());
  ProcessResult verified = Checkpoints(true);
  EXPECT_EQ(verified.exit_code, 74) << verified.out << verified.err;
  EXPECT_NE(verified.out.find("rank 0's part was written in cycle 1"), std::string::npos) << verified.out;

  storage::CommitRecord lacking = record;
  lacking.rank_count = 2;
  WriteFile(path, lacking.ToText());
  verified = Checkpoints(true);
  EXPECT_EQ(verified.exit_code, 74) << verified.out << verified.err;
  EXPECT_NE(verified.out.find("rank 1 has neither a part nor"), std::string::npos) << verified.out;
  // A later job never loads it (rank 1 would have taken its absence for "no part").
  nlohmann::json load = {{"load_checkpoint_config",
                          {{"enabled", true}, {"checkpoints", {{{"typ", "baseten_latest_checkpoint"}, {"job_id", kJob}}}}}}};
  nlohmann::json later = nlohmann::json::parse(ReadFile(Config({"echo ran"}, "", 30, load.dump())));
  later["launcher"]["job_id"] = "later-job";
  ProcessResult loaded = RunLauncher(Run(dir_.Write("later.json", later.dump())));
  EXPECT_EQ(loaded.exit_code, 74) << loaded.err;
  EXPECT_NE(loaded.err.find("is not one save (rank 1 has neither a part nor"), std::string::npos) << loaded.err;

  storage::CommitRecord old_format = record;
  old_format.rank_count = 0;
  WriteFile(path, old_format.ToText());
  ASSERT_NE(ReadFile(path).find(storage::kCommitFormat), std::string::npos);
  ProcessResult old = Checkpoints(true);
  EXPECT_EQ(old.exit_code, 0) << old.out << old.err;
}

// The journal on the checkpoint volume names each version's staging directory. A record
// naming one outside the volume's staging (a corrupt journal, or one from another mount)
// had the launcher upload that directory and then remove it as staging.
TEST_F(CheckpointJob, AJournalRecordNamingAStagingDirectoryElsewhereLeavesItAlone) {
  const std::string victim = dir_.path() + "/victim";
  WriteFile(victim + "/keep.txt", "precious");
  nlohmann::json snapshot = {{"seq", 1},           {"name", "checkpoint-9"}, {"layout", "plain"},
                             {"is_directory", true}, {"staging_dir", victim}, {"pointers", nlohmann::json::object()},
                             {"total_bytes", 8},    {"fingerprint", "f9"},
                             {"files", {{{"path", "keep.txt"}, {"size", 8}, {"mtime_ns", 1}, {"method", "copy"}}}}};
  nlohmann::json record = {{"seq", 1},           {"job_id", kJob},           {"destination", "file://" + Remote()},
                           {"name", "checkpoint-9"}, {"state", "snapshotted"}, {"at", 1},
                           {"snapshot", snapshot}};
  WriteFile(CheckpointDir() + "/.bt-checkpoint/journal.jsonl", record.dump() + "\n");
  ProcessResult result = RunLauncher(Run(Config({"true"})));
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(ReadFile(victim + "/keep.txt"), "precious") << result.err;
  EXPECT_FALSE(fs::exists(Remote() + "/" + kJob + "/latest")) << "a directory outside the staging was uploaded";
}

TEST_F(CheckpointJob, ACheckpointDeletedFileByFileIsNotUploadedAgain) {
  // Rotation removes a committed checkpoint one file at a time, the marker last; each step
  // leaves a "complete" directory with fewer files, which must not replace the upload.
  const std::string dir = "$BT_CHECKPOINT_DIR/checkpoint-1";
  std::string wait_commit = "while [ ! -s " + Remote() + "/" + kJob + "/latest ]; do sleep 0.1; done";
  std::string config = Config({HfSave(1) + " && " + wait_commit + " && rm " + dir + "/model.safetensors.bin && sleep 1.2 && rm " +
                               dir + "/config.json && sleep 1.2 && rm -r " + dir + " && sleep 1"});
  ProcessResult result = RunLauncher(Run(config));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(fs::file_size(Part("checkpoint-1") + "/checkpoint-1/model.safetensors.bin"), 200000u) << "the upload was replaced";
  const std::string manifest = ReadFile(Part("checkpoint-1") + "/checkpoint-1.bt-manifest.json");
  EXPECT_NE(manifest.find("model.safetensors.bin"), std::string::npos) << manifest;
  size_t handoffs = 0;
  for (size_t at = result.err.find("checkpoint-1 is complete"); at != std::string::npos; at = result.err.find("checkpoint-1 is complete", at + 1)) {
    ++handoffs;
  }
  EXPECT_EQ(handoffs, 1u) << result.err;
}

TEST_F(CheckpointJob, PollingFindsCheckpointsWithoutInotify) {
  // What NFS and FUSE volumes get: no events, only the periodic scan.
  nlohmann::json config = nlohmann::json::parse(ReadFile(Config({HfSave(1) + " && sleep 1.5 && " + HfSave(2)})));
  config["launcher"]["checkpoint"]["watch"] = "poll";
  config["launcher"]["checkpoint"]["poll_interval_s"] = 0.5;
  ProcessResult result = RunLauncher(Run(dir_.Write("poll.json", config.dump())));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("(polling)"), std::string::npos) << result.err;
  EXPECT_TRUE(fs::exists(Part("checkpoint-1") + "/checkpoint-1.bt-manifest.json"));
  EXPECT_EQ(Latest(), "checkpoint-2\n");
}

TEST_F(CheckpointJob, CheckpointSavedOnSigtermIsCommitted) {
  // Megatron's exit_signal_handler, Lightning's SIGTERM notifier: save, then exit.
  std::string training = "save_on_stop() { " + HfSave(2) + "; }; trap 'save_on_stop; exit 0' TERM; " + HfSave(1) +
                         "; sleep 60 & wait";
  LauncherProcess launcher(Run(Config({training})));
  ASSERT_TRUE(launcher.WaitForLog("checkpoint-1 is complete", 30s));
  launcher.Signal(SIGTERM);
  ProcessResult result = launcher.Finish();
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(Latest(), "checkpoint-2\n");
  EXPECT_TRUE(fs::exists(Part("checkpoint-2") + "/checkpoint-2/trainer_state.json"));
}

TEST_F(CheckpointJob, TrainingKilledMidSaveLeavesThePreviousCheckpointCommitted) {
  std::string partial = "mkdir -p $BT_CHECKPOINT_DIR/checkpoint-2 $BT_CHECKPOINT_DIR/export && "
                        "head -c 100000 /dev/urandom > $BT_CHECKPOINT_DIR/checkpoint-2/model.safetensors.bin && "
                        "head -c 1000 /dev/urandom > $BT_CHECKPOINT_DIR/export/weights.bin && "
                        "printf 'PK\\003\\004' > $BT_CHECKPOINT_DIR/model.pt && head -c 5000 /dev/urandom >> $BT_CHECKPOINT_DIR/model.pt";
  std::string config = Config({HfSave(1) + " && sleep 1 && " + partial + " && kill -KILL $$"});
  ProcessResult result = RunLauncher(Run(config));
  EXPECT_EQ(result.exit_code, 137) << result.err;
  EXPECT_EQ(Latest(), "checkpoint-1\n");
  for (const std::string name : {"checkpoint-2", "export", "model.pt"}) {
    EXPECT_FALSE(fs::exists(Remote() + "/" + storage::CommitRecordPath(kJob, name))) << name << " was committed";
  }
  EXPECT_TRUE(fs::exists(Part("checkpoint-1") + "/checkpoint-1/trainer_state.json"));
  EXPECT_NE(result.err.find("checkpoint-2 is not complete and will not be uploaded"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("checkpoint checkpoint-1 committed"), std::string::npos) << result.err;
}

TEST_F(CheckpointJob, DestinationDownForAWhileIsRetriedAndCommitted) {
  // A regular file where the destination's directory should be: every upload fails until
  // the training removes it.
  const std::string blocker = dir_.path() + "/blocker";
  WriteFile(blocker);
  std::string config = Config({HfSave(1) + " && sleep 3 && rm " + blocker + " && sleep 1"}, "file://" + blocker + "/remote");
  ProcessResult result = RunLauncher(Run(config));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("cannot upload checkpoint-1 to file://" + blocker + "/remote (attempt 1)"), std::string::npos)
      << result.err;
  EXPECT_EQ(ReadFile(blocker + "/remote/" + kJob + "/latest"), "checkpoint-1\n");
}

TEST_F(CheckpointJob, DestinationGoneForGoodExits74NamingTheCheckpoint) {
  const std::string blocker = dir_.path() + "/blocker";
  WriteFile(blocker);
  std::string config = Config({HfSave(1)}, "file://" + blocker + "/remote", 3);
  ProcessResult result = RunLauncher(Run(config));
  EXPECT_EQ(result.exit_code, 74) << result.err;
  EXPECT_NE(result.err.find("checkpoint checkpoint-1 was not committed before the drain deadline: file://" + blocker +
                            "/remote unavailable"),
            std::string::npos)
      << result.err;
  EXPECT_LT(result.elapsed, 20s);
}

// A job whose own command exits 69 (EX_UNAVAILABLE) is no failure of a peer: its last
// checkpoint left uncommitted is still 74, as for any other code (review 3, D4).
TEST_F(CheckpointJob, AJobsOwnExit69WithItsCheckpointUncommittedExits74) {
  const std::string blocker = dir_.path() + "/blocker";
  WriteFile(blocker);
  std::string config = Config({HfSave(1) + " && exit 69"}, "file://" + blocker + "/remote", 3);
  ProcessResult result = RunLauncher(Run(config));
  EXPECT_EQ(result.exit_code, 74) << result.err;
  EXPECT_NE(result.err.find("checkpoint checkpoint-1 was not committed before the drain deadline"), std::string::npos)
      << result.err;
}

TEST_F(CheckpointJob, LauncherKilledAndRestartedResumesFromTheJournal) {
  // Run 1 commits checkpoint-1, then the destination breaks, checkpoint-2 is saved and
  // rotated away, and the launcher is SIGKILLed before it could upload it. The journal's
  // snapshot is the only copy left: the restarted launcher commits it under its own name,
  // and `latest` stays checkpoint-1, what the job resumed from (review 4, F3).
  const std::string parked = Remote() + ".away";
  std::string wait_commit = "while [ ! -s " + Remote() + "/" + kJob + "/latest ]; do sleep 0.1; done";
  std::string break_remote = "mv " + Remote() + " " + parked + " && touch " + Remote();
  std::string config = Config({HfSave(1) + " && " + wait_commit + " && " + break_remote + " && " + HfSave(2) +
                               " && sleep 0.3 && rm -rf $BT_CHECKPOINT_DIR/checkpoint-2 && echo $$ > " + dir_.path() + "/training.pid && sleep 60"});
  {
    LauncherProcess first(Run(config));
    ASSERT_TRUE(first.WaitForLog("checkpoint-2 is complete", 30s));
    ASSERT_TRUE(first.WaitForLog("cannot upload checkpoint-2", 30s));
    first.Signal(SIGKILL);
    ProcessResult killed = first.Finish();
    EXPECT_EQ(killed.exit_code, 137);
    // The launcher's guard kills the training's group as the launcher dies; should the guard
    // lose the race with this test, nothing may outlive it either.
    const std::string training = ReadFile(dir_.path() + "/training.pid");
    if (!training.empty()) kill(-std::stoi(training), SIGKILL);
  }
  const auto first_upload = fs::last_write_time(Part("checkpoint-1", 0, parked) + "/checkpoint-1.bt-manifest.json");
  fs::remove(Remote());
  fs::rename(parked, Remote());
  std::string restart = Config({"true"});
  ProcessResult result = RunLauncher(Run(restart));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("resuming checkpoint-2 from the journal (snapshotted)"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("committed checkpoint-2: a save of the run before this launcher started"), std::string::npos)
      << result.err;
  EXPECT_EQ(Latest(), "checkpoint-1\n") << "`latest` moved past what the job resumed from";
  EXPECT_EQ(fs::file_size(Part("checkpoint-2") + "/checkpoint-2/model.safetensors.bin"), 200000u);
  EXPECT_EQ(result.err.find("checkpoint-1 is complete"), std::string::npos) << "checkpoint-1 was handed off again";
  EXPECT_EQ(fs::last_write_time(Part("checkpoint-1") + "/checkpoint-1.bt-manifest.json"), first_upload) << "checkpoint-1 re-uploaded";
}

// Review 4, F3 (one node): checkpoint-2 was completed on disk while the launcher was down
// (never snapshotted). The retried launcher resumed the job from checkpoint-1, then
// committed checkpoint-2 as `latest`, and the training's next save moved `latest` back. It
// is committed under its own name (it may be the only copy), `latest` stays checkpoint-1.
TEST_F(CheckpointJob, ACheckpointTheLastRunLeftOnDiskIsCommittedWithoutMovingLatest) {
  const std::string wait_commit = "while [ ! -s " + Remote() + "/" + kJob + "/latest ]; do sleep 0.1; done";
  {
    LauncherProcess first(Run(Config({HfSave(1) + " && " + wait_commit + " && exec sleep 60"})));
    ASSERT_TRUE(first.WaitForLog("committed checkpoint-1", 30s));
    first.Signal(SIGKILL);
    first.Finish();
  }
  WriteFile(CheckpointDir() + "/checkpoint-2/model.safetensors.bin", std::string(1000, 'w'));
  WriteFile(CheckpointDir() + "/checkpoint-2/trainer_state.json", "{\"global_step\": 2}");
  ProcessResult result = RunLauncher(Run(Config({"echo resumed $BT_RESUME_CHECKPOINT"})));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("resumed checkpoint-1"), std::string::npos) << result.out;
  EXPECT_NE(result.err.find("1 checkpoint(s) on disk from before this launcher started are committed under their own"),
            std::string::npos) << result.err;
  EXPECT_TRUE(fs::exists(Remote() + "/" + storage::CommitRecordPath(kJob, "checkpoint-2"))) << result.err;
  EXPECT_EQ(Latest(), "checkpoint-1\n") << "`latest` moved past what the job resumed from";
}

TEST_F(CheckpointJob, FileModifiedAfterCompletionIsNotUploadedAsTheCommittedVersion) {
  // The destination is down while the training rewrites a weights file in place after
  // declaring the checkpoint done: the staged hard link follows the rewrite.
  const std::string blocker = dir_.path() + "/blocker";
  WriteFile(blocker);
  std::string file = "$BT_CHECKPOINT_DIR/checkpoint-1/model.safetensors.bin";
  std::string config = Config({HfSave(1) + " && sleep 1.5 && head -c 1000 /dev/urandom >> " + file + " && rm " + blocker +
                               " && sleep 3"},
                              "file://" + blocker + "/remote");
  ProcessResult result = RunLauncher(Run(config));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("checkpoint-1 was modified after it was declared complete"), std::string::npos) << result.err;
  const std::string remote = Part("checkpoint-1", 0, blocker + "/remote");
  EXPECT_EQ(fs::file_size(remote + "/checkpoint-1/model.safetensors.bin"), 201000u) << "the committed version is the final one";
  auto manifest = nlohmann::json::parse(ReadFile(remote + "/checkpoint-1.bt-manifest.json"));
  for (const auto& entry : manifest["files"]) {
    EXPECT_EQ(fs::file_size(remote + "/checkpoint-1/" + entry["path"].get<std::string>()), entry["size"].get<uint64_t>());
  }
}

TEST_F(CheckpointJob, SigtermDuringAOneGibUploadDrainsItWithinTheDeadline) {
  std::string save = "mkdir -p $BT_CHECKPOINT_DIR/checkpoint-1 && dd if=/dev/zero of=$BT_CHECKPOINT_DIR/checkpoint-1/model.bin "
                     "bs=1M count=1024 status=none && echo '{}' > $BT_CHECKPOINT_DIR/checkpoint-1/trainer_state.json";
  std::string config = Config({save + " && sleep 60"}, "", 60);
  LauncherProcess launcher(Run(config, 120s));
  ASSERT_TRUE(launcher.WaitForLog("checkpoint-1 is complete", 60s));
  launcher.Signal(SIGTERM);
  auto stopped = std::chrono::steady_clock::now();
  ProcessResult result = launcher.Finish();
  EXPECT_EQ(result.exit_code, 143) << result.err;
  EXPECT_LT(std::chrono::steady_clock::now() - stopped, 65s);
  EXPECT_EQ(Latest(), "checkpoint-1\n");
  EXPECT_EQ(fs::file_size(Part("checkpoint-1") + "/checkpoint-1/model.bin"), 1024u << 20);
}

TEST_F(CheckpointJob, TenThousandSmallFilesInOneCheckpoint) {
  std::string save = "mkdir -p $BT_CHECKPOINT_DIR/checkpoint-1/shards && cd $BT_CHECKPOINT_DIR/checkpoint-1/shards && "
                     "i=0; while [ $i -lt 10000 ]; do echo $i > part-$i; i=$((i+1)); done && "
                     "echo '{}' > ../trainer_state.json";
  // Correctness, not speed (bt-launch bench measures that): on a loaded 2-core machine the
  // 10,000 fsynced copies took longer than the usual 30 s drain (CI, 86 s, exit 74).
  ProcessResult result = RunLauncher(Run(Config({save}, "", 150), 200s));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto manifest = nlohmann::json::parse(ReadFile(Part("checkpoint-1") + "/checkpoint-1.bt-manifest.json"));
  EXPECT_EQ(manifest["files"].size(), 10001u);
  EXPECT_EQ(ReadFile(Part("checkpoint-1") + "/checkpoint-1/shards/part-9999"), "9999\n");
  EXPECT_EQ(Latest(), "checkpoint-1\n");
}

TEST_F(CheckpointJob, SymlinksAreNotFollowedOutOfTheVolume) {
  std::string links = "ln -s /etc/passwd $BT_CHECKPOINT_DIR/checkpoint-1/passwd && ln -s /etc $BT_CHECKPOINT_DIR/checkpoint-9";
  ProcessResult result = RunLauncher(Run(Config({HfSave(1) + " && " + links})));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(fs::exists(Part("checkpoint-1") + "/checkpoint-1/config.json"));
  EXPECT_FALSE(fs::exists(Part("checkpoint-1") + "/checkpoint-1/passwd"));
  EXPECT_FALSE(fs::exists(Remote() + "/" + storage::CommitRecordPath(kJob, "checkpoint-9")));
  EXPECT_NE(result.err.find("checkpoint-1/passwd is a symbolic link; links are not followed"), std::string::npos) << result.err;
}

TEST_F(CheckpointJob, SpoolDestinationWaitsForTheSidecarsAck) {
  const std::string spool = dir_.path() + "/spool";
  fs::create_directories(spool);
  std::thread sidecar([&] {  // acknowledges every record it finds, for up to 30 s
    for (int round = 0; round < 300; ++round) {
      for (const auto& entry : fs::directory_iterator(spool)) {
        std::string path = entry.path().string();
        if (path.ends_with(".json") && !fs::exists(path + ".ack")) WriteFile(path + ".ack", "{}");
      }
      if (fs::exists(spool + "/" + kJob + "--latest--1.json.ack")) return;
      std::this_thread::sleep_for(100ms);
    }
  });
  ProcessResult result = RunLauncher(Run(Config({HfSave(1)}, "spool://" + spool)));
  sidecar.join();
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto record = nlohmann::json::parse(ReadFile(spool + "/" + kJob + "--rank-0--1.json"));
  EXPECT_EQ(record["name"], "checkpoint-1");
  const std::string version_root = std::string(kJob) + "/rank-0/.bt-versions/";
  const std::string remote_dir = record["remote_dir"].get<std::string>();
  EXPECT_TRUE(remote_dir.starts_with(version_root) && remote_dir.ends_with("/checkpoint-1")) << remote_dir;
  auto commit = nlohmann::json::parse(ReadFile(spool + "/" + kJob + "--latest--1.json"));
  EXPECT_EQ(commit["name"], "checkpoint-1");
  EXPECT_EQ(commit["commit_path"], storage::CommitRecordPath(kJob, "checkpoint-1"));
  EXPECT_TRUE(commit["move_latest"].get<bool>());
  auto parts = storage::CommitRecord::FromText(commit["commit"].get<std::string>(), "the spool record").parts;
  EXPECT_EQ(version_root + parts.at(0) + "/checkpoint-1", remote_dir) << "the commit names the version the record uploaded";
}

// The uploader SIGKILLed while it publishes `latest` (held there by a sidecar that has not
// acknowledged yet): the restarted uploader was never asked again, and the checkpoint was
// never committed (exit 74).
TEST_F(CheckpointJob, PublishingLatestIsResentToARestartedUploader) {
  const std::string spool = dir_.path() + "/spool";
  fs::create_directories(spool);
  LauncherProcess launcher(Run(Config({HfSave(1)}, "spool://" + spool)));
  std::atomic<bool> killed_uploader = false;
  std::thread sidecar([&] {  // for up to 40 s
    for (int round = 0; round < 400; ++round) {
      for (const auto& entry : fs::directory_iterator(spool)) {
        const std::string path = entry.path().string();
        if (!path.ends_with(".json") || fs::exists(path + ".ack")) continue;
        if (path.find("--latest--") != std::string::npos && !killed_uploader) {
          for (pid_t child : ChildrenOf(launcher.pid())) {
            if (ReadFile("/proc/" + std::to_string(child) + "/cmdline").find("upload-worker") == std::string::npos) continue;
            kill(child, SIGKILL);
            killed_uploader = true;
          }
          fs::remove(path);
          continue;
        }
        WriteFile(path + ".ack", "{}");
        if (path.find("--latest--") != std::string::npos) return;
      }
      std::this_thread::sleep_for(100ms);
    }
  });
  ProcessResult result = launcher.Finish();
  sidecar.join();
  EXPECT_TRUE(killed_uploader);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("committed checkpoint-1"), std::string::npos) << result.err;
}

TEST_F(CheckpointJob, ALaterJobLoadsTheLatestCheckpointByteIdentical) {
  std::string deepspeed = "mkdir -p $BT_CHECKPOINT_DIR/global_step7 && head -c 300000 /dev/urandom > "
                          "$BT_CHECKPOINT_DIR/global_step7/mp_rank_00_model_states.bin && echo global_step7 > $BT_CHECKPOINT_DIR/latest";
  ProcessResult first = RunLauncher(Run(Config({deepspeed})));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(Latest(), "global_step7\n");
  nlohmann::json load = {{"load_checkpoint_config",
                          {{"enabled", true}, {"checkpoints", {{{"typ", "baseten_latest_checkpoint"}, {"job_id", kJob}}}}}}};
  std::string check = "cmp $BT_LOAD_CHECKPOINT_DIR/rank-0/global_step7/mp_rank_00_model_states.bin " + CheckpointDir() +
                      "/global_step7/mp_rank_00_model_states.bin && cat $BT_LOAD_CHECKPOINT_DIR/rank-0/latest";
  nlohmann::json second_config = nlohmann::json::parse(ReadFile(Config({check}, "", 30, load.dump())));
  second_config["launcher"]["job_id"] = "second-job";
  std::string second_path = dir_.Write("second.json", second_config.dump());
  ProcessResult second = RunLauncher(Run(second_path));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.out.find("global_step7"), std::string::npos) << "DeepSpeed's latest is written beside the tag";
  EXPECT_NE(second.err.find("loaded checkpoint global_step7 of job ckpt-job"), std::string::npos) << second.err;
  // The first job's checkpoint, still on this volume, stays the first job's.
  EXPECT_NE(second.err.find("global_step7 was committed by job ckpt-job from this volume; not uploaded again as second-job's"),
            std::string::npos)
      << second.err;
  EXPECT_FALSE(fs::exists(Remote() + "/second-job/rank-0/global_step7")) << "another job's checkpoint uploaded as this job's";

  // The same load from a corrupted upload fails the node, naming the file.
  const std::string remote_file = Part("global_step7") + "/global_step7/mp_rank_00_model_states.bin";
  std::string bytes = ReadFile(remote_file);
  bytes[1000] ^= 1;
  WriteFile(remote_file, bytes);
  ProcessResult corrupt = RunLauncher(Run(second_path));
  EXPECT_EQ(corrupt.exit_code, 74) << corrupt.err;
  EXPECT_NE(corrupt.err.find("is corrupt: mp_rank_00_model_states.bin: XXH3-128"), std::string::npos) << corrupt.err;

  second_config["runtime"]["load_checkpoint_config"]["checkpoints"][0] = {
      {"typ", "baseten_named_checkpoint"}, {"job_id", kJob}, {"checkpoint_name", "global_step99"}};
  ProcessResult missing = RunLauncher(Run(dir_.Write("missing.json", second_config.dump())));
  EXPECT_EQ(missing.exit_code, 74) << missing.err;
  EXPECT_NE(missing.err.find("runtime.load_checkpoint_config.checkpoints[0]: checkpoint global_step99 of job ckpt-job has "
                             "no part for node 0"),
            std::string::npos)
      << missing.err;
}

// The job's own `latest` cannot be read at its start (here a directory where the file should
// be). The launcher ends, naming it, instead of training from scratch over what the job had
// committed (it warned and started from scratch).
TEST_F(CheckpointJob, ALatestThatCannotBeReadAtTheStartEndsTheLaunchInsteadOfStartingFromScratch) {
  fs::create_directories(Remote() + "/" + kJob + "/latest");
  ProcessResult result = RunLauncher(Run(Config({"echo trained"})));
  EXPECT_EQ(result.exit_code, 74) << result.err;
  EXPECT_NE(result.err.find(std::string(kJob) + "/latest"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("not starting from scratch over this job's committed checkpoints"), std::string::npos)
      << result.err;
  EXPECT_EQ(result.out.find("trained"), std::string::npos) << "the training started from scratch";
}

// A load whose transfer never ends (rclone stuck on a dead network) stops at SIGTERM at once:
// rclone killed, the partial download removed, 143. The stuck rclone is a script first in
// PATH that serves `copyto` (latest, the manifest) from a local tree and hangs on `copy`.
TEST_F(CheckpointJob, SigtermDuringAStuckLoadStopsAtOnceAndLeavesNothing) {
  const std::string bucket = dir_.path() + "/s3";
  const std::string deepspeed = "mkdir -p $BT_CHECKPOINT_DIR/global_step7 && head -c 300000 /dev/urandom > "
                                "$BT_CHECKPOINT_DIR/global_step7/mp_rank_00_model_states.bin && echo global_step7 > "
                                "$BT_CHECKPOINT_DIR/latest";
  ProcessResult first = RunLauncher(Run(Config({deepspeed}, "file://" + bucket + "/ckpts/prefix")));
  ASSERT_EQ(first.exit_code, 0) << first.err;

  const std::string bin = dir_.path() + "/bin";
  fs::create_directories(bin);
  const std::string started = dir_.path() + "/copy-started";
  dir_.Write("bin/rclone", "#!/bin/sh\n"  // bt-launch puts the subcommand and its arguments first
                           "case \"$1\" in\n"
                           "  copy) echo $$ > " + started + "; exec sleep 300 ;;\n"
                           "  copyto) cp \"" + bucket + "/${2#btdest:}\" \"$3\" 2>/dev/null || exit 3 ;;\n"
                           "  *) exit 1 ;;\n"
                           "esac\n");
  fs::permissions(bin + "/rclone", fs::perms::owner_all);
  nlohmann::json load = {{"load_checkpoint_config",
                          {{"enabled", true}, {"checkpoints", {{{"typ", "baseten_latest_checkpoint"}, {"job_id", kJob}}}}}}};
  nlohmann::json config = nlohmann::json::parse(ReadFile(Config({"echo trained"}, "s3://ckpts/prefix", 30, load.dump())));
  config["runtime"]["checkpointing_config"]["enabled"] = false;
  LaunchSpec spec = Run(dir_.Write("stuck-load.json", config.dump()));
  spec.set_env = {{"PATH", bin + ":" + std::getenv("PATH")}, {"AWS_ACCESS_KEY_ID", "test-key-id"},
                  {"AWS_SECRET_ACCESS_KEY", "test-secret-key-value"}, {"AWS_REGION", "us-east-1"}};
  LauncherProcess launcher(spec);
  for (int waited = 0; waited < 200 && !fs::exists(started); ++waited) std::this_thread::sleep_for(50ms);
  if (!fs::exists(started)) {
    launcher.Signal(SIGKILL);
    FAIL() << "the download never started: " << launcher.Finish().err;
  }
  const pid_t rclone = std::stoi(ReadFile(started));
  const auto signalled = std::chrono::steady_clock::now();
  launcher.Signal(SIGTERM);
  ProcessResult result = launcher.Finish();
  EXPECT_EQ(result.exit_code, 143) << result.err;
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, 5s) << result.err;
  EXPECT_NE(result.err.find("stopped by Terminated before the start commands"), std::string::npos) << result.err;
  EXPECT_EQ(result.out.find("trained"), std::string::npos) << "the training started";
  EXPECT_NE(kill(rclone, 0), 0) << "rclone is still running";
  const std::string loads = dir_.path() + "/root/node-0/tmp/loaded_checkpoints/rank-0";
  if (fs::exists(loads)) {
    for (const auto& entry : fs::directory_iterator(loads)) ADD_FAILURE() << "left behind: " << entry.path();
  }
}

// The transfer of a load dies (rclone killed, as the crash harness does at random): the load
// is tried again, not the job failed. The rclone is a script first in PATH that serves the
// destination from a local tree and kills itself on its first `copy`.
TEST_F(CheckpointJob, ALoadWhoseTransferIsKilledIsTriedAgain) {
  const std::string bucket = dir_.path() + "/s3";
  const std::string save = "mkdir -p $BT_CHECKPOINT_DIR/global_step7 && head -c 300000 /dev/urandom > "
                           "$BT_CHECKPOINT_DIR/global_step7/model_states.bin && echo global_step7 > $BT_CHECKPOINT_DIR/latest";
  ProcessResult first = RunLauncher(Run(Config({save}, "file://" + bucket + "/ckpts/prefix")));
  ASSERT_EQ(first.exit_code, 0) << first.err;

  const std::string killed_once = dir_.path() + "/killed-once";
  dir_.Write("bin/rclone", "#!/bin/sh\n"  // copy --files-from-raw LIST --no-traverse btdest:DIR LOCAL
                           "case \"$1\" in\n"
                           "  copy) [ -e " + killed_once + " ] || { touch " + killed_once + "; kill -9 $$; }\n"
                           "        while IFS= read -r f; do mkdir -p \"$6/$(dirname \"$f\")\"; "
                           "cp \"" + bucket + "/${5#btdest:}/$f\" \"$6/$f\" || exit 3; done < \"$3\" ;;\n"
                           "  copyto) cp \"" + bucket + "/${2#btdest:}\" \"$3\" 2>/dev/null || exit 3 ;;\n"
                           "  *) exit 1 ;;\n"
                           "esac\n");
  fs::permissions(dir_.path() + "/bin/rclone", fs::perms::owner_all);
  nlohmann::json load = {{"load_checkpoint_config",
                          {{"enabled", true}, {"checkpoints", {{{"typ", "baseten_latest_checkpoint"}, {"job_id", kJob}}}}}}};
  const std::string check = "cmp $BT_LOAD_CHECKPOINT_DIR/rank-0/global_step7/model_states.bin " + CheckpointDir() +
                            "/global_step7/model_states.bin && echo loaded-identical";
  nlohmann::json config = nlohmann::json::parse(ReadFile(Config({check}, "s3://ckpts/prefix", 30, load.dump())));
  config["runtime"]["checkpointing_config"]["enabled"] = false;
  LaunchSpec spec = Run(dir_.Write("killed-load.json", config.dump()));
  spec.set_env = {{"PATH", dir_.path() + "/bin:" + std::getenv("PATH")}, {"AWS_ACCESS_KEY_ID", "test-key-id"},
                  {"AWS_SECRET_ACCESS_KEY", "test-secret-key-value"}, {"AWS_REGION", "us-east-1"}};
  ProcessResult result = RunLauncher(spec);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(fs::exists(killed_once)) << "the first transfer was not killed: " << result.err;
  EXPECT_NE(result.err.find("failed (attempt 1 of 3)"), std::string::npos) << result.err;
  EXPECT_NE(result.out.find("loaded-identical"), std::string::npos) << result.out << result.err;
}

// Saving a checkpoint again under its name: the new version is uploaded to a location of
// its own and made current by its commit record; the committed one is never written again
// (at an rclone destination it was copied over, files first, so a node lost mid-upload left
// `latest` naming files that no longer matched their manifest).
TEST_F(CheckpointJob, ACheckpointSavedAgainNeverModifiesTheCommittedVersion) {
  const std::string trigger = dir_.path() + "/save-again";
  LauncherProcess launcher(Run(Config({HfSave(1) + " && while [ ! -e " + trigger + " ]; do sleep 0.1; done && " +
                                       HfSave(1, "300000") + " && sleep 1"})));
  ASSERT_TRUE(launcher.WaitForLog("committed checkpoint-1", 30s));
  const std::string first = Part("checkpoint-1");
  const std::string first_bytes = ReadFile(first + "/checkpoint-1/model.safetensors.bin");
  const std::string first_manifest = ReadFile(first + "/checkpoint-1.bt-manifest.json");
  WriteFile(trigger);
  ProcessResult result = launcher.Finish();
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::string second = Part("checkpoint-1");
  EXPECT_NE(second, first) << "the second save was uploaded where the committed one is";
  EXPECT_EQ(ReadFile(first + "/checkpoint-1/model.safetensors.bin"), first_bytes) << "the committed version was modified";
  EXPECT_EQ(ReadFile(first + "/checkpoint-1.bt-manifest.json"), first_manifest);
  EXPECT_EQ(fs::file_size(second + "/checkpoint-1/model.safetensors.bin"), 300000u);
  ProcessResult listing = Checkpoints(true);
  ASSERT_EQ(listing.exit_code, 0) << listing.err;
  auto json = nlohmann::json::parse(listing.out);
  ASSERT_EQ(json["checkpoints"].size(), 1u) << "only the committed version is listed";
  EXPECT_GT(json["checkpoints"][0]["bytes"].get<uint64_t>(), 300000u) << "the listed version is the second save: " << json.dump();
  EXPECT_TRUE(json["checkpoints"][0]["verified"].get<bool>()) << json.dump();
}

// Two nodes on loopback with node-local checkpoint disks: node 0 writes the marker, node 1
// only its shard, later. `latest` must wait for node 1's part.
// Node 1 writes its part of checkpoint-1 (under `subdirectory`) after node 0's, and an
// unmarked directory of its own: latest moves once both parts of checkpoint-1 are up.
void CheckpointJob::RunTwoNodesSavingOneCheckpoint(const std::string& subdirectory) {
  const std::string root = "$BT_CHECKPOINT_DIR/" + subdirectory;
  // rng_state_0.pth before trainer_state.json, as the Trainer writes them: written after it,
  // a scan between the two took a first version without it, a second save that node 1 never
  // answers (its one part answered the first), and the drain ran out under load.
  // Node 1 writes its part 0.5 s after node 0's save (a flag file), well within the 2 s it
  // gives a declared save before answering "no part" (a fixed wait from its own start lost
  // that race on a busy machine).
  const std::string saved = dir_.path() + "/node0-saved-" + std::to_string(configs_);
  const std::string node0 = "mkdir -p " + root + "checkpoint-1 && echo r0 > " + root + "checkpoint-1/rng_state_0.pth && " +
                            HfSave(1, "200000", subdirectory) + " && touch " + saved + " && sleep 3";
  const std::string node1 = "for i in $(seq 300); do [ -e " + saved + " ] && break; sleep 0.05; done && sleep 0.5 && mkdir -p " +
                            root + "checkpoint-1 && head -c 150000 /dev/urandom > " + root +
                            "checkpoint-1/rng_state_1.pth && mkdir -p " + root + "checkpoint-2 && echo x > " + root +
                            "checkpoint-2/partial.bin && sleep 1.5";
  auto [leader, follower] = RunTwoNodes(node0, node1);
  const std::string name = subdirectory + "checkpoint-1";
  ASSERT_EQ(leader.exit_code, 0) << leader.err;
  ASSERT_EQ(follower.exit_code, 0) << follower.err;
  EXPECT_EQ(Latest(), name + "\n");
  EXPECT_TRUE(fs::exists(Part(name, 0) + "/" + name + "/trainer_state.json"));
  EXPECT_EQ(fs::file_size(Part(name, 1) + "/" + name + "/rng_state_1.pth"), 150000u);
  EXPECT_FALSE(fs::exists(Remote() + "/" + storage::CommitRecordPath(kJob, subdirectory + "checkpoint-2")))
      << "node 1's own unmarked directory is not node 0's checkpoint";
  EXPECT_GE(fs::last_write_time(Remote() + "/" + kJob + "/latest"),
            fs::last_write_time(Part(name, 1) + "/" + name + ".bt-manifest.json"));
  EXPECT_NE(follower.err.find("this node's part of checkpoint " + name + " committed"), std::string::npos) << follower.err;
}

// Each node runs its own command: node 0 `node0`, node 1 `node1`.
std::pair<ProcessResult, ProcessResult> CheckpointJob::RunTwoNodes(const std::string& node0, const std::string& node1,
                                                                   double drain_timeout_s) {
  nlohmann::json config = nlohmann::json::parse(
      ReadFile(Config({"if [ $BT_NODE_RANK = 0 ]; then " + node0 + "; else " + node1 + "; fi"}, "", drain_timeout_s)));
  config["compute"] = {{"node_count", 2}};
  config["launcher"]["rendezvous"] = {{"port", FreePort()}, {"join_timeout_s", 20}, {"heartbeat_interval_s", 0.2},
                                      {"heartbeat_timeout_s", 3}};
  const std::string path = dir_.Write("two-nodes-" + std::to_string(configs_) + ".json", config.dump());
  std::vector<std::unique_ptr<LauncherProcess>> nodes;
  for (int rank = 0; rank < 2; ++rank) {
    LaunchSpec spec = Run(path);
    spec.args.insert(spec.args.end(), {"--node-rank", std::to_string(rank), "--node-count", "2", "--leader-addr", "127.0.0.1"});
    spec.set_env["BT_RENDEZVOUS_TOKEN"] = "checkpoint-test";
    nodes.push_back(std::make_unique<LauncherProcess>(spec));
  }
  ProcessResult leader = nodes[0]->Finish();
  return {leader, nodes[1]->Finish()};
}

// A follower waits (up to 20 s, before its training starts) for node 0 to declare the saves
// it resumed; node 0 here never will (checkpointing off in its config). SIGTERM during that
// wait stops the follower at once, not when the wait ends.
TEST_F(CheckpointJob, SigtermWhileAFollowerWaitsForNodeZerosResumedSavesStopsAtOnce) {
  nlohmann::json config = nlohmann::json::parse(ReadFile(Config({"sleep 30"})));
  config["compute"] = {{"node_count", 2}};
  config["launcher"]["rendezvous"] = {{"port", FreePort()}, {"join_timeout_s", 20}};
  const std::string follower_config = dir_.Write("follower.json", config.dump());
  config["runtime"]["checkpointing_config"]["enabled"] = false;
  const std::string leader_config = dir_.Write("leader.json", config.dump());
  std::vector<std::unique_ptr<LauncherProcess>> nodes;
  for (int rank = 0; rank < 2; ++rank) {
    LaunchSpec spec = Run(rank == 0 ? leader_config : follower_config);
    spec.args.insert(spec.args.end(), {"--node-rank", std::to_string(rank), "--node-count", "2", "--leader-addr", "127.0.0.1"});
    spec.set_env["BT_RENDEZVOUS_TOKEN"] = "checkpoint-test";
    nodes.push_back(std::make_unique<LauncherProcess>(spec));
  }
  ASSERT_TRUE(nodes[1]->WaitForLog("all 2 nodes are ready", 20s));
  std::this_thread::sleep_for(1s);
  const auto signalled = std::chrono::steady_clock::now();
  nodes[1]->Signal(SIGTERM);
  ProcessResult follower = nodes[1]->Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, 5s) << follower.err;
  EXPECT_EQ(follower.exit_code, 143) << follower.err;
  EXPECT_NE(follower.err.find("stopped by Terminated before the start commands"), std::string::npos) << follower.err;
  nodes[0]->Signal(SIGTERM);
  nodes[0]->Finish();
}

TEST_F(CheckpointJob, TwoNodesCommitLatestOnlyAfterEveryPartIsUploaded) { RunTwoNodesSavingOneCheckpoint(""); }

// A checkpoint's name may hold '/' (a Trainer writing to a subdirectory): its parts are
// reported under keys of one segment, which the store lets a follower write.
TEST_F(CheckpointJob, TwoNodesCommitACheckpointInASubdirectory) { RunTwoNodesSavingOneCheckpoint("run1/"); }

// Node 0 saves checkpoint-1 again; node 1 does not. Node 1's answer to the first save must
// not complete the second: node 0's second version stays uncommitted (74, naming node 1),
// and the commit still names both nodes' first versions. Node 1, its training ended with
// its part unchanged, answers "lost" at once: the drains do not wait out drain_timeout_s
// (review 12).
TEST_F(CheckpointJob, TwoNodesNeverCommitASecondSaveWithTheOtherNodesFirstPart) {
  const std::string wait_commit = "while [ ! -s " + Remote() + "/" + kJob + "/latest ]; do sleep 0.1; done";
  const std::string node0 = HfSave(1) + " && " + wait_commit + " && sleep 0.5 && " + HfSave(1, "300000") + " && sleep 2";
  const std::string node1 = "mkdir -p $BT_CHECKPOINT_DIR/checkpoint-1 && head -c 150000 /dev/urandom > "
                            "$BT_CHECKPOINT_DIR/checkpoint-1/rng_state_1.pth && " + wait_commit + " && sleep 3";
  auto [leader, follower] = RunTwoNodes(node0, node1, 6);
  EXPECT_EQ(leader.exit_code, 74) << leader.err;
  EXPECT_NE(leader.err.find("checkpoint-1 was not committed: rank 1's part of this save is lost"), std::string::npos)
      << leader.err;
  EXPECT_NE(follower.err.find("node 0 saved checkpoint-1 again, but this node's part is the one that answered the save "
                              "before"),
            std::string::npos)
      << follower.err;
  EXPECT_EQ(leader.err.find("did not upload their parts"), std::string::npos) << "the drain waited its deadline";
  EXPECT_EQ(fs::file_size(Part("checkpoint-1", 0) + "/checkpoint-1/model.safetensors.bin"), 200000u)
      << "node 0's second save was committed with node 1's first";
  EXPECT_EQ(fs::file_size(Part("checkpoint-1", 1) + "/checkpoint-1/rng_state_1.pth"), 150000u);
}

// Both nodes save checkpoint-1 again: the commit names both second versions. Node 0 saves
// again as the Trainer does, into tmp-checkpoint-1 renamed into place: written in place, its
// old trainer_state.json would mark a half-written save complete.
TEST_F(CheckpointJob, TwoNodesCommitACheckpointSavedAgainByBoth) {
  const std::string wait_commit = "while [ ! -s " + Remote() + "/" + kJob + "/latest ]; do sleep 0.1; done";
  const std::string shard = "head -c $size /dev/urandom > $BT_CHECKPOINT_DIR/checkpoint-1/rng_state_1.pth";
  const std::string save_again = "cd $BT_CHECKPOINT_DIR && mkdir tmp-checkpoint-1 && head -c 300000 /dev/urandom > "
                                 "tmp-checkpoint-1/model.safetensors.bin && echo {} > tmp-checkpoint-1/trainer_state.json && "
                                 "rm -r checkpoint-1 && mv tmp-checkpoint-1 checkpoint-1";
  const std::string node0 = HfSave(1) + " && " + wait_commit + " && sleep 0.5 && " + save_again + " && sleep 3";
  const std::string node1 = "mkdir -p $BT_CHECKPOINT_DIR/checkpoint-1 && size=150000 && " + shard + " && " + wait_commit +
                            " && sleep 0.5 && size=160000 && " + shard + " && sleep 3";
  auto [leader, follower] = RunTwoNodes(node0, node1);
  ASSERT_EQ(leader.exit_code, 0) << leader.err;
  ASSERT_EQ(follower.exit_code, 0) << follower.err;
  EXPECT_EQ(fs::file_size(Part("checkpoint-1", 0) + "/checkpoint-1/model.safetensors.bin"), 300000u);
  EXPECT_EQ(fs::file_size(Part("checkpoint-1", 1) + "/checkpoint-1/rng_state_1.pth"), 160000u);
}

}  // namespace
}  // namespace bt::testing
