// Optional parts built as plugins beside the binary (MPI exchange, verbs), loaded on
// demand so the launcher starts in images that lack their libraries.
#pragma once

#include <string>

namespace bt::launcher {

// The path in `override_variable` when set, else `file_name` in PREFIX/lib/bt-launch (installed,
// the binary in PREFIX/bin) when it is there, else in the running binary's folder (a build tree).
std::string PluginPath(const char* override_variable, const std::string& file_name);

}  // namespace bt::launcher
