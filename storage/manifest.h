// What a committed checkpoint is: every file with its size and XXH3-128, uploaded beside
// the checkpoint as `<name>.bt-manifest.json` after its files and before `latest`.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace bt::storage {

inline constexpr const char* kManifestFormat = "bt-checkpoint-manifest/1";
inline constexpr const char* kManifestSuffix = ".bt-manifest.json";

class ManifestError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ManifestFile {
  std::string path;  // relative to the manifest's base
  uint64_t size = 0;
  std::string xxh3_128;
};

struct Manifest {
  std::string job_id;
  int node_rank = 0;
  std::string name;    // the checkpoint, relative to the node's checkpoint root
  std::string layout;  // LayoutName()
  bool is_directory = true;
  std::vector<ManifestFile> files;
  std::map<std::string, std::string> pointers;  // path relative to the rank root → content
  uint64_t total_bytes = 0;
  int64_t created_unix = 0;

  // Where the files live under rank-N/: the checkpoint itself for a directory, its parent
  // for a single-file checkpoint.
  std::string base() const;
  nlohmann::json ToJson() const;
  // Throws ManifestError naming `origin` and the field.
  static Manifest FromJson(const std::string& text, const std::string& origin);
};

// "<name>.bt-manifest.json", relative to the root of the version it describes.
std::string ManifestName(const std::string& checkpoint_name);

// A checkpoint name from a destination or a config must stay inside rank-N/: relative,
// no "..", no empty or "." components. Throws ManifestError.
void ValidateCheckpointName(const std::string& name, const std::string& what);

}  // namespace bt::storage
