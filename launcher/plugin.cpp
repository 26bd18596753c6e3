#include "launcher/plugin.h"

#include <cstdlib>
#include <filesystem>

#include "storage/subprocess.h"

namespace bt::launcher {

std::string PluginPath(const char* override_variable, const std::string& file_name) {
  if (const char* path = std::getenv(override_variable); path != nullptr && *path != '\0') return path;
  const std::filesystem::path binary_dir = std::filesystem::path(storage::CurrentExecutable()).parent_path();
  const std::filesystem::path installed = binary_dir.parent_path() / "lib" / "bt-launch" / file_name;
  std::error_code error;
  if (std::filesystem::exists(installed, error)) return installed.string();  // `cmake --install` puts them there
  return (binary_dir / file_name).string();  // a build tree
}

}  // namespace bt::launcher
