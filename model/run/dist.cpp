// model/run/dist.cpp: the ranks of a data-parallel run over MPI (see model/run/dist.h). Built with
// mpicxx's flags and TG_HAVE_MPI when the Makefile finds MPI; without it, one rank.
#include "dist.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "../../data/errors.h"

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

#ifdef TG_HAVE_MPI
namespace {
// MPI's int counts and displacements of a split of a buffer (counts per rank, in rank order).
struct Split {
  std::vector<int> counts, displs;
};
Split split_of(const std::vector<size_t>& counts, const char* what) {
  if ((int)counts.size() != g_world)
    abort("rank " + std::to_string(g_rank) + ": " + what + " given " + std::to_string(counts.size()) + " counts for " +
              std::to_string(g_world) + " ranks",
          1);
  Split s;
  size_t at = 0;
  for (size_t c : counts) {
    if (at > (size_t)INT_MAX || c > (size_t)INT_MAX)
      abort("rank " + std::to_string(g_rank) + ": " + what + " of " + std::to_string(at + c) +
                " elements: more than MPI's int displacements reach (2^31 - 1); expected a smaller model per rank",
            1);
    s.counts.push_back((int)c);
    s.displs.push_back((int)at);
    at += c;
  }
  return s;
}
template <typename T>
void all_gather_in_place(T* buf, const std::vector<size_t>& counts, MPI_Datatype type) {
  if (g_world == 1) return;
  const Split s = split_of(counts, "MPI_Allgatherv");
  check(MPI_Allgatherv(MPI_IN_PLACE, 0, type, buf, s.counts.data(), s.displs.data(), type, MPI_COMM_WORLD),
        "MPI_Allgatherv");
}
}  // namespace

void reduce_scatter_sum(float* buf, const std::vector<size_t>& counts) {
  if (g_world == 1) return;
  const Split s = split_of(counts, "MPI_Reduce_scatter");
  check(MPI_Reduce_scatter(MPI_IN_PLACE, buf, s.counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Reduce_scatter");
  // in place, MPI leaves this rank's part at the start of buf
  std::memmove(buf + s.displs[g_rank], buf, (size_t)s.counts[g_rank] * sizeof(float));
}
void all_gather(float* buf, const std::vector<size_t>& counts) { all_gather_in_place(buf, counts, MPI_FLOAT); }
void all_gather(double* buf, const std::vector<size_t>& counts) { all_gather_in_place(buf, counts, MPI_DOUBLE); }
void gather(const float* mine, float* all, const std::vector<size_t>& counts, int root) {
  if (g_world == 1) {
    std::copy(mine, mine + counts.at(0), all);
    return;
  }
  const Split s = split_of(counts, "MPI_Gatherv");
  check(MPI_Gatherv(mine, s.counts[g_rank], MPI_FLOAT, all, s.counts.data(), s.displs.data(), MPI_FLOAT, root,
                    MPI_COMM_WORLD),
        "MPI_Gatherv");
}
#else
void reduce_scatter_sum(float*, const std::vector<size_t>&) {}
void all_gather(float*, const std::vector<size_t>&) {}
void all_gather(double*, const std::vector<size_t>&) {}
void gather(const float* mine, float* all, const std::vector<size_t>& counts, int) {
  std::copy(mine, mine + counts.at(0), all);
}
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

std::string first_error(const std::string& mine) {
  if (g_world == 1) return mine;
  std::vector<double> has((size_t)g_world, 0.0);
  has[(size_t)g_rank] = mine.empty() ? 0.0 : 1.0;
  all_reduce_sum(has.data(), has.size());
  int first = 0;
  while (first < g_world && has[(size_t)first] == 0.0) ++first;
  if (first == g_world) return "";
  uint64_t n = first == g_rank ? mine.size() : 0;
  broadcast(&n, sizeof n, first);
  std::string text(n, '\0');
  if (first == g_rank) text = mine;
  broadcast(text.data(), n, first);
  return "rank " + std::to_string(first) + " of " + std::to_string(g_world) + ": " + text;
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
