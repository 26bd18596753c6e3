#include "storage/manifest.h"

#include "storage/json_bytes.h"
#include "storage/paths.h"

namespace bt::storage {
namespace {

bool IsWithin(const std::string& path, const std::string& directory) {
  return path.size() > directory.size() && path.compare(0, directory.size(), directory) == 0 &&
         path[directory.size()] == '/';
}

// A loader writes the pointers after it verified the files: a pointer at a file's path (or
// at one of its directories, or inside a directory checkpoint) would replace what was verified.
void CheckPointersBesideFiles(const Manifest& manifest, const std::string& origin) {
  const std::string base = manifest.base();
  for (const auto& [pointer, content] : manifest.pointers) {
    if (manifest.is_directory && (pointer == base || IsWithin(pointer, base))) {
      throw ManifestError(origin + ": pointers: \"" + pointer + "\" is inside the checkpoint " + manifest.name);
    }
    for (const ManifestFile& file : manifest.files) {
      const std::string path = JoinPath(base, file.path);
      if (pointer == path || IsWithin(path, pointer) || IsWithin(pointer, path)) {
        throw ManifestError(origin + ": pointers: \"" + pointer + "\" would overwrite the checkpoint's file " + path);
      }
    }
  }
}

}  // namespace

std::string Manifest::base() const { return is_directory ? name : ParentOf(name); }

nlohmann::json Manifest::ToJson() const {
  nlohmann::json files_json = nlohmann::json::array();
  for (const auto& file : files) files_json.push_back({{"path", BytesToJson(file.path)}, {"size", file.size}, {"xxh3_128", file.xxh3_128}});
  return {{"format", kManifestFormat}, {"job_id", job_id},         {"node_rank", node_rank},
          {"name", BytesToJson(name)},              {"layout", layout},         {"kind", is_directory ? "directory" : "file"},
          {"files", files_json},       {"pointers", BytesMapToJson(pointers)},     {"total_bytes", total_bytes},
          {"created_unix", created_unix}};
}

Manifest Manifest::FromJson(const std::string& text, const std::string& origin) {
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    throw ManifestError(origin + ": not a manifest (" + error.what() + ")");
  }
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!document.is_object() || !document.contains(key)) throw ManifestError(origin + ": field " + key + " is missing");
    return document[key];
  };
  try {
    if (field("format") != kManifestFormat) throw ManifestError(origin + ": format is not " + kManifestFormat);
    Manifest manifest;
    manifest.job_id = field("job_id").get<std::string>();
    manifest.node_rank = field("node_rank").get<int>();
    manifest.name = BytesFromJson(field("name"));
    ValidateCheckpointName(manifest.name, origin + ": name");
    manifest.layout = field("layout").get<std::string>();
    manifest.is_directory = field("kind").get<std::string>() == "directory";
    for (const auto& file : field("files")) {
      ManifestFile entry{BytesFromJson(file.at("path")), file.at("size").get<uint64_t>(),
                         file.at("xxh3_128").get<std::string>()};
      ValidateCheckpointName(entry.path, origin + ": files[].path");
      manifest.files.push_back(std::move(entry));
    }
    manifest.pointers = BytesMapFromJson(field("pointers"));
    for (const auto& [path, content] : manifest.pointers) ValidateCheckpointName(path, origin + ": pointers");
    CheckPointersBesideFiles(manifest, origin);
    manifest.total_bytes = field("total_bytes").get<uint64_t>();
    manifest.created_unix = field("created_unix").get<int64_t>();
    return manifest;
  } catch (const nlohmann::json::exception& error) {
    throw ManifestError(origin + ": " + error.what());
  }
}

std::string ManifestName(const std::string& checkpoint_name) { return checkpoint_name + kManifestSuffix; }

void ValidateCheckpointName(const std::string& name, const std::string& what) {
  if (name.empty() || name.front() == '/' || name.find('\0') != std::string::npos) {
    throw ManifestError(what + ": \"" + name + "\" is not a relative path");
  }
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    const std::string part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") {
      throw ManifestError(what + ": \"" + name + "\" has an empty, \".\" or \"..\" component");
    }
    start = end + 1;
  }
}

}  // namespace bt::storage
