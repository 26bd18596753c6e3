#include "launcher/plugin.h"

#include <cstdlib>
#include <filesystem>

#include "checkpoint/uploader.h"

namespace bt::launcher {

std::string PluginPath(const char* override_variable, const std::string& file_name) {
  if (const char* path = std::getenv(override_variable); path != nullptr && *path != '\0') return path;
  return (std::filesystem::path(checkpoint::CurrentExecutable()).parent_path() / file_name).string();
}

}  // namespace bt::launcher
