// tests/emu/occupancy.h: what the real nvcc build's kernels use and how many of them an A100 or an
// H100 keeps resident, computed on the CPU, without a GPU.
//   - read_resources / parse_resources: the table build/kernel_resources.txt (Makefile, written by
//     tests/emu/kernel_resources.sh from ptxas's report of every object of the nvcc build): per
//     kernel and architecture, registers per thread, spill stores and loads, stack frame, static
//     shared memory and local memory. A line it cannot read is an error naming the file and line.
//   - a100_sxm / h100_sxm: the two parts as the CUDA occupancy calculator describes them (the
//     figures of cudaGetDeviceProperties on the parts, the ones tests/emu/cuda_runtime_emu.cpp
//     gives its emulated devices).
//   - occupancy(part, registers, threads, dynamic and static shared memory): blocks and warps
//     resident per SM, and which limit decides, by NVIDIA's own rules: the toolkit's header-only
//     calculator cuda_occupancy.h (cudaOccMaxActiveBlocksPerMultiprocessor), as gpu::launch
//     launches (opted in to the dynamic shared memory it asks for, default carveout). Theoretical
//     occupancy: what the hardware admits, not what a run achieves.
//   - flash_launch: the launch configuration (threads, dynamic shared memory) that the flash
//     attention launchers (kernels/flash_attn_fwd.cu, kernels/flash_attn_bwd.cu) give a kernel.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace emu {
namespace occ {

// One kernel on one architecture, as ptxas reported it. Sizes in bytes (regs: per thread).
struct KernelResources {
  std::string name;     // demangled as g++ demangles the same function (anonymous namespaces as
                        // "(anonymous namespace)"), e.g. "void gpu::flash::(anonymous
                        // namespace)::flash_fwd_bf16_kernel<64, false>(gpu::flash::FwdParams<__nv_bfloat16>)"
  std::string mangled;  // as nvcc mangled it
  std::string object;   // the object file it came from
  int sm = 0;           // 80, 90, ...
  int regs = 0;
  long long spill_store_bytes = 0, spill_load_bytes = 0;
  long long stack_bytes = 0;        // stack frame (spills and local arrays live there)
  long long static_smem_bytes = 0;  // __shared__ arrays of fixed size (dynamic: at the launch)
  long long local_bytes = 0;        // local memory outside the stack frame (ptxas's "lmem")
};

struct ResourceTable {
  std::vector<int> archs;                // the compute capabilities the build targeted ("# archs:")
  std::vector<KernelResources> kernels;  // in the file's order
};

// Throws std::runtime_error "<source>:<line>: <what is wrong>" on a malformed table.
ResourceTable parse_resources(const std::string& text, const std::string& source);
// Throws std::runtime_error naming the path when it cannot be read.
ResourceTable read_resources(const std::string& path);

// abi::__cxa_demangle, with nvcc's names for anonymous namespaces (_GLOBAL__N__<hash>_<file>_<hash>)
// written as g++ writes them; the input unchanged when it is not a mangled name.
std::string demangle(const std::string& mangled);
// "flash_fwd_bf16_kernel<64, false>": the demangled name without return type, namespaces
// and parameters.
std::string short_name(const std::string& demangled);

// A GPU as cudaOccDeviceProp takes it. The rest of the rules (64 warps and 32 blocks per SM, 4
// sub-partitions, registers allocated per warp in units of 256, shared memory in units of 128 bytes
// and the carveouts 0, 8, 16, 32, 64, 100, 132, 164 (, 196, 228) KB) cuda_occupancy.h derives
// from the compute capability.
struct GpuProfile {
  const char* name;
  int sm;                         // compute capability, 10 major + minor
  int sms;                        // multiprocessors
  int max_threads_per_block;
  int max_threads_per_sm;
  int regs_per_block, regs_per_sm;
  size_t smem_per_block;          // without opting in
  size_t smem_per_block_optin;
  size_t smem_per_sm;
  size_t reserved_smem_per_block; // the driver's, per block, sm_80 on
};
const GpuProfile& a100_sxm();  // sm_80, 108 SMs, 164 KB per SM, 163 KB per block by opt-in
const GpuProfile& h100_sxm();  // sm_90, 132 SMs, 228 KB per SM, 227 KB per block by opt-in
// The part of that architecture (80: the A100, 90: the H100), or null.
const GpuProfile* profile_for_sm(int sm);

enum Limit : unsigned {  // cudaOccLimitingFactor's bits
  kLimitWarps = 0x01,
  kLimitRegisters = 0x02,
  kLimitSharedMemory = 0x04,
  kLimitBlocks = 0x08,
  kLimitBarriers = 0x10,
};

struct Occupancy {
  int blocks_per_sm = 0;  // 0: the launch cannot run on the part
  int warps_per_sm = 0;
  double fraction = 0;    // warps_per_sm / the part's maximum (64)
  unsigned limits = 0;    // the Limit bits that equal blocks_per_sm (several on a tie)
  int blocks_by_warps = 0, blocks_by_regs = 0, blocks_by_smem = 0, blocks_by_blocks = 0;  // each limit alone
  int regs_per_block = 0;     // allocated
  size_t smem_per_block = 0;  // allocated: static + dynamic + reserved, rounded up
};
// Throws std::invalid_argument when cuda_occupancy.h refuses the input (no threads, negative
// registers, an architecture it does not know).
Occupancy occupancy(const GpuProfile& part, int regs_per_thread, int threads_per_block, size_t dynamic_smem_bytes,
                    size_t static_smem_bytes);
// "registers", "shared memory + warps", ...
std::string limits_text(unsigned limits);

// The launch of a flash attention kernel, from its short name ("flash_fwd_bf16_kernel<64, false>",
// "flash_bwd_dot_do_o_kernel<__nv_bfloat16>"): nullopt for any other kernel.
struct Launch {
  int threads;
  size_t dynamic_smem_bytes;
};
std::optional<Launch> flash_launch(const std::string& short_name);

}  // namespace occ
}  // namespace emu
