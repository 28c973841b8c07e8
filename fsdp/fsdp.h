// Everything of the fsdp layer in one include: the naive reference,
// fully_shard and FSDPModule, the state and parameter groups behind them,
// mixed precision, the printable sharding plan and the state dicts.
#pragma once

#include "fsdp/fsdp_param.h"
#include "fsdp/fully_shard.h"
#include "fsdp/mixed_precision.h"
#include "fsdp/naive_fsdp.h"
#include "fsdp/param_group.h"
#include "fsdp/plan.h"
#include "fsdp/state.h"
#include "fsdp/state_dict.h"
