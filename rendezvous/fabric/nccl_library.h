// Finding the NCCL an image ships, without linking it: the version decides whether
// NCCL_IB_GID_INDEX is needed (automatic choice since 2.21), and the preflight loads it.
#pragma once

#include <optional>
#include <string>

namespace bt::rendezvous::fabric {

struct NcclVersion {
  int major = 0, minor = 0, patch = 0;
  bool Before(int want_major, int want_minor) const {
    return major != want_major ? major < want_major : minor < want_minor;
  }
  std::string Text() const;
};

// BT_NCCL_LIBRARY, else the first libnccl.so.2 in LD_LIBRARY_PATH and the usual library
// directories; "" when there is none.
std::string FindNcclLibrary();

// "libnccl.so.2.18.3" (after resolving symlinks) -> 2.18.3.
std::optional<NcclVersion> NcclVersionFromFileName(const std::string& path);

// From the file name, else ncclGetVersion through dlopen; nullopt when no NCCL is found.
std::optional<NcclVersion> FindNcclVersion();

}  // namespace bt::rendezvous::fabric
