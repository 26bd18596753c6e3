// libFuzzer target for the per-file checks of the completion rules: whatever bytes a
// half-written torch.save zip or safetensors file holds, the check answers without reading
// outside its buffers (a file shorter than a zip's end record once did).
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "checkpoint/layout.h"

namespace {

const std::string& ScratchDirectory() {
  static const std::string path = [] {
    char pattern[] = "/tmp/bt-integrity-fuzz.XXXXXX";
    const char* made = mkdtemp(pattern);
    return std::string(made != nullptr ? made : "/tmp");
  }();
  return path;
}

void Check(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = ScratchDirectory() + "/" + name;
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return;
  if (write(fd, data, size) != ssize_t(size)) {
    close(fd);
    return;
  }
  close(fd);
  bt::checkpoint::CheckFileIntegrity(path);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Check("model.pt", data, size);
  Check("model.safetensors", data, size);
  return 0;
}
