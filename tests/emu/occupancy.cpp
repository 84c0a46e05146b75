// tests/emu/occupancy.cpp: the kernel resource table's reader, the A100 and H100 profiles and the
// theoretical occupancy by the CUDA toolkit's calculator, cuda_occupancy.h (header-only, NVIDIA's
// rules: "CUDA Occupancy Calculator", cudaOccMaxActiveBlocksPerMultiprocessor). Contract in
// tests/emu/occupancy.h; the table's format in tests/emu/kernel_resources.sh.
#include "occupancy.h"

#include <cuda_occupancy.h>
#include <cxxabi.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace emu {
namespace occ {

// ---- the table ---------------------------------------------------------------------------------
namespace {

[[noreturn]] void bad_line(const std::string& source, int line, const std::string& what) {
  throw std::runtime_error(source + ":" + std::to_string(line) + ": " + what);
}

// "key=N" with N a decimal count, or bad_line.
long long field_count(const std::string& tok, const char* key, const std::string& source, int line) {
  const std::string k = std::string(key) + "=";
  if (tok.compare(0, k.size(), k) != 0)
    bad_line(source, line, "expected " + k + "N, found \"" + tok + "\"");
  const std::string v = tok.substr(k.size());
  if (v.empty() || v.size() > 12 || v.find_first_not_of("0123456789") != std::string::npos)
    bad_line(source, line, std::string(key) + " is not a count: \"" + tok + "\"");
  return std::stoll(v);
}

std::string field_text(const std::string& tok, const char* key, const std::string& source, int line) {
  const std::string k = std::string(key) + "=";
  if (tok.compare(0, k.size(), k) != 0 || tok.size() == k.size())
    bad_line(source, line, "expected " + k + "TEXT, found \"" + tok + "\"");
  return tok.substr(k.size());
}

// "90" or "90a" (the architecture-specific features: wgmma, setmaxnreg) -> 90; -1 otherwise
int capability_of(const std::string& tok) {
  const std::string digits = !tok.empty() && tok.back() == 'a' ? tok.substr(0, tok.size() - 1) : tok;
  if (digits.empty() || digits.size() > 3 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoi(digits);
}

// "sm_90" or "sm_90a" -> 90
int arch_of(const std::string& tok, const std::string& source, int line) {
  const int cc = tok.compare(0, 3, "sm_") == 0 ? capability_of(tok.substr(3)) : -1;
  if (cc < 0) bad_line(source, line, "expected an architecture sm_NN, found \"" + tok + "\"");
  return cc;
}

}  // namespace

ResourceTable parse_resources(const std::string& text, const std::string& source) {
  ResourceTable t;
  bool have_archs = false;
  std::istringstream in(text);
  std::string ln;
  int line = 0;
  while (std::getline(in, ln)) {
    ++line;
    if (!ln.empty() && ln[0] == '#') {
      static const std::string kArchs = "# archs:";
      if (ln.compare(0, kArchs.size(), kArchs) == 0) {
        if (have_archs) bad_line(source, line, "a second \"# archs:\" line");
        std::istringstream a(ln.substr(kArchs.size()));
        std::string tok;
        while (a >> tok) {
          const int cc = capability_of(tok);
          if (cc < 0) bad_line(source, line, "not a compute capability: \"" + tok + "\"");
          t.archs.push_back(cc);
        }
        if (t.archs.empty()) bad_line(source, line, "no architecture after \"# archs:\"");
        have_archs = true;
      }
      continue;
    }
    std::vector<std::string> tok;
    std::istringstream ls(ln);
    for (std::string w; ls >> w;) tok.push_back(w);
    if (tok.size() != 9)
      bad_line(source, line,
               "expected 9 fields (sm_NN regs= spill_stores= spill_loads= stack= smem= lmem= object= kernel=), found " +
                   std::to_string(tok.size()));
    KernelResources k;
    k.sm = arch_of(tok[0], source, line);
    k.regs = (int)field_count(tok[1], "regs", source, line);
    k.spill_store_bytes = field_count(tok[2], "spill_stores", source, line);
    k.spill_load_bytes = field_count(tok[3], "spill_loads", source, line);
    k.stack_bytes = field_count(tok[4], "stack", source, line);
    k.static_smem_bytes = field_count(tok[5], "smem", source, line);
    k.local_bytes = field_count(tok[6], "lmem", source, line);
    k.object = field_text(tok[7], "object", source, line);
    k.mangled = field_text(tok[8], "kernel", source, line);
    if (k.regs > 255) bad_line(source, line, "more than 255 registers per thread");
    if (!have_archs) bad_line(source, line, "a kernel before the \"# archs:\" line");
    bool listed = false;
    for (int a : t.archs) listed = listed || a == k.sm;
    if (!listed) bad_line(source, line, "sm_" + std::to_string(k.sm) + " is not among the \"# archs:\"");
    k.name = demangle(k.mangled);
    t.kernels.push_back(std::move(k));
  }
  if (!have_archs) bad_line(source, line, "no \"# archs:\" line");
  if (t.kernels.empty()) bad_line(source, line, "no kernel in the table");
  return t;
}

ResourceTable read_resources(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read the kernel resource table " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw std::runtime_error("error reading the kernel resource table " + path);
  return parse_resources(ss.str(), path);
}

std::string demangle(const std::string& mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  if (status != 0 || !d) {
    std::free(d);
    return mangled;
  }
  std::string s = d;
  std::free(d);
  // nvcc names an anonymous namespace _GLOBAL__N__<hash>_<len>_<file>_<hash>; g++ _GLOBAL__N_1,
  // which the demangler writes "(anonymous namespace)"
  static const std::string kAnon = "_GLOBAL__N__";
  for (size_t at = s.find(kAnon); at != std::string::npos; at = s.find(kAnon, at)) {
    size_t end = at + kAnon.size();
    while (end < s.size() && (std::isalnum((unsigned char)s[end]) || s[end] == '_')) ++end;
    s.replace(at, end - at, "(anonymous namespace)");
  }
  return s;
}

std::string short_name(const std::string& demangled) {
  std::string s = demangled;
  // the parameter list: the parentheses that close the name
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      else if (s[i] == '(' && --depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  // the return type and the qualifiers: everything up to the last "::" or space outside <>
  int angle = 0, paren = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++angle;
    else if (c == '>') --angle;
    else if (c == '(') ++paren;
    else if (c == ')') --paren;
    else if (angle == 0 && paren == 0) {
      if (c == ' ') start = i + 1;
      else if (c == ':' && i + 1 < s.size() && s[i + 1] == ':') start = i + 2;
    }
  }
  return s.substr(start);
}

// ---- the parts ----------------------------------------------------------------------------------
// cudaGetDeviceProperties on the parts (the values tests/emu/cuda_runtime_emu.cpp's emulated
// devices report): 48 KB per block without opting in, 1 KB reserved per block by the driver.
const GpuProfile& a100_sxm() {
  static const GpuProfile p{"A100 SXM", 80, 108, 1024, 2048, 65536, 65536, 48 * 1024, 163 * 1024, 164 * 1024, 1024};
  return p;
}
const GpuProfile& h100_sxm() {
  static const GpuProfile p{"H100 SXM", 90, 132, 1024, 2048, 65536, 65536, 48 * 1024, 227 * 1024, 228 * 1024, 1024};
  return p;
}
const GpuProfile* profile_for_sm(int sm) {
  if (sm == 80) return &a100_sxm();
  if (sm == 90) return &h100_sxm();
  return nullptr;
}

// ---- occupancy ----------------------------------------------------------------------------------
Occupancy occupancy(const GpuProfile& part, int regs_per_thread, int threads_per_block, size_t dynamic_smem_bytes,
                    size_t static_smem_bytes) {
  cudaOccDeviceProp prop;
  prop.computeMajor = part.sm / 10;
  prop.computeMinor = part.sm % 10;
  prop.maxThreadsPerBlock = part.max_threads_per_block;
  prop.maxThreadsPerMultiprocessor = part.max_threads_per_sm;
  prop.regsPerBlock = part.regs_per_block;
  prop.regsPerMultiprocessor = part.regs_per_sm;
  prop.warpSize = 32;
  prop.sharedMemPerBlock = part.smem_per_block;
  prop.sharedMemPerMultiprocessor = part.smem_per_sm;
  prop.numSms = part.sms;
  prop.sharedMemPerBlockOptin = part.smem_per_block_optin;
  prop.reservedSharedMemPerBlock = part.reserved_smem_per_block;

  cudaOccFuncAttributes attr;
  attr.maxThreadsPerBlock = part.max_threads_per_block;
  attr.numRegs = regs_per_thread;
  attr.sharedSizeBytes = static_smem_bytes;
  attr.partitionedGCConfig = PARTITIONED_GC_OFF;
  attr.numBlockBarriers = 1;  // __syncthreads' barrier (what cudaFuncAttributes converts to)
  // gpu::launch (kernels/cuda_common.cuh) opts a kernel in to exactly its dynamic shared memory
  // when that is above the 48 KB default, and leaves it at the default otherwise
  if (dynamic_smem_bytes > part.smem_per_block) {
    attr.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN;
    attr.maxDynamicSharedSizeBytes = dynamic_smem_bytes;
  } else {
    attr.shmemLimitConfig = FUNC_SHMEM_LIMIT_DEFAULT;
    attr.maxDynamicSharedSizeBytes = part.smem_per_block > static_smem_bytes ? part.smem_per_block - static_smem_bytes : 0;
  }
  cudaOccDeviceState state;  // no cache or carveout preference

  cudaOccResult r{};
  const cudaOccError e =
      cudaOccMaxActiveBlocksPerMultiprocessor(&r, &prop, &attr, &state, threads_per_block, dynamic_smem_bytes);
  if (e != CUDA_OCC_SUCCESS)
    throw std::invalid_argument("cuda_occupancy.h refused " + std::string(part.name) + ", " +
                                std::to_string(regs_per_thread) + " registers, " + std::to_string(threads_per_block) +
                                " threads (error " + std::to_string((int)e) + ")");
  Occupancy o;
  o.blocks_per_sm = r.activeBlocksPerMultiprocessor;
  o.warps_per_sm = o.blocks_per_sm * ((threads_per_block + 31) / 32);
  o.fraction = (double)o.warps_per_sm / (part.max_threads_per_sm / 32);
  o.limits = r.limitingFactors;
  o.blocks_by_warps = r.blockLimitWarps;
  o.blocks_by_regs = r.blockLimitRegs;
  o.blocks_by_smem = r.blockLimitSharedMem;
  o.blocks_by_blocks = r.blockLimitBlocks;
  o.regs_per_block = r.allocatedRegistersPerBlock;
  o.smem_per_block = r.allocatedSharedMemPerBlock;
  return o;
}

std::string limits_text(unsigned limits) {
  static const struct {
    unsigned bit;
    const char* name;
  } kNames[] = {{kLimitRegisters, "registers"},
                {kLimitSharedMemory, "shared memory"},
                {kLimitWarps, "warps"},
                {kLimitBlocks, "blocks"},
                {kLimitBarriers, "barriers"}};
  std::string s;
  for (const auto& n : kNames)
    if (limits & n.bit) s += (s.empty() ? "" : " + ") + std::string(n.name);
  return s.empty() ? "none" : s;
}

// ---- the flash kernels' launches ----------------------------------------------------------------
namespace {

// QueryTile<HS, Warps, QBufs>::kSmemBytes (kernels/flash_attn_common.cuh): QBufs query-side tiles
// of Br = 16 Warps rows and two stages of K_j, V_j of Bc = 64 rows, [rows][HS + 8] bf16
// (Bc = 64 keys, 32 at HS = 256)
size_t query_tile_smem(int hs, int warps, int qbufs) {
  return (size_t)(qbufs * 16 * warps + 4 * (hs > 128 ? 32 : 64)) * (hs + 8) * 2;
}

}  // namespace

std::optional<Launch> flash_launch(const std::string& name) {
  const size_t lt = name.find('<');
  if (lt == std::string::npos) return std::nullopt;
  const std::string base = name.substr(0, lt);
  if (base == "flash_bwd_dot_do_o_kernel") return Launch{256, 0};  // run_bwd in kernels/flash_attn_bwd.cu
  const int hs = std::atoi(name.c_str() + lt + 1);
  if (hs != 32 && hs != 64 && hs != 128 && hs != 256) return std::nullopt;
  // kernels/flash_attn_fwd.cu, run_fwd: FwdTile<HS> = QueryTile<HS, 8, 1>, 8 warps
  if (base == "flash_fwd_bf16_kernel") return Launch{256, query_tile_smem(hs, 8, 1)};
  // kernels/flash_attn_bwd.cu, run_bwd: DqTile<HS> = QueryTile<HS, 4, 2>, 4 warps
  if (base == "flash_bwd_dq_bf16_kernel") return Launch{128, query_tile_smem(hs, 4, 2)};
  // kernels/flash_attn_bwd.cu, DkvTile<HS>: 4 warps, Bc = 64 keys, Br = 64 queries (32 from
  // HS = 128); K_j, V_j and two stages of Q_i, dO_i [rows][HS + 8] bf16, lse and D [2][Br] floats,
  // keep bytes [Bc / 8][Br]
  if (base == "flash_bwd_dkdv_bf16_kernel") {
    const int bc = 64, br = hs >= 128 ? 32 : 64;
    return Launch{128, (size_t)(2 * bc + 4 * br) * (hs + 8) * 2 + 4 * br * 4 + (size_t)(bc / 8) * br};
  }
  // kernels/flash_attn_fwd.cu, SimtTile (8 warps, Br = Bc = 32) and simt_fwd_smem_bytes<HS>
  if (base == "flash_fwd_f32_kernel") return Launch{256, (size_t)(32 * hs + 32 * (hs + 1) + 32 * hs) * 4};
  // kernels/flash_attn_bwd.cu, SimtTile (8 warps, 32-row tiles) and simt_bwd_smem_bytes<HS>
  if (base == "flash_bwd_dkdv_f32_kernel" || base == "flash_bwd_dq_f32_kernel")
    return Launch{256, (size_t)(2 * 32 * hs + 2 * 32 * (hs + 1) + 2 * 32) * 4};
  return std::nullopt;
}

}  // namespace occ
}  // namespace emu
