// Everything of the dist layer in one include.
#pragma once

#include "dist/comm_stats.h"
#include "dist/device_mesh.h"
#include "dist/dtensor.h"
#include "dist/errors.h"
#include "dist/launch/launch_environment.h"
#include "dist/backends/local_backend.h"
#include "dist/backends/mpi_backend.h"
#include "dist/process_group.h"
#include "dist/reduce_op.h"
#include "dist/reduction.h"
#include "dist/launch/tcp_store.h"
#include "dist/trace.h"
#include "dist/work.h"
