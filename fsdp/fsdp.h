// Everything public of the fsdp layer in one include: the naive reference,
// fully_shard with its FSDPModule handle and options (mixed precision,
// reshard_after_forward), the printable sharding plan and the state dicts.
// The machinery behind the handle (fsdp/state.h, param_group.h,
// fsdp_param.h) is internal and not installed.
#pragma once

#include "fsdp/fully_shard.h"
#include "fsdp/mixed_precision.h"
#include "fsdp/naive_fsdp.h"
#include "fsdp/plan.h"
#include "fsdp/reshard_after_forward.h"
#include "fsdp/state_dict.h"
