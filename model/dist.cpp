// model/dist.cpp: the ranks of a data-parallel run over MPI (see model/dist.h). Built with
// mpicxx's flags and TG_HAVE_MPI when the Makefile finds MPI; without it, one rank.
#include "dist.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "errors.h"

#ifdef TG_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API alone (MPI's C++ bindings are deprecated)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace tg::dist {

namespace {
int g_rank = 0, g_world = 1, g_local_rank = 0;
#ifdef TG_HAVE_MPI
bool g_started = false;  // MPI_Init ran (finalize and abort then speak to MPI)
#endif

// Whether a launcher (mpirun, srun, a PMI / PMIx one) started this process as a rank.
bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

#ifdef TG_HAVE_MPI
// MPI counts are ints: larger buffers go in pieces of at most INT_MAX elements.
template <typename F>
void in_pieces(size_t n, F&& f) {
  for (size_t at = 0; at < n; at += (size_t)INT_MAX) f(at, (int)std::min(n - at, (size_t)INT_MAX));
}
void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  abort(std::string("rank ") + std::to_string(g_rank) + ": " + what + " failed: " + std::string(msg, len), 1);
}
#endif
}  // namespace

bool built_with_mpi() {
#ifdef TG_HAVE_MPI
  return true;
#else
  return false;
#endif
}

void init(int* argc, char*** argv) {
  if (!launched_by_mpirun()) return;
#ifdef TG_HAVE_MPI
  // errors come back as codes (check() ends the job with them), not as MPI's own abort
  if (MPI_Init(argc, argv) != MPI_SUCCESS) throw RuntimeError("MPI_Init failed; expected a working MPI launch (mpirun -np N ./train_gpt ...)");
  g_started = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  // the local rank: this rank's place among the ranks sharing its machine (its memory)
  MPI_Comm node;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  MPI_Comm_rank(node, &g_local_rank);
  MPI_Comm_free(&node);
#else
  (void)argc;
  (void)argv;
  // a launcher started this process, but it cannot talk to the other ranks: one process each
  // would train the same model alone and write into the same run directory
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (size && std::string(size) != "1")
    throw InputError("started by mpirun with " + std::string(size) + " ranks, but this train_gpt was built without MPI; "
                     "expected a build that found mpicxx; install OpenMPI (apt-get install libopenmpi-dev openmpi-bin) "
                     "and rebuild, or run one process without mpirun");
#endif
}

void finalize() {
#ifdef TG_HAVE_MPI
  if (g_started) MPI_Finalize();
  g_started = false;
#endif
}

int rank() { return g_rank; }
int world() { return g_world; }
int local_rank() { return g_local_rank; }
bool active() { return g_world > 1; }

#ifdef TG_HAVE_MPI
namespace {
template <typename T>
void sum_in_place(T* buf, size_t n, MPI_Datatype type) {
  in_pieces(n, [&](size_t at, int k) {
    check(MPI_Allreduce(MPI_IN_PLACE, buf + at, k, type, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  });
}
}  // namespace
void all_reduce_sum(float* buf, size_t n) { if (g_world > 1) sum_in_place(buf, n, MPI_FLOAT); }
void all_reduce_sum(double* buf, size_t n) { if (g_world > 1) sum_in_place(buf, n, MPI_DOUBLE); }
#else
void all_reduce_sum(float*, size_t) {}
void all_reduce_sum(double*, size_t) {}
#endif

void broadcast(void* buf, size_t bytes, int root) {
  if (g_world == 1) return;
#ifdef TG_HAVE_MPI
  in_pieces(bytes, [&](size_t at, int k) {
    check(MPI_Bcast(static_cast<char*>(buf) + at, k, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  });
#else
  (void)buf;
  (void)bytes;
  (void)root;
#endif
}

void barrier() {
  if (g_world == 1) return;
#ifdef TG_HAVE_MPI
  check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
}

void abort(const std::string& line, int code) {
  const std::string whole = line + "\n";  // one write: the ranks' lines do not interleave
  std::fwrite(whole.data(), 1, whole.size(), stderr);
  std::fflush(stderr);
#ifdef TG_HAVE_MPI
  if (g_started) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

}  // namespace tg::dist
