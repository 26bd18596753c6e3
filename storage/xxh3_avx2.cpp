// Built with -mavx2 (CMakeLists.txt); only called when the CPU reports AVX2.
#include "storage/xxh3_impl.h"
#include "storage/xxh3_variant.inc"

namespace bt::storage::detail {
const Xxh3Functions kXxh3Avx2 = {Create, Destroy, Update, Digest};
}
