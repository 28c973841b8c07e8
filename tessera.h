// tessera for model authors, in one include: tensors and the differentiable
// functions (tessera::relu, tessera::matmul, ...), backward, grad mode, the
// nn layers, optimizers and the GPT model, the process groups and local
// launcher, fully_shard, loss parallel, and sharded checkpoints. Installed as
// <tessera/tessera.h>; in the source tree it is "tessera.h".
#pragma once

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "checkpoint/sharded_checkpoint.h"
#include "checkpoint/state_dict.h"
#include "dist/dist.h"
#include "fsdp/fsdp.h"
#include "nn/nn.h"
#include "tensor/error.h"
#include "tensor/tensor.h"
#include "tp/loss_parallel.h"
#include "tp/parallelize.h"
#include "tp/plans.h"
#include "tp/traffic.h"

namespace tessera {
// backward(loss) beside the differentiable functions, where model code looks.
using autograd::backward;
}  // namespace tessera
