#include "rendezvous/fabric/nccl_library.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <vector>

namespace bt::rendezvous::fabric {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> LibraryDirectories() {
  std::vector<std::string> directories;
  if (const char* path = std::getenv("LD_LIBRARY_PATH"); path != nullptr) {
    std::stringstream list(path);
    for (std::string entry; std::getline(list, entry, ':');) {
      if (!entry.empty()) directories.push_back(entry);
    }
  }
  for (const char* directory : {"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/lib",
                                "/usr/lib64", "/usr/lib", "/usr/local/nccl/lib", "/usr/local/cuda/lib64"}) {
    directories.emplace_back(directory);
  }
  return directories;
}

using GetVersionFunction = int (*)(int*);

// ncclGetVersion's code: major*10000 + minor*100 + patch since 2.9.
std::optional<NcclVersion> VersionFromLibrary(const std::string& path) {
  void* library = dlopen(path.empty() ? "libnccl.so.2" : path.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (library == nullptr) return std::nullopt;
  std::optional<NcclVersion> version;
  auto get_version = reinterpret_cast<GetVersionFunction>(dlsym(library, "ncclGetVersion"));
  int code = 0;
  if (get_version != nullptr && get_version(&code) == 0 && code >= 20900) {
    version = NcclVersion{code / 10000, code / 100 % 100, code % 100};
  }
  dlclose(library);
  return version;
}

}  // namespace

std::string NcclVersion::Text() const {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::string FindNcclLibrary() {
  if (const char* path = std::getenv("BT_NCCL_LIBRARY"); path != nullptr && *path != '\0') return path;
  std::error_code error;
  for (const std::string& directory : LibraryDirectories()) {
    const fs::path candidate = fs::path(directory) / "libnccl.so.2";
    if (fs::exists(candidate, error)) return candidate.string();
  }
  return "";
}

std::optional<NcclVersion> NcclVersionFromFileName(const std::string& path) {
  std::error_code error;
  fs::path resolved = fs::canonical(path, error);
  if (error) resolved = path;
  NcclVersion version;
  char tail = 0;
  const std::string name = resolved.filename().string();
  if (std::sscanf(name.c_str(), "libnccl.so.%d.%d.%d%c", &version.major, &version.minor, &version.patch, &tail) != 3) {
    return std::nullopt;
  }
  return version;
}

std::optional<NcclVersion> FindNcclVersion() {
  const std::string path = FindNcclLibrary();
  if (!path.empty()) {
    if (auto version = NcclVersionFromFileName(path)) return version;
  }
  return VersionFromLibrary(path);
}

}  // namespace bt::rendezvous::fabric
