// Completion rules: which parts of BT_CHECKPOINT_DIR are checkpoints, which framework wrote
// each, and whether the framework's "written last" evidence is there yet
// (../shared/reference/checkpoint-anchors.md §1). Pure functions of a scanned tree, so each
// framework's write order is tested step by step.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/tree.h"

namespace bt::checkpoint {

enum class Layout {
  kHuggingFace,       // checkpoint-N/, trainer_state.json last
  kTorchDcp,          // .distcp files, .metadata renamed into place last
  kDeepSpeed,         // global_stepN/ (a tag), `latest` in the parent naming it
  kMegatron,          // iter_NNNNNNN/, latest_checkpointed_iteration.txt in the parent
  kLightning,         // *.ckpt file, complete under its final name
  kLightningSharded,  // *.ckpt/ directory with meta.pt (FSDP) or latest (DeepSpeed)
  kTorchSave,         // a top-level *.pt/*.pth/*.bin/*.safetensors file
  kMarker,            // any other top-level directory, with the configured marker file
  kQuiet,             // any other top-level directory without it: complete after a quiet period
};

const char* LayoutName(Layout layout);

struct Candidate {
  std::string name;  // relative to the checkpoint root: the remote name under rank-N/
  bool is_directory = true;
  Layout layout = Layout::kQuiet;
  bool marked = false;      // the layout's last write is present
  std::string waiting_for;  // when not marked: what is missing, for the log
  std::vector<FileEntry> files;  // paths relative to the checkpoint root
  // Pointer files beside the checkpoint (DeepSpeed `latest`, Megatron's tracker), relative
  // to the root, with the content that names this checkpoint. Stored in the manifest and
  // written back beside the checkpoint when it is loaded.
  std::map<std::string, std::string> pointers;
  int64_t last_change_ns = 0;  // newest mtime or ctime among the files
};

// Whether a file of this name, closed or renamed into place, can be the last write of a
// checkpoint in some layout (trainer_state.json, .metadata, a pointer or tracker file, the
// marker, a .ckpt; a torch.save file when `in_root`). The agent judges at once after one,
// instead of pacing its passes as it does through a burst of writes.
bool CanEndACheckpoint(const std::string& file_name, bool in_root, const std::string& marker);

// Every checkpoint candidate in `tree`, marked or not. Reads pointer files under `root`.
std::vector<Candidate> FindCandidates(const DirectoryTree& tree, const std::string& root, const std::string& marker);

// Cheap self-checks of one file: a zip (torch.save's format) must end in a consistent
// end-of-central-directory record, a .safetensors file must be exactly as long as its header
// says. Other files pass. Returns the reason a file is not whole.
std::optional<std::string> CheckFileIntegrity(const std::string& path);

struct JudgeContext {
  int64_t now_ns = 0;
  int64_t quiet_period_ns = 0;
  // When the training's commands ended: a quiet period must have passed while it still ran,
  // or a writer that died mid-save would look "quiet".
  std::optional<int64_t> training_ended_ns;
  bool training_succeeded = false;  // its commands all exited 0: what they wrote is final
  bool declared_by_leader = false;  // node 0 declared this name complete (follower's shards)
};

struct Verdict {
  bool complete = false;
  std::string reason;  // why not (or, when complete, which rule)
};

// The completion decision: the layout's evidence, every file closed (`open_writers` holds
// absolute paths), each file's self-check, and for unmarked layouts the quiet period.
Verdict Judge(const Candidate& candidate, const std::string& root, const std::set<std::string>& open_writers,
              const JudgeContext& context);

}  // namespace bt::checkpoint
