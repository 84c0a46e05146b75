// model/net/backend.cpp: the backend factory (see model/net/backend.h).
#include <string>

#include "../../data/errors.h"
#include "backend.h"

namespace tg {

// The CUDA backend's two entry points are defined in model/net/backend_cuda.cu, which only some
// programs link: train_gpt built with nvcc, train_gpt_emu, the GPU and emulated suites. Referred
// to weakly here, they are null in the others (train_gpt built by g++ alone, build/test_cpu), so
// that this one host object serves them all.
std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& m, const RunShape& run) __attribute__((weak));
CudaDevices cuda_backend_devices() __attribute__((weak));

CudaDevices cuda_devices() {
  if (!cuda_backend_devices) return {};
  return cuda_backend_devices();
}

std::unique_ptr<Backend> make_backend(Device device, const ModelConfig& m, const RunShape& run, std::string* note,
                                      double host_bytes_held) {
  const CudaDevices gpus = cuda_devices();
  if (device == Device::Cuda && !gpus.built)
    throw RuntimeError("--device cuda: this train_gpt was built without the CUDA toolkit; expected a build with nvcc; rebuild with make (nvcc on PATH) or pass --device cpu");
  if (device == Device::Cuda && gpus.count == 0)
    throw RuntimeError("--device cuda: no usable CUDA device is visible; expected an NVIDIA GPU with its driver; run on such a machine or pass --device cpu");
  const bool cuda = gpus.built && gpus.count > 0 && device != Device::Cpu;
  if (!cuda && run.precision == Precision::BF16)
    throw InputError("--precision bf16 on the CPU backend; expected fp32 or auto there (bf16 runs on a GPU); pass --precision fp32 or --device cuda on a GPU machine");
  std::string why;
  if (cuda && gpus.emulated)
    why = "train_gpt_emu: the CUDA backend runs on the SIMT emulator (every kernel executes on the CPU, slowly, with "
          "every memory access checked): for verifying the CUDA code, not for training";
  else if (device == Device::Auto)
    why = cuda                ? "a CUDA device is visible: training on the GPU"
          : gpus.count == 0 ? "no CUDA device visible: training on the CPU"
                            : "a CUDA device is visible, but this build has no CUDA backend: training on the CPU";
  if (note) *note = why;
  if (cuda) return make_cuda_backend(m, run);
  return make_cpu_backend(m, run, host_bytes_held);
}

}  // namespace tg
