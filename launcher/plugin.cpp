#include "launcher/plugin.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>

namespace bt::launcher {

std::string PluginPath(const char* override_variable, const std::string& file_name) {
  if (const char* path = std::getenv(override_variable); path != nullptr && *path != '\0') return path;
  char self[PATH_MAX] = {};
  ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
  if (length <= 0) return file_name;
  return (std::filesystem::path(std::string(self, size_t(length))).parent_path() / file_name).string();
}

}  // namespace bt::launcher
