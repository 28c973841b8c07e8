// Names of the reductions, for messages and signatures.
#include "dist/reduce_op.h"

namespace tessera::dist {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "unknown";
}

}  // namespace tessera::dist
