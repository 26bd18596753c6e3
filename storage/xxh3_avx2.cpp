// Built with -mavx2 (CMakeLists.txt); only called when the CPU reports AVX2.
#include "checkpoint/xxh3_impl.h"
#include "checkpoint/xxh3_variant.inc"

namespace bt::checkpoint::detail {
const Xxh3Functions kXxh3Avx2 = {Create, Destroy, Update, Digest};
}
