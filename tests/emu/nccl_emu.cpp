// tests/emu/nccl_emu.cpp: NCCL's communicator and all-reduce for the emulator build, so that
// mpirun -np N ./train_gpt_emu --device cuda runs the CUDA backend's data-parallel path (each
// rank a process with its own emulated device). The all-reduce waits for the stream, copies the
// device buffer to the host, sums it over the ranks with the MPI of model/dist.h and copies the
// sum back: NCCL's semantics (in-place allowed, ordered on the stream), not its speed.
#include <nccl.h>

#include <cstring>
#include <string>
#include <vector>

#include "../../model/dist.h"

struct ncclComm {
  int nranks, rank;
};

namespace {
// What ncclGetUniqueId writes: a communicator made from an id without it was never given rank
// 0's (the broadcast of model/backend_cuda.cu did not arrive).
const char kIdMark[] = "train_gpt emulated NCCL id";
}  // namespace

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, kIdMark, sizeof kIdMark);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (!comm || std::memcmp(id.internal, kIdMark, sizeof kIdMark) != 0) return ncclInvalidArgument;
  // the ranks are those of MPI (one process each)
  if (nranks != tg::dist::world() || rank != tg::dist::rank()) return ncclInvalidUsage;
  *comm = new ncclComm{nranks, rank};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (!comm || type != ncclFloat || op != ncclSum || (!send && count) || (!recv && count)) return ncclInvalidArgument;
  std::vector<float> host(count);
  if (cudaStreamSynchronize(stream) != cudaSuccess ||
      cudaMemcpy(host.data(), send, count * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
    return ncclUnhandledCudaError;
  tg::dist::all_reduce_sum(host.data(), count);
  if (cudaMemcpyAsync(recv, host.data(), count * sizeof(float), cudaMemcpyHostToDevice, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    return ncclUnhandledCudaError;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return "error";
  }
}
