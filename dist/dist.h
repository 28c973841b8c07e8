// The dist API in one include: process groups and their Work, reduce ops,
// the device mesh, DTensor and redistribute, comm stats, errors, tracing, and the two ways to
// start ranks (dist::init, dist::run_local). Backends other than local and
// the launch machinery (dist/backends/, dist/launch/) are not part of it.
#pragma once

#include "dist/backends/local_backend.h"
#include "dist/comm_stats.h"
#include "dist/device_mesh.h"
#include "dist/dtensor.h"
#include "dist/errors.h"
#include "dist/init.h"
#include "dist/process_group.h"
#include "dist/redistribute.h"
#include "dist/reduce_op.h"
#include "dist/trace.h"
#include "dist/work.h"
