// tessera/dist/nccl_check.h — TS_CHECK_NCCL: a failed NCCL call throws tessera::Error with NCCL's message (NCCL
// sources only). ncclInProgress is not a failure: a non-blocking communicator returns it while it connects,
// and the caller polls ncclCommGetAsyncError.
#pragma once
#include <nccl.h>

#include "tessera/core/error.h"

#define TS_CHECK_NCCL(call) \
  do { \
    const ncclResult_t ts_nccl_err_ = (call); \
    if (ts_nccl_err_ != ncclSuccess && ts_nccl_err_ != ncclInProgress) \
      TS_THROW("NCCL error in ", #call, ": ", ncclGetErrorString(ts_nccl_err_), " (", ncclGetLastError(nullptr), ")"); \
  } while (0)
