// Relative paths as the checkpoint and weights code join them ('/'-separated, "" is the
// top), directories made and removed, and sizes as the logs print them.
#pragma once

#include <cstdint>
#include <string>

namespace bt::storage {

std::string JoinPath(const std::string& base, const std::string& relative);
std::string ParentOf(const std::string& relative);  // "" at the top
std::string BaseName(const std::string& relative);

// mkdir -p; throws std::runtime_error naming the path.
void MakeDirectories(const std::string& path);
// rm -rf; a path that is already gone is not an error.
void RemoveTree(const std::string& path);

// "1.2 GiB", "512 B": sizes in the logs and progress lines.
std::string FormatBytes(uint64_t bytes);

// A mkstemp/mkdtemp template in $TMPDIR (else /tmp). The uploader runs with TMPDIR inside
// the job's state directory: what a SIGKILLed uploader leaves there is the job's, removed
// when the launcher starts it again, never litter in /tmp.
std::string TemporaryTemplate(const char* stem);

}  // namespace bt::storage
