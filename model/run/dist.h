// model/run/dist.h: the ranks of a data-parallel run (mpirun -np N ./train_gpt ...), over MPI. The
// one module that includes mpi.h: everything else sees this small interface. Without MPI in
// the build (TG_HAVE_MPI unset), or in a process not started by mpirun, there is one rank and
// every collective is a no-op, so a plain ./train_gpt runs as it always did.
// A contract of the run with the network: the backends (model/net/) sum their gradients and
// gather their optimizer shards through it.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace tg::dist {

// Starts MPI when this process was launched by mpirun (OpenMPI's OMPI_COMM_WORLD_SIZE, or a
// PMI / PMIx launcher's rank variable, in the environment); otherwise does nothing (no MPI
// singleton: a plain run stays a plain process). Throws RuntimeError when launched by mpirun
// but the build has no MPI. Call once, first thing in main().
void init(int* argc, char*** argv);
// Ends MPI (after every rank's last collective); a no-op without it.
void finalize();

bool built_with_mpi();
int rank();        // 0 .. world() - 1; 0 in a single process
int world();       // number of ranks; 1 in a single process
int local_rank();  // rank among the ranks on this machine (which GPU it takes); 0 alone
bool active();     // world() > 1

// Sums buf (n floats, or n doubles) element-wise over the ranks, in place: every rank ends with
// the same sum (MPI_Allreduce; with two ranks a + b, the same bits on both). No-op alone.
void all_reduce_sum(float* buf, size_t n);
void all_reduce_sum(double* buf, size_t n);
// ZeRO-1 (model/net/shards.h). reduce_scatter_sum: buf holds the sum of counts floats (rank r's
// part after those of the ranks before it); in place, this rank's part becomes the element-wise
// sum of that part over the ranks, and the rest of buf is left undefined (MPI_Reduce_scatter
// in place, its result moved to the part's place). all_gather: rank r's counts[r]
// elements of buf, at their place (displacements the sum of the counts before), go to every
// rank's buf, in place (MPI_Allgatherv). gather: every rank's mine (counts[rank()] floats) to
// its place in root's all (the sum of counts floats; not read elsewhere; MPI_Gatherv).
// Alone: gather copies; the others do nothing.
void reduce_scatter_sum(float* buf, const std::vector<size_t>& counts);
void all_gather(float* buf, const std::vector<size_t>& counts);
void all_gather(double* buf, const std::vector<size_t>& counts);
void gather(const float* mine, float* all, const std::vector<size_t>& counts, int root = 0);
// Copies root's bytes to every rank.
void broadcast(void* buf, size_t bytes, int root = 0);
void barrier();
// Collective: the error of the lowest rank whose mine is not empty, as "rank r of W: " + its
// mine, or "" when every rank's mine is empty; every rank gets the same string. Alone: mine.
// For bad input that one rank finds where the others do not (a token id past the vocabulary in
// the rows it reads), so that every rank can end with the same error.
std::string first_error(const std::string& mine);
// Ends every rank of the job now (MPI_Abort with exit status code), after printing line on
// stderr: what a rank that fails must do so that no other rank waits for it in a collective.
// Alone: prints line and exits with code.
[[noreturn]] void abort(const std::string& line, int code);

}  // namespace tg::dist
