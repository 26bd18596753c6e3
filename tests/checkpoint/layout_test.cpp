// Completion rules, each driven by a framework's real write order
// (../shared/reference/checkpoint-anchors.md §1): after every step of a save the rule must
// say "not complete" until the framework's last write, and "complete" right after it.
#include "checkpoint/layout.h"

#include <fcntl.h>
#include <unistd.h>

#include <map>

#include <gtest/gtest.h>

#include "tests/checkpoint/fixtures.h"
#include "tests/support/launcher_process.h"

namespace bt::checkpoint {
namespace {

using testing::SafetensorsBytes;
using testing::TempDir;
using testing::WriteBytes;
using testing::ZipBytes;

constexpr int64_t kSecond = 1'000'000'000;

class LayoutTest : public ::testing::Test {
 protected:
  void Write(const std::string& relative, const std::string& bytes) { WriteBytes(dir_.path() + "/" + relative, bytes); }

  std::vector<Candidate> Candidates() { return FindCandidates(ScanTree(dir_.path(), ".complete"), dir_.path(), ".complete"); }

  std::optional<Candidate> Get(const std::string& name) {
    for (auto& candidate : Candidates()) {
      if (candidate.name == name) return candidate;
    }
    return std::nullopt;
  }

  // The verdict for `name` with nothing open for writing and the training still running.
  Verdict JudgeNow(const std::string& name, JudgeContext context = {}) {
    auto candidate = Get(name);
    if (!candidate) return {false, "not a candidate"};
    if (context.now_ns == 0) context.now_ns = candidate->last_change_ns + kSecond;
    context.quiet_period_ns = context.quiet_period_ns ? context.quiet_period_ns : 30 * kSecond;
    return Judge(*candidate, dir_.path(), {}, context);
  }

  bool Complete(const std::string& name) { return JudgeNow(name).complete; }

  TempDir dir_;
};

TEST_F(LayoutTest, HuggingFaceTrainerIsCompleteOnlyAfterTrainerState) {
  const std::vector<std::pair<std::string, std::string>> save_order = {
      {"checkpoint-500/config.json", "{}"},
      {"checkpoint-500/generation_config.json", "{}"},
      {"checkpoint-500/model-00001-of-00002.safetensors", SafetensorsBytes(1000)},
      {"checkpoint-500/model-00002-of-00002.safetensors", SafetensorsBytes(500)},
      {"checkpoint-500/model.safetensors.index.json", "{}"},
      {"checkpoint-500/training_args.bin", ZipBytes("args", "x")},
      {"checkpoint-500/optimizer.pt", ZipBytes("data.pkl", std::string(4096, 'o'))},
      {"checkpoint-500/scheduler.pt", ZipBytes("data.pkl", "s")},
      {"checkpoint-500/rng_state_0.pth", ZipBytes("data.pkl", "r0")},
      {"checkpoint-500/rng_state_1.pth", ZipBytes("data.pkl", "r1")},
  };
  for (const auto& [path, bytes] : save_order) {
    Write(path, bytes);
    Verdict verdict = JudgeNow("checkpoint-500");
    EXPECT_FALSE(verdict.complete) << "after " << path;
    EXPECT_NE(verdict.reason.find("trainer_state.json"), std::string::npos) << verdict.reason;
  }
  Write("checkpoint-500/trainer_state.json", R"({"global_step": 500})");
  auto candidate = Get("checkpoint-500");
  ASSERT_TRUE(candidate);
  EXPECT_EQ(candidate->layout, Layout::kHuggingFace);
  EXPECT_EQ(candidate->files.size(), save_order.size() + 1);
  EXPECT_TRUE(Complete("checkpoint-500"));
}

TEST_F(LayoutTest, HuggingFaceWithACutShortOptimizerIsNotComplete) {
  std::string zip = ZipBytes("data.pkl", std::string(10000, 'o'));
  Write("checkpoint-7/optimizer.pt", zip.substr(0, zip.size() - 30));  // the central directory never written
  Write("checkpoint-7/trainer_state.json", "{}");
  Verdict verdict = JudgeNow("checkpoint-7");
  EXPECT_FALSE(verdict.complete);
  EXPECT_NE(verdict.reason.find("optimizer.pt"), std::string::npos) << verdict.reason;
  EXPECT_NE(verdict.reason.find("end-of-central-directory"), std::string::npos) << verdict.reason;
}

TEST_F(LayoutTest, SafetensorsShorterThanItsHeaderSaysIsNotComplete) {
  std::string file = SafetensorsBytes(2000);
  Write("checkpoint-9/model.safetensors", file.substr(0, file.size() - 1));
  Write("checkpoint-9/trainer_state.json", "{}");
  Verdict verdict = JudgeNow("checkpoint-9");
  EXPECT_FALSE(verdict.complete);
  EXPECT_NE(verdict.reason.find("model.safetensors"), std::string::npos) << verdict.reason;
}

TEST_F(LayoutTest, TorchDcpIsCompleteWhenMetadataIsRenamedIntoPlace) {
  Write("step-100/__0_0.distcp", std::string(3000, 'a'));
  EXPECT_FALSE(Complete("step-100"));
  Write("step-100/__1_0.distcp", std::string(3000, 'b'));
  Write("step-100/.metadata.tmp", "pickled");  // hidden and temporary: not part of the checkpoint
  EXPECT_FALSE(Complete("step-100"));
  ASSERT_EQ(rename((dir_.path() + "/step-100/.metadata.tmp").c_str(), (dir_.path() + "/step-100/.metadata").c_str()), 0);
  auto candidate = Get("step-100");
  ASSERT_TRUE(candidate);
  EXPECT_EQ(candidate->layout, Layout::kTorchDcp);
  EXPECT_EQ(candidate->files.size(), 3u);
  EXPECT_TRUE(Complete("step-100"));
}

TEST_F(LayoutTest, TorchDcpResaveInvalidatesTheOldMetadataUntilTheNewOne) {
  Write("step-5/__0_0.distcp", "old");
  Write("step-5/.metadata", "old");
  testing::SetMtime(dir_.path() + "/step-5/.metadata", 1000);
  testing::SetMtime(dir_.path() + "/step-5/__0_0.distcp", 2000);  // overwrite=True re-save in progress
  Verdict verdict = JudgeNow("step-5");
  EXPECT_FALSE(verdict.complete);
  EXPECT_NE(verdict.reason.find("new .metadata"), std::string::npos) << verdict.reason;
  testing::SetMtime(dir_.path() + "/step-5/.metadata", 3000);
  EXPECT_TRUE(Complete("step-5"));
}

TEST_F(LayoutTest, DeepSpeedTagIsCompleteWhenLatestNamesIt) {
  Write("global_step10/mp_rank_00_model_states.pt", ZipBytes("m", "model"));
  Write("global_step10/zero_pp_rank_0_mp_rank_00_optim_states.pt", ZipBytes("o", "optim"));
  Write("global_step10/zero_to_fp32.py", "# script");
  Verdict verdict = JudgeNow("global_step10");
  EXPECT_FALSE(verdict.complete);
  EXPECT_NE(verdict.reason.find("latest"), std::string::npos);
  Write("latest", "global_step10");
  auto candidate = Get("global_step10");
  ASSERT_TRUE(candidate);
  EXPECT_EQ(candidate->layout, Layout::kDeepSpeed);
  EXPECT_EQ(candidate->pointers.at("latest"), "global_step10");
  EXPECT_TRUE(Complete("global_step10"));
  // The next save: the older tag stays complete and its pointer still names itself.
  Write("global_step20/mp_rank_00_model_states.pt", ZipBytes("m", "model2"));
  EXPECT_FALSE(Complete("global_step20"));
  Write("latest", "global_step20");
  EXPECT_TRUE(Complete("global_step20"));
  EXPECT_TRUE(Complete("global_step10"));
  EXPECT_EQ(Get("global_step10")->pointers.at("latest"), "global_step10");
}

TEST_F(LayoutTest, MegatronIterationIsCompleteWhenTheTrackerReachesIt) {
  Write("iter_0000100/mp_rank_00/model_optim_rng.pt", ZipBytes("m", "weights"));
  EXPECT_FALSE(Complete("iter_0000100"));
  Write("latest_checkpointed_iteration.txt", "100");
  auto candidate = Get("iter_0000100");
  ASSERT_TRUE(candidate);
  EXPECT_EQ(candidate->layout, Layout::kMegatron);
  EXPECT_EQ(candidate->pointers.at("latest_checkpointed_iteration.txt"), "100");
  EXPECT_TRUE(Complete("iter_0000100"));
  // torch_dist format: DCP files, .metadata, metadata.json inside, the tracker still decides.
  Write("iter_0000200/__0_0.distcp", "x");
  Write("iter_0000200/.metadata", "x");
  Write("iter_0000200/metadata.json", "{}");
  EXPECT_EQ(Get("iter_0000200")->layout, Layout::kMegatron);
  EXPECT_FALSE(Complete("iter_0000200"));
  Write("latest_checkpointed_iteration.txt", "200");
  EXPECT_TRUE(Complete("iter_0000200"));
}

TEST_F(LayoutTest, LightningFileIsCompleteUnderItsFinalName) {
  const std::string dir = "lightning_logs/version_0/checkpoints/";
  Write(dir + "epoch=0-step=10.ckpt.part", ZipBytes("data.pkl", "partial"));  // Lightning 1.x staging name
  Write(dir + ".tmp_epoch=0-step=10.ckpt", "x");
  EXPECT_TRUE(Candidates().empty());
  Write(dir + "epoch=0-step=10.ckpt", ZipBytes("data.pkl", "state"));
  auto candidate = Get(dir + "epoch=0-step=10.ckpt");
  ASSERT_TRUE(candidate);
  EXPECT_EQ(candidate->layout, Layout::kLightning);
  EXPECT_FALSE(candidate->is_directory);
  EXPECT_TRUE(Complete(dir + "epoch=0-step=10.ckpt"));
  EXPECT_EQ(Candidates().size(), 1u) << "the logs directory is not a checkpoint of its own";
}

TEST_F(LayoutTest, LightningShardedCheckpointNeedsMetaPt) {
  Write("checkpoints/epoch=1-step=20.ckpt/__0_0.distcp", "x");
  Write("checkpoints/epoch=1-step=20.ckpt/.metadata", "x");
  auto candidate = Get("checkpoints/epoch=1-step=20.ckpt");
  ASSERT_TRUE(candidate);
  EXPECT_EQ(candidate->layout, Layout::kLightningSharded);
  EXPECT_FALSE(Complete("checkpoints/epoch=1-step=20.ckpt"));
  Write("checkpoints/epoch=1-step=20.ckpt/meta.pt", ZipBytes("data.pkl", "meta"));
  EXPECT_TRUE(Complete("checkpoints/epoch=1-step=20.ckpt"));
}

TEST_F(LayoutTest, ZipShorterThanItsEndRecordIsIncompleteNotACrash) {
  // torch.save has written the local header's magic and nothing else yet.
  for (size_t length : {4, 5, 21}) {
    Write("model.pt", ZipBytes("data.pkl", "w").substr(0, length));
    Verdict verdict = JudgeNow("model.pt");
    EXPECT_FALSE(verdict.complete) << length;
    EXPECT_NE(verdict.reason.find("shorter than a zip's end record"), std::string::npos) << verdict.reason;
  }
}

TEST_F(LayoutTest, TorchSaveFileIsCompleteWhenItsZipIsWhole) {
  std::string zip = ZipBytes("archive/data.pkl", std::string(5000, 'w'));
  Write("model.pt", zip.substr(0, 3000));
  EXPECT_FALSE(Complete("model.pt"));
  Write("model.pt", zip);
  auto candidate = Get("model.pt");
  ASSERT_TRUE(candidate);
  EXPECT_EQ(candidate->layout, Layout::kTorchSave);
  EXPECT_TRUE(Complete("model.pt"));
}

TEST_F(LayoutTest, GenericDirectoryWithTheMarkerIsComplete) {
  Write("export/weights.bin", "abc");
  Write("export/.complete", "");
  auto candidate = Get("export");
  ASSERT_TRUE(candidate);
  EXPECT_EQ(candidate->layout, Layout::kMarker);
  EXPECT_TRUE(Complete("export"));
}

TEST_F(LayoutTest, GenericDirectoryWithoutMarkerNeedsAQuietPeriodWhileTheTrainingRuns) {
  Write("export/weights.bin", "abc");
  auto candidate = Get("export");
  ASSERT_TRUE(candidate);
  EXPECT_EQ(candidate->layout, Layout::kQuiet);
  JudgeContext context;
  context.quiet_period_ns = 30 * kSecond;
  context.now_ns = candidate->last_change_ns + 5 * kSecond;
  EXPECT_FALSE(JudgeNow("export", context).complete);
  context.now_ns = candidate->last_change_ns + 31 * kSecond;
  EXPECT_TRUE(JudgeNow("export", context).complete);
  // The training died one second after the last write: the writer stopped, not the save.
  context.training_ended_ns = candidate->last_change_ns + kSecond;
  Verdict died = JudgeNow("export", context);
  EXPECT_FALSE(died.complete);
  EXPECT_NE(died.reason.find("before the training ended"), std::string::npos) << died.reason;
  context.training_succeeded = true;  // it exited 0 with every file closed: what it wrote is final
  EXPECT_TRUE(JudgeNow("export", context).complete);
}

TEST_F(LayoutTest, OpenWriterKeepsACheckpointIncomplete) {
  Write("checkpoint-3/trainer_state.json", "{}");
  const std::string weights = dir_.path() + "/checkpoint-3/model.bin";
  int fd = open(weights.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  auto writers = OpenWriters(dir_.path());
  EXPECT_TRUE(writers.contains(weights));
  auto candidate = Get("checkpoint-3");
  ASSERT_TRUE(candidate);
  Verdict verdict = Judge(*candidate, dir_.path(), writers, {});
  EXPECT_FALSE(verdict.complete);
  EXPECT_NE(verdict.reason.find("open for writing"), std::string::npos);
  close(fd);
  EXPECT_FALSE(OpenWriters(dir_.path()).contains(weights));
  EXPECT_TRUE(Complete("checkpoint-3"));
}

// BT_CHECKPOINT_DIR reached through a symlink: /proc/*/fd shows the resolved path, which
// never starts with the configured one, so a half-written file looked closed.
TEST_F(LayoutTest, OpenWriterSeenThroughASymlinkedRoot) {
  Write("checkpoint-4/trainer_state.json", "{}");
  const std::string link = dir_.path() + "-link";
  ASSERT_EQ(symlink(dir_.path().c_str(), link.c_str()), 0);
  const std::string weights = link + "/checkpoint-4/model.bin";
  int fd = open(weights.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  auto writers = OpenWriters(link);
  EXPECT_TRUE(writers.contains(weights));
  auto candidate = Get("checkpoint-4");
  ASSERT_TRUE(candidate);
  EXPECT_FALSE(Judge(*candidate, link, writers, {}).complete);
  close(fd);
  EXPECT_FALSE(OpenWriters(link).contains(weights));
  unlink(link.c_str());
}

TEST_F(LayoutTest, FollowerShardIsCompleteWhenNodeZeroDeclaresIt) {
  Write("checkpoint-40/rng_state_8.pth", ZipBytes("data.pkl", "rng"));  // no trainer_state.json on node 1
  EXPECT_FALSE(Complete("checkpoint-40"));
  JudgeContext context;
  context.declared_by_leader = true;
  EXPECT_TRUE(JudgeNow("checkpoint-40", context).complete);
}

TEST_F(LayoutTest, StagingAndHiddenNamesAreIgnored) {
  Write(".bt-checkpoint/staging/1/x", "x");
  Write(".staging-3/config.json", "{}");
  Write("tmp-checkpoint-5/trainer_state.json", "{}");
  Write("checkpoint-6/model.safetensors.partial", "x");
  Write("checkpoint-6/.hidden", "x");
  Write("checkpoint-6/.tmp.weights", "x");
  Write("checkpoint-6/trainer_state.json", "{}");
  auto candidates = Candidates();
  ASSERT_EQ(candidates.size(), 1u);
  EXPECT_EQ(candidates[0].name, "checkpoint-6");
  ASSERT_EQ(candidates[0].files.size(), 1u);
  EXPECT_EQ(candidates[0].files[0].path, "checkpoint-6/trainer_state.json");
}

// The files each framework writes last (the tests above) end a checkpoint; its bulk does not.
TEST(LastWrite, EveryLayoutsLastFileCanEndACheckpointItsBulkCannot) {
  for (const char* last : {"trainer_state.json", ".metadata", "latest", "latest_checkpointed_iteration.txt", "meta.pt",
                           "epoch=3-step=120.ckpt", ".complete"}) {
    EXPECT_TRUE(CanEndACheckpoint(last, false, ".complete")) << last;
  }
  EXPECT_TRUE(CanEndACheckpoint("DONE", false, "DONE")) << "the configured marker";
  EXPECT_TRUE(CanEndACheckpoint("model.pt", true, ".complete")) << "a torch.save file at the top";
  for (const char* bulk : {"model.pt", "model.safetensors", "optimizer.bin", "__0_0.distcp", "config.json", "rng_state.pth",
                           "mp_rank_00_model_states.pt"}) {
    EXPECT_FALSE(CanEndACheckpoint(bulk, false, ".complete")) << bulk << " inside a checkpoint directory";
  }
}

TEST_F(LayoutTest, SymlinksAreReportedNotFollowed) {
  Write("checkpoint-1/trainer_state.json", "{}");
  ASSERT_EQ(symlink("/etc/passwd", (dir_.path() + "/checkpoint-1/passwd").c_str()), 0);
  ASSERT_EQ(symlink("/etc", (dir_.path() + "/checkpoint-2").c_str()), 0);
  DirectoryTree tree = ScanTree(dir_.path(), ".complete");
  EXPECT_EQ(tree.symlinks, (std::vector<std::string>{"checkpoint-1/passwd", "checkpoint-2"}));
  auto candidates = FindCandidates(tree, dir_.path(), ".complete");
  ASSERT_EQ(candidates.size(), 1u);
  EXPECT_EQ(candidates[0].files.size(), 1u);
}

}  // namespace
}  // namespace bt::checkpoint
