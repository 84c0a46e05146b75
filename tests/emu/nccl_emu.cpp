// tests/emu/nccl_emu.cpp: NCCL's communicator, all-reduce, reduce-scatter and all-gather for the
// emulator build, so that mpirun -np N ./train_gpt_emu --device cuda runs the CUDA backend's
// data-parallel path (each rank a process with its own emulated device), ZeRO-1's included.
// Each collective waits for the stream, copies the device buffer to the host, runs the MPI
// collective of model/run/dist.h there and copies the result back: NCCL's semantics (in place
// allowed, ordered on the stream, equal counts per rank), not its speed.
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "../../model/run/dist.h"

struct ncclComm {
  int nranks, rank;
};

namespace {
// What ncclGetUniqueId writes: a communicator made from an id without it was never given rank
// 0's (the broadcast of model/net/backend_cuda.cu did not arrive).
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

namespace {
// count floats of a device buffer to the host (after the stream's work), and back (then waited for)
bool to_host(std::vector<float>& host, const void* dev, size_t count, cudaStream_t stream) {
  host.resize(count);
  return cudaStreamSynchronize(stream) == cudaSuccess &&
         cudaMemcpy(host.data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess;
}
bool to_device(void* dev, const std::vector<float>& host, cudaStream_t stream) {
  return cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, stream) == cudaSuccess &&
         cudaStreamSynchronize(stream) == cudaSuccess;
}
}  // namespace

// recv (recvcount) = this rank's block of the sum over the ranks of send (nranks x recvcount).
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  if (!comm || type != ncclFloat || op != ncclSum || (!send && recvcount) || (!recv && recvcount)) return ncclInvalidArgument;
  std::vector<float> all;
  if (!to_host(all, send, recvcount * (size_t)comm->nranks, stream)) return ncclUnhandledCudaError;
  tg::dist::reduce_scatter_sum(all.data(), std::vector<size_t>((size_t)comm->nranks, recvcount));
  const auto mine = all.begin() + (std::ptrdiff_t)((size_t)comm->rank * recvcount);
  return to_device(recv, std::vector<float>(mine, mine + (std::ptrdiff_t)recvcount), stream) ? ncclSuccess
                                                                                               : ncclUnhandledCudaError;
}

// recv (nranks x sendcount) = every rank's send (sendcount), in rank order.
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  if (!comm || type != ncclFloat || (!send && sendcount) || (!recv && sendcount)) return ncclInvalidArgument;
  std::vector<float> mine, all(sendcount * (size_t)comm->nranks);
  if (!to_host(mine, send, sendcount, stream)) return ncclUnhandledCudaError;
  std::copy(mine.begin(), mine.end(), all.begin() + (size_t)comm->rank * sendcount);
  tg::dist::all_gather(all.data(), std::vector<size_t>((size_t)comm->nranks, sendcount));
  return to_device(recv, all, stream) ? ncclSuccess : ncclUnhandledCudaError;
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
