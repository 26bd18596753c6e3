#include "checkpoint/layout.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "storage/paths.h"

namespace bt::checkpoint {
namespace {

constexpr const char* kHfStateFile = "trainer_state.json";
constexpr const char* kDcpMetadata = ".metadata";
constexpr const char* kDeepSpeedPointer = "latest";
constexpr const char* kMegatronTracker = "latest_checkpointed_iteration.txt";
constexpr const char* kLightningShardedMeta = "meta.pt";
constexpr size_t kMaxPointerBytes = 4096;

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// torch.save's usual extensions: a checkpoint by itself at the top of the tree.
bool IsTorchFile(const std::string& name) {
  return EndsWith(name, ".pt") || EndsWith(name, ".pth") || EndsWith(name, ".bin") || EndsWith(name, ".safetensors");
}

// Digits after `prefix` ("checkpoint-120" → 120), or nullopt.
std::optional<long long> NumberAfter(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() || name.size() - prefix.size() > 18) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(digits);
}

bool IsMegatronIteration(const std::string& name) {
  return name == "release" || (name.size() == 12 && NumberAfter(name, "iter_").has_value());
}

std::string Trim(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
  return text.substr(start);
}

std::optional<std::string> ReadPointer(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::nullopt;
  std::string content(kMaxPointerBytes, '\0');
  file.read(content.data(), std::streamsize(content.size()));
  content.resize(size_t(file.gcount()));
  return content;
}

// The tree as directories with their direct children.
struct TreeIndex {
  std::map<std::string, std::vector<std::string>> subdirectories;
  std::map<std::string, std::vector<const FileEntry*>> files;  // direct children only
  std::set<std::string> file_paths;

  explicit TreeIndex(const DirectoryTree& tree) {
    for (const auto& directory : tree.directories) subdirectories[storage::ParentOf(directory)].push_back(directory);
    for (const auto& file : tree.files) {
      files[storage::ParentOf(file.path)].push_back(&file);
      file_paths.insert(file.path);
    }
  }
  bool HasFile(const std::string& path) const { return file_paths.contains(path); }
};

class Classifier {
 public:
  Classifier(const DirectoryTree& tree, const std::string& root, const std::string& marker)
      : tree_(tree), index_(tree), root_(root), marker_(marker) {}

  std::vector<Candidate> Run() {
    Visit("", 0);
    for (auto& candidate : candidates_) Fill(candidate);
    // A directory holding nothing but ignored files is not a checkpoint (yet).
    std::erase_if(candidates_, [](const Candidate& candidate) {
      return (candidate.layout == Layout::kQuiet || candidate.layout == Layout::kMarker) && candidate.files.empty();
    });
    return std::move(candidates_);
  }

 private:
  // Returns whether any candidate was found at or below `directory`.
  bool Visit(const std::string& directory, int depth) {
    const size_t before = candidates_.size();
    auto subdirectories = index_.subdirectories.find(directory);
    if (subdirectories != index_.subdirectories.end()) {
      for (const std::string& sub : subdirectories->second) ClassifyDirectory(directory, sub, depth);
    }
    auto files = index_.files.find(directory);
    if (files != index_.files.end()) {
      for (const FileEntry* file : files->second) ClassifyFile(*file, depth);
    }
    return candidates_.size() > before;
  }

  void ClassifyDirectory(const std::string& parent, const std::string& path, int depth) {
    const std::string name = storage::BaseName(path);
    if (NumberAfter(name, "checkpoint-")) {
      Add(path, Layout::kHuggingFace, index_.HasFile(storage::JoinPath(path, kHfStateFile)), kHfStateFile);
    } else if (IsMegatronIteration(name)) {
      AddMegatron(parent, path);
    } else if (EndsWith(name, ".ckpt")) {
      bool marked = index_.HasFile(storage::JoinPath(path, kLightningShardedMeta)) || index_.HasFile(storage::JoinPath(path, kDeepSpeedPointer));
      Add(path, Layout::kLightningSharded, marked, "meta.pt");
    } else if (HasDcpFiles(path)) {
      AddDcp(path);
    } else if (NumberAfter(name, "global_step") || index_.HasFile(storage::JoinPath(parent, kDeepSpeedPointer))) {
      if (!AddDeepSpeed(parent, path) && !Visit(path, depth + 1) && depth == 0) AddGeneric(path);
    } else if (!Visit(path, depth + 1) && depth == 0) {
      AddGeneric(path);
    }
  }

  void ClassifyFile(const FileEntry& file, int depth) {
    const std::string name = storage::BaseName(file.path);
    if (EndsWith(name, ".ckpt")) {
      Add(file.path, Layout::kLightning, true, "", false);
      return;
    }
    if (depth == 0 && IsTorchFile(name)) Add(file.path, Layout::kTorchSave, true, "", false);
  }

  bool HasDcpFiles(const std::string& path) const {
    if (index_.HasFile(storage::JoinPath(path, kDcpMetadata))) return true;
    auto files = index_.files.find(path);
    if (files == index_.files.end()) return false;
    return std::any_of(files->second.begin(), files->second.end(),
                       [](const FileEntry* file) { return EndsWith(file->path, ".distcp"); });
  }

  void AddDcp(const std::string& path) {
    const std::string metadata = storage::JoinPath(path, kDcpMetadata);
    Candidate& candidate = Add(path, Layout::kTorchDcp, index_.HasFile(metadata), ".metadata");
    if (!candidate.marked) return;
    // Re-saving into the same directory rewrites the data while the old .metadata stays.
    int64_t metadata_mtime = 0;
    for (const FileEntry& file : tree_.files) {
      if (file.path == metadata) metadata_mtime = file.mtime_ns;
    }
    for (const FileEntry& file : tree_.files) {
      if (storage::ParentOf(file.path) == path && EndsWith(file.path, ".distcp") && file.mtime_ns > metadata_mtime) {
        candidate.marked = false;
        candidate.waiting_for = "a new .metadata (" + storage::BaseName(file.path) + " was written after the old one)";
        return;
      }
    }
  }

  bool AddDeepSpeed(const std::string& parent, const std::string& path) {
    const std::string pointer_path = storage::JoinPath(parent, kDeepSpeedPointer);
    const std::string tag = storage::BaseName(path);
    auto pointer = index_.HasFile(pointer_path) ? ReadPointer(storage::JoinPath(root_, pointer_path)) : std::nullopt;
    if (!pointer && !NumberAfter(tag, "global_step")) return false;
    bool marked = false;
    if (pointer) {
      const std::string named = Trim(*pointer);
      auto named_step = NumberAfter(named, "global_step");
      auto this_step = NumberAfter(tag, "global_step");
      marked = named == tag || (named_step && this_step && *this_step <= *named_step);
      if (!marked && !this_step) return false;  // a directory that `latest` does not describe
    }
    Candidate& candidate = Add(path, Layout::kDeepSpeed, marked, pointer_path + " naming " + tag);
    candidate.pointers[pointer_path] = tag;
    return true;
  }

  void AddMegatron(const std::string& parent, const std::string& path) {
    const std::string tracker_path = storage::JoinPath(parent, kMegatronTracker);
    const std::string name = storage::BaseName(path);
    auto tracker = index_.HasFile(tracker_path) ? ReadPointer(storage::JoinPath(root_, tracker_path)) : std::nullopt;
    bool marked = false;
    std::string content = name == "release" ? "release" : std::to_string(*NumberAfter(name, "iter_"));
    if (tracker) {
      const std::string named = Trim(*tracker);
      if (name == "release") {
        marked = named == "release";
      } else if (!named.empty() && named.find_first_not_of("0123456789") == std::string::npos && named.size() < 18) {
        marked = std::stoll(named) >= *NumberAfter(name, "iter_");
      }
    }
    Candidate& candidate = Add(path, Layout::kMegatron, marked, tracker_path + " naming " + content);
    candidate.pointers[tracker_path] = content;
  }

  void AddGeneric(const std::string& path) {
    bool has_marker = index_.HasFile(storage::JoinPath(path, marker_));
    Add(path, has_marker ? Layout::kMarker : Layout::kQuiet, has_marker, marker_);
  }

  Candidate& Add(const std::string& path, Layout layout, bool marked, const std::string& evidence,
                 bool is_directory = true) {
    Candidate candidate;
    candidate.name = path;
    candidate.is_directory = is_directory;
    candidate.layout = layout;
    candidate.marked = marked;
    if (!marked) candidate.waiting_for = evidence;
    candidates_.push_back(std::move(candidate));
    return candidates_.back();
  }

  void Fill(Candidate& candidate) {
    const std::string prefix = candidate.name + "/";
    for (const FileEntry& file : tree_.files) {
      bool belongs = candidate.is_directory ? file.path.rfind(prefix, 0) == 0 : file.path == candidate.name;
      if (!belongs) continue;
      candidate.files.push_back(file);
      candidate.last_change_ns = std::max({candidate.last_change_ns, file.mtime_ns, file.ctime_ns});
    }
  }

  const DirectoryTree& tree_;
  TreeIndex index_;
  std::string root_;
  std::string marker_;
  std::vector<Candidate> candidates_;
};

bool ReadAt(int fd, void* buffer, size_t size, off_t offset) {
  return pread(fd, buffer, size, offset) == ssize_t(size);
}

uint32_t Le32(const unsigned char* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t(p[3]) << 24); }
uint16_t Le16(const unsigned char* p) { return uint16_t(p[0] | (p[1] << 8)); }

// torch.save writes the central directory and its end record when the file is closed; a
// file cut short has none, and is what "failed finding central directory" means on load.
std::optional<std::string> CheckZip(int fd, uint64_t size) {
  constexpr size_t kEocdSize = 22;
  constexpr size_t kMaxComment = 65535;
  if (size < kEocdSize) return "shorter than a zip's end record (still being written)";
  const size_t tail_size = size_t(std::min<uint64_t>(size, kEocdSize + kMaxComment));
  std::vector<unsigned char> tail(tail_size);
  if (!ReadAt(fd, tail.data(), tail.size(), off_t(size - tail_size))) return "cannot read its end";
  for (size_t at = tail_size - kEocdSize + 1; at-- > 0;) {
    const unsigned char* record = tail.data() + at;
    if (std::memcmp(record, "PK\x05\x06", 4) != 0) continue;
    const uint64_t record_offset = size - tail_size + at;
    if (record_offset + kEocdSize + Le16(record + 20) != size) continue;  // a signature inside the data
    const uint32_t directory_size = Le32(record + 12);
    const uint32_t directory_offset = Le32(record + 16);
    if (directory_size == 0xFFFFFFFFu || directory_offset == 0xFFFFFFFFu) {  // zip64: the locator precedes it
      if (at < 20 || std::memcmp(record - 20, "PK\x06\x07", 4) != 0) return "zip64 end record without its locator";
      return std::nullopt;
    }
    if (uint64_t(directory_offset) + directory_size > record_offset) return "central directory out of range";
    return std::nullopt;
  }
  return "no zip end-of-central-directory record (still being written, or cut short)";
}

std::optional<std::string> CheckSafetensors(int fd, uint64_t size) {
  unsigned char length_bytes[8];
  if (size < 8 || !ReadAt(fd, length_bytes, 8, 0)) return "shorter than its header length";
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | length_bytes[i];
  if (header_length > size - 8 || header_length > (100u << 20)) return "header longer than the file";
  std::string header(header_length, '\0');
  if (!ReadAt(fd, header.data(), header.size(), 8)) return "cannot read its header";
  uint64_t data_end = 0;
  try {
    const nlohmann::json tensors = nlohmann::json::parse(header);
    if (!tensors.is_object()) return "header is not a JSON object";
    for (auto it = tensors.begin(); it != tensors.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      data_end = std::max(data_end, it.value().at("data_offsets").at(1).get<uint64_t>());
    }
  } catch (const std::exception&) {
    return "header is not valid JSON";
  }
  if (8 + header_length + data_end != size) {
    return "size " + std::to_string(size) + " is not header + data (" + std::to_string(8 + header_length + data_end) + ")";
  }
  return std::nullopt;
}

}  // namespace

const char* LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kHuggingFace: return "huggingface";
    case Layout::kTorchDcp: return "torch-dcp";
    case Layout::kDeepSpeed: return "deepspeed";
    case Layout::kMegatron: return "megatron";
    case Layout::kLightning: return "lightning";
    case Layout::kLightningSharded: return "lightning-sharded";
    case Layout::kTorchSave: return "torch-save";
    case Layout::kMarker: return "marker";
    case Layout::kQuiet: return "quiet-period";
  }
  return "unknown";
}

bool CanEndACheckpoint(const std::string& file_name, bool in_root, const std::string& marker) {
  for (const char* last : {kHfStateFile, kDcpMetadata, kDeepSpeedPointer, kMegatronTracker, kLightningShardedMeta}) {
    if (file_name == last) return true;
  }
  return file_name == marker || EndsWith(file_name, ".ckpt") || (in_root && IsTorchFile(file_name));
}

std::vector<Candidate> FindCandidates(const DirectoryTree& tree, const std::string& root, const std::string& marker) {
  return Classifier(tree, root, marker).Run();
}

std::optional<std::string> CheckFileIntegrity(const std::string& path) {
  const bool safetensors = EndsWith(path, ".safetensors");
  const bool maybe_zip = EndsWith(path, ".pt") || EndsWith(path, ".pth") || EndsWith(path, ".bin") || EndsWith(path, ".ckpt");
  if (!safetensors && !maybe_zip) return std::nullopt;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string("cannot open: ") + std::strerror(errno);
  struct stat info {};
  fstat(fd, &info);
  const uint64_t size = uint64_t(info.st_size);
  std::optional<std::string> problem;
  unsigned char magic[4] = {};
  if (safetensors) {
    problem = CheckSafetensors(fd, size);
  } else if (size >= 4 && ReadAt(fd, magic, 4, 0) && std::memcmp(magic, "PK\x03\x04", 4) == 0) {
    problem = CheckZip(fd, size);
  }  // not a zip: torch's legacy format or another framework's; nothing cheap to check
  close(fd);
  return problem;
}

Verdict Judge(const Candidate& candidate, const std::string& root, const std::set<std::string>& open_writers,
              const JudgeContext& context) {
  if (candidate.files.empty()) return {false, "no files yet"};
  for (const FileEntry& file : candidate.files) {
    if (open_writers.contains(storage::JoinPath(root, file.path))) return {false, file.path + " is open for writing"};
  }
  if (!candidate.marked && !context.declared_by_leader && candidate.layout != Layout::kQuiet) {
    return {false, "waiting for " + candidate.waiting_for};
  }
  for (const FileEntry& file : candidate.files) {
    if (auto problem = CheckFileIntegrity(storage::JoinPath(root, file.path))) return {false, file.path + ": " + *problem};
  }
  if (candidate.layout == Layout::kQuiet && !context.declared_by_leader) {
    if (context.training_ended_ns && context.training_succeeded) return {true, "the training exited 0 with every file closed"};
    int64_t quiet_until = candidate.last_change_ns + context.quiet_period_ns;
    int64_t observed_until = std::min(context.now_ns, context.training_ended_ns.value_or(context.now_ns));
    if (quiet_until > observed_until) {
      return {false, context.training_ended_ns && quiet_until > *context.training_ended_ns
                         ? "changed less than the quiet period before the training ended (no marker)"
                         : "quiet period not over"};
    }
    return {true, "quiet period passed with no open writers"};
  }
  return {true, context.declared_by_leader && !candidate.marked ? "declared complete by node 0" : "marker present"};
}

}  // namespace bt::checkpoint
