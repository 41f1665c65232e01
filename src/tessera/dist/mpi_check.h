// tessera/dist/mpi_check.h — TS_CHECK_MPI: a failed MPI call throws tessera::Error with MPI's own message
// (MPI sources only; the communicators set MPI_ERRORS_RETURN so that calls return their errors).
#pragma once
#include <mpi.h>

#include <string>

#include "tessera/core/error.h"

namespace tessera::detail {
inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<size_t>(len));
}
}  // namespace tessera::detail

#define TS_CHECK_MPI(call) \
  do { \
    const int ts_mpi_err_ = (call); \
    if (ts_mpi_err_ != MPI_SUCCESS) \
      TS_THROW("MPI error in ", #call, ": ", ::tessera::detail::mpi_error_string(ts_mpi_err_)); \
  } while (0)
