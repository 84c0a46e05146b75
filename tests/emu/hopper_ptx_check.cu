// tests/emu/hopper_ptx_check.cu: every wrapper of kernels/hopper_ptx.cuh in one kernel, so that
// nvcc checks their PTX (make hopper-ptx-check: built for sm_90a, where the instructions must
// appear in the PTX, and for sm_80, where they are left out). Never launched.
#include "../../kernels/hopper_ptx.cuh"

namespace {

template <int N>
__device__ void every_shape(float* out, uint64_t desc_a, uint64_t desc_b, const uint32_t (&a)[4]) {
  float d[N / 2] = {};
  gpu::hopper::wgmma_bf16_ss<N, 0, 0>(d, desc_a, desc_b, false);
  gpu::hopper::wgmma_bf16_ss<N, 0, 1>(d, desc_a, desc_b, true);
  gpu::hopper::wgmma_bf16_ss<N, 1, 0>(d, desc_a, desc_b, true);
  gpu::hopper::wgmma_bf16_rs<N, 0>(d, a, desc_b, true);
  gpu::hopper::wgmma_bf16_rs<N, 1>(d, a, desc_b, true);
  gpu::hopper::wgmma_commit_group();
  gpu::hopper::wgmma_wait_group<0>();
  for (int i = 0; i < N / 2; ++i) out[i] += d[i];
}

}  // namespace

__global__ void hopper_ptx_check_kernel(float* out, uint32_t bytes, const __grid_constant__ CUtensorMap map) {
  __shared__ alignas(1024) unsigned char tile[64 * 256 * 2];
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    gpu::hopper::mbarrier_init(&bar, blockDim.x);
    gpu::hopper::fence_mbarrier_init();
  }
  __syncthreads();
  gpu::hopper::mbarrier_expect_tx(&bar, bytes);
  gpu::hopper::mbarrier_complete_tx(&bar, bytes);
  if (threadIdx.x == 0) gpu::hopper::mbarrier_arrive_expect_tx(&bar, 0);
  else gpu::hopper::mbarrier_arrive(&bar);
  if (threadIdx.x == 0) gpu::hopper::tma_load_2d(tile, &map, 0, (int)bytes, &bar);
  gpu::hopper::mbarrier_wait_parity(&bar, 0);
  if (gpu::hopper::mbarrier_test_wait_parity(&bar, 1)) out[0] = 1.f;
  tile[threadIdx.x] = (unsigned char)threadIdx.x;
  gpu::hopper::fence_proxy_async();
  __syncthreads();
  const uint32_t base = gpu::hopper::smem_u32(tile);
  const uint32_t frag[4] = {threadIdx.x, 0u, 1u, 2u};
  gpu::hopper::stmatrix_x4(base + 16 * (threadIdx.x % 32), frag);
  gpu::hopper::stmatrix_x4_trans(base + 512 + 16 * (threadIdx.x % 32), frag);
  if (gpu::hopper::elect_one()) out[1] = 1.f;
  int* flag = reinterpret_cast<int*>(out + 2);
  if (threadIdx.x == 0) {
    gpu::hopper::flag_wait(flag, 1);
    gpu::hopper::flag_release(flag, 2);
    const int seen = gpu::hopper::flag_peek(flag + 1);
    gpu::hopper::flag_handover(flag, 3, flag + 1);
    if (seen != 1) out[3] = 1.f;
  }
  const uint64_t desc_a = gpu::hopper::make_smem_desc(base, 128, 256, gpu::hopper::Swizzle::None);
  const uint64_t desc_b = gpu::hopper::make_smem_desc(base + 4096, 0, 1024, gpu::hopper::Swizzle::B128);
  const uint32_t a[4] = {threadIdx.x, 1u, 2u, 3u};
  gpu::hopper::wgmma_fence();
  every_shape<8>(out, desc_a, desc_b, a);
  every_shape<16>(out, desc_a, desc_b, a);
  every_shape<32>(out, desc_a, desc_b, a);
  every_shape<64>(out, desc_a, desc_b, a);
  every_shape<128>(out, desc_a, desc_b, a);
  every_shape<256>(out, desc_a, desc_b, a);
}
