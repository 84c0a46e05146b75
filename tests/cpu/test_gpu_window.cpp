// tests/cpu/test_gpu_window.cpp: the GPU window's parsers and summary (.ci/gpu_check.sh
// summarize) on canned logs, written here in the formats the window's programs print: doctest's
// console reporter (a failing case, its re-run alone, compute-sanitizer's closing line),
// build/bench_gpu's CSV, train_gpt's step and done lines with nvidia-smi's memory samples, and
// nanoGPT's train.py (iter and step lines). Each figure of the table is checked, so a parser that
// breaks here breaks before a lent GPU's minutes are spent on it. The window itself runs end to
// end on the CPU with `bash .ci/gpu_check.sh window --rehearse`.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../common/cli_util.h"

namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
}

// the line of the table that starts with the step's name
std::string row(const std::string& table, const std::string& step) {
  const size_t p = table.find("\n" + step + " ");
  if (p == std::string::npos) return "";
  return table.substr(p + 1, table.find('\n', p + 1) - p - 1);
}

const char* kSuiteFailing =
    "[test_gpu] random inputs seeded with TG_TEST_SEED=424242\n"
    "===============================================================================\n"
    "tests/gpu/test_flash_attn_gpu.cu:120:\n"
    "TEST CASE:  flash attention bf16: O, LSE against the CPU reference, T = 97\n"
    "\n"
    "tests/gpu/test_flash_attn_gpu.cu:140: ERROR: CHECK( err <= tol ) is NOT correct!\n"
    "  values: CHECK( 0.02 <= 0.01 )\n"
    "\n"
    "===============================================================================\n"
    "tests/gpu/test_flash_attn_gpu.cu:121:\n"
    "TEST CASE:  flash attention bf16: O, LSE against the CPU reference, T = 97\n"
    "\n"
    "tests/gpu/test_flash_attn_gpu.cu:141: ERROR: CHECK( lse_err <= tol ) is NOT correct!\n"
    "===============================================================================\n"
    "[doctest] test cases:  45 |  44 passed | 1 failed | 0 skipped\n"
    "[doctest] assertions: 900 | 898 passed | 2 failed |\n"
    "[doctest] Status: FAILURE!\n";

}  // namespace

TEST_CASE("GPU window: the summary of canned logs names every figure, the failing case and the skipped step") {
  const fs::path d = cli::fresh_dir("tg_gpu_window_logs");
  fs::create_directories(d);
  write(d / "header.txt", "commit abc1234 (bundle), 2026-11-26 10:00 UTC, deadline 540 s, on the GPU\n");
  write(d / "steps.tsv",
        "facts\tok\t3\t10\t\n"
        "libs\tok\t1\t5\t\n"
        "suite\tfailed(1)\t80\t90\t\n"
        "hopper\tok\t25\t30\t\n"
        "attention\tok\t95\t100\t\n"
        "train_flash\tok\t70\t90\t\n"
        "nanogpt\tok\t200\t120\tstopped at the time limit\n"
        "sanitize\tok\t50\t60\tmemcheck skipped\n"
        "counters\tskipped\t0\t90\tneeds about 90 s, 20 s left\n"
        "train_naive\ttimed-out\t100\t100\t\n");
  write(d / "facts.log",
        "gpu: NVIDIA H100 80GB HBM3 (compute capability 9.0, 81559 MiB, max SM clock 1980 MHz, memory clock 2619 MHz, "
        "driver 580.159.04)\nnvcc: 13.0\ncompute-sanitizer: 2025.3.1\nncu: 2025.3.1\npython3: 3.12.3\n"
        "torch: 2.11.0+cu130 cuda 13.0 sms 132\n");
  write(d / "libs.log", "== ldd .gpu/bin/train_gpt\n\tlibcublas.so.13 => /usr/local/cuda/lib64/libcublas.so.13\n"
                        "libs: 4 binaries load\n");
  write(d / "suite.log", kSuiteFailing);
  write(d / "suite_failed.txt", "flash attention bf16: O, LSE against the CPU reference, T = 97\n");
  write(d / "suite_rerun1.log", "TEST CASE:  flash attention bf16: O, LSE against the CPU reference, T = 97\n"
                                "[doctest] test cases:  1 |   0 passed | 1 failed | 44 skipped\n");
  write(d / "suite_memcheck1.log", "========= COMPUTE-SANITIZER\n[doctest] test cases:  1 |   0 passed | 1 failed | 44 skipped\n"
                                   "========= ERROR SUMMARY: 3 errors\n");
  write(d / "bench_attention.csv",
        "device,HS,T,B,NH,causal,p,path,status,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,"
        "torch_fwd_ms,torch_bwd_ms,torch_fwdbwd_ms\n"
        "\"NVIDIA H100 80GB HBM3\",64,1024,16,32,1,0,flash,\"ok\",0.5000,1.0000,1.6000,137.44,171.80,150.32,0.4000,2.0000,2.0000\n"
        "\"NVIDIA H100 80GB HBM3\",64,1024,16,32,1,0,naive,\"ok\",2.0000,4.0000,6.0000,34.36,42.95,40.09,0.4000,2.0000,2.0000\n"
        "\"NVIDIA H100 80GB HBM3\",64,2048,8,32,1,0,flash,\"ok\",1.0000,2.0000,3.0000,137.44,171.80,160.34,1.0000,1.0000,4.0000\n"
        "\"NVIDIA H100 80GB HBM3\",64,2048,8,32,1,0,naive,\"skipped (needs 17.2 GiB, 3.0 GiB free)\",0,0,0,0,0,0,1.0000,1.0000,4.0000\n"
        "\"NVIDIA H100 80GB HBM3\",64,4096,4,32,1,0,flash,\"ok\",2.0000,4.0000,6.0000,137.44,171.80,160.34,2.0000,8.0000,12.0000\n"
        "\"NVIDIA H100 80GB HBM3\",64,1024,16,32,1,0.2,flash,\"error: launch failed\",0,0,0,0,0,0,0,0,0\n");
  write(d / "hopper_ptx.log",
        "TEST CASE:  hopper: wgmma m64nNk16 bf16, MN-major (transposed) operands (PTX ISA: wgmma imm-trans-a)\n"
        "[doctest] test cases:  9 |  8 passed | 1 failed | 44 skipped\n");
  write(d / "hopper_tests.log", "[doctest] test cases:  2 |  2 passed | 0 failed | 44 skipped\n");
  write(d / "bench_mma.csv",
        "device,HS,T,B,NH,causal,p,path,status,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,"
        "torch_fwd_ms,torch_bwd_ms,torch_fwdbwd_ms\n"
        "\"NVIDIA H100 80GB HBM3\",128,1024,16,16,1,0.2,flash,\"ok\",0.2000,1.0000,1.2000,343.60,171.80,200.44,0.4000,2.0000,2.4000\n");
  write(d / "bench_ws.csv",
        "device,HS,T,B,NH,causal,p,path,status,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,"
        "torch_fwd_ms,torch_bwd_ms,torch_fwdbwd_ms\n"
        "\"NVIDIA H100 80GB HBM3\",64,4096,4,32,1,0.2,flash,\"ok\",2.0000,4.0000,6.0000,137.44,171.80,160.34,2.0000,8.0000,12.0000\n");
  write(d / "bench_fused.csv",
        "device,HS,T,B,NH,causal,p,path,status,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,"
        "torch_fwd_ms,torch_bwd_ms,torch_fwdbwd_ms\n"
        "\"NVIDIA H100 80GB HBM3\",128,4096,4,16,1,0,flash,\"ok\",2.0000,4.0000,6.0000,137.44,171.80,160.34,2.0000,2.0000,6.0000\n");
  write(d / "bench_ring.csv",
        "device,HS,T,B,NH,causal,p,path,status,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,"
        "torch_fwd_ms,torch_bwd_ms,torch_fwdbwd_ms\n"
        "\"NVIDIA H100 80GB HBM3\",64,16384,1,32,1,0.2,flash,\"ok\",1.0000,4.0000,5.0000,274.88,171.80,160.34,2.0000,8.0000,10.0000\n");
  write(d / "bench_seq.csv",
        "device,HS,T,B,NH,causal,p,path,status,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,"
        "torch_fwd_ms,torch_bwd_ms,torch_fwdbwd_ms\n"
        "\"NVIDIA H100 80GB HBM3\",128,4096,4,16,1,0.2,flash,\"ok\",2.0000,8.0000,10.0000,137.44,85.90,96.21,2.0000,4.0000,5.0000\n");
  write(d / "bench_narrow.csv",
        "device,HS,T,B,NH,causal,p,path,status,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,"
        "torch_fwd_ms,torch_bwd_ms,torch_fwdbwd_ms\n"
        "\"NVIDIA H100 80GB HBM3\",64,16384,1,32,1,0,flash,\"ok\",2.0000,4.0000,6.0000,137.44,171.80,160.34,1.0000,4.0000,5.0000\n");
  write(d / "bench_two.csv",
        "device,HS,T,B,NH,causal,p,path,status,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,"
        "torch_fwd_ms,torch_bwd_ms,torch_fwdbwd_ms\n"
        "\"NVIDIA H100 80GB HBM3\",64,4096,4,32,1,0,flash,\"ok\",1.0000,4.0000,5.0000,274.88,171.80,160.34,1.0000,4.0000,5.0000\n");
  write(d / "bench_turns.csv",
        "device,HS,T,B,NH,causal,p,path,status,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,"
        "torch_fwd_ms,torch_bwd_ms,torch_fwdbwd_ms\n"
        "\"NVIDIA H100 80GB HBM3\",64,4096,4,32,1,0,flash,\"ok\",2.2000,4.0000,6.2000,124.95,171.80,155.17,0.0000,0.0000,0.0000\n");
  write(d / "bench_three.csv",
        "device,HS,T,B,NH,causal,p,path,status,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,"
        "torch_fwd_ms,torch_bwd_ms,torch_fwdbwd_ms\n"
        "\"NVIDIA H100 80GB HBM3\",64,4096,4,32,1,0.2,flash,\"ok\",2.0000,4.0000,6.0000,137.44,171.80,160.34,2.0000,8.0000,12.0000\n");
  write(d / "train_flash.log",
        "device: cuda:0 NVIDIA H100 80GB HBM3 | attention: flash (Hopper wgmma kernels) | precision: bf16 | memory: 2048 MiB\n"
        "step 0: train loss 4.2009, val loss 4.2097\n"
        "step 0/5000 | loss 4.2081 | lr 1.000e-05 | norm 3.6387 | 900.0 ms | 18204 tok/s | mfu 0.1% | ETA 1m00s\n"
        "step 10/5000 | loss 3.1 | lr 1.000e-04 | norm 1.2 | 7.1 ms | 2307605 tok/s | mfu 31.5% | ETA 35s\n"
        "step 20/5000 | loss 2.9 | lr 2.000e-04 | norm 1.1 | 7.0 ms | 2340571 tok/s | mfu 32.0% | ETA 34s\n"
        "step 5000: train loss 1.0123, val loss 1.4791\n"
        "done: 5000 steps in 41.2 s, median 7.10 ms/step, best val loss 1.4652, final train 1.0123 val 1.4791\n");
  write(d / "train_flash.mem", "1024\n3100\n2900\n");
  write(d / "train_naive.log",
        "step 0/5000 | loss 4.2081 | lr 1.000e-05 | norm 3.6387 | 12.5 ms | 1310720 tok/s | mfu 17.9% | ETA 1m00s\n"
        "step 250: train loss 1.9, val loss 2.01\n"
        "step 250/5000 | loss 1.9 | lr 1.000e-03 | norm 0.4 | 12.0 ms | 1365333 tok/s | mfu 18.6% | ETA 58s\n"
        "step 500: train loss 1.6, val loss 1.80\n");
  write(d / "nanogpt.log",
        "tokens per iteration will be: 16,384\n"
        "step 0: train loss 4.2874, val loss 4.2823\n"
        "iter 0: loss 4.2654, time 45000.00ms, mfu -100.00%\n"
        "iter 100: loss 2.4, time 21.00ms, mfu 20.00%\n"
        "iter 110: loss 2.3, time 20.00ms, mfu 20.50%\n"
        "iter 120: loss 2.3, time 19.00ms, mfu 21.00%\n"
        "step 250: train loss 1.9, val loss 1.4697\n"
        "iter 250: loss 1.9, time 900.00ms, mfu 20.00%\n"
        "iter 260: loss 1.9, time 20.00ms, mfu 20.00%\n");
  write(d / "nanogpt.mem", "500\n2500\n2400\n");
  write(d / "sanitize_racecheck.log",
        "[doctest] test cases:  6 |  6 passed | 0 failed | 39 skipped\n"
        "========= RACECHECK SUMMARY: 2 hazards displayed (0 errors, 2 warnings)\n");
  write(d / "sanitize_initcheck.log", "[doctest] test cases:  6 |  6 passed | 0 failed | 39 skipped\n");

  const cli::Run r = cli::run_exe("bash", ".ci/gpu_check.sh summarize " + d.string());
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.code == 0);
  const std::string& t = r.out;
  CHECK(t.find("==== GPU window: commit abc1234 (bundle)") != std::string::npos);
  CHECK(row(t, "facts").find("NVIDIA H100 80GB HBM3 (compute capability 9.0") != std::string::npos);
  CHECK(row(t, "facts").find("nvcc 13.0; compute-sanitizer 2025.3.1; ncu 2025.3.1; torch 2.11.0+cu130") != std::string::npos);
  CHECK(row(t, "libs").find("4 binaries load") != std::string::npos);
  CHECK(row(t, "suite").find("failed(1)") != std::string::npos);
  CHECK(row(t, "suite").find("44 passed, 1 failed, 0 skipped of 45 (TG_TEST_SEED=424242); 1 failing case(s) named in the log") != std::string::npos);
  // the failing case (the one the step ran again), its re-run alone and memcheck's verdict
  CHECK(t.find("failed: flash attention bf16: O, LSE against the CPU reference, T = 97 | alone: 0 passed, 1 failed, "
               "44 skipped of 1 | memcheck: 3 errors") != std::string::npos);
  CHECK(t.find("failed: flash attention bf16: O, LSE against the CPU reference, T = 97 | alone", t.find("| memcheck")) ==
        std::string::npos);
  // TFLOP/s of each T, and the medians over T of flash's time over SDPA's: fwd 0.5/0.4, 1/1,
  // 2/2 -> 1.00; bwd 0.5, 2, 0.5 -> 0.50; both 0.8, 0.75, 0.5 -> 0.75
  CHECK(row(t, "attention").find("HS 64 p 0: flash TFLOP/s fwd/bwd/both at T 1k:137/172/150 2k:137/172/160 "
                                 "4k:137/172/160 | time / SDPA (median over T): fwd 1.00 bwd 0.50 both 0.75") !=
        std::string::npos);
  CHECK(t.find("HS 64 p 0.2: flash TFLOP/s fwd/bwd/both at T - | SDPA: not measured | 1 shape(s) not ok") !=
        std::string::npos);
  // the Hopper instructions' tests (the failing one named), then the kernels'
  CHECK(row(t, "hopper").find("instructions: 8 passed, 1 failed, 44 skipped of 9 (failed: hopper: wgmma m64nNk16 bf16, "
                              "MN-major (transposed) operands)") != std::string::npos);
  CHECK(t.find("kernels: 2 passed, 0 failed, 44 skipped of 2") != std::string::npos);
  // the attention step: the default kernels' rows, then each twin's, named by its prefix, with its time over the
  // default's where both ran a shape
  const char* const variants[] = {
      // the mma.sync kernels (TG_FLASH_HOPPER=0)
      "mma.sync kernels: HS 128 p 0.2: flash TFLOP/s fwd/bwd/both at T 1k:344/172/200 | time / SDPA (median over T): "
      "fwd 0.50 bwd 0.50 both 0.50",
      // the warp-specialized backward (TG_FLASH_HOPPER=2)
      "warp-specialized backward: HS 64 p 0.2: flash TFLOP/s fwd/bwd/both at T 4k:137/172/160 | time / SDPA (median "
      "over T): fwd 1.00 bwd 0.50 both 0.50",
      // the backward with dQ inside the dK / dV kernel (TG_FLASH_HOPPER=3)
      "dQ inside the dK / dV kernel: HS 128 p 0: flash TFLOP/s fwd/bwd/both at T 4k:137/172/160 | time / SDPA (median "
      "over T): fwd 1.00 bwd 2.00 both 1.00",
      // the forward with its producer warpgroup making the keep decisions (TG_FLASH_HOPPER=4)
      "keep decisions by the producer warpgroup: HS 64 p 0.2: flash TFLOP/s fwd/bwd/both at T 16k:275/172/160 | time / "
      "SDPA (median over T): fwd 0.50 bwd 0.50 both 0.50",
      // the backward with its kernels not pipelined (TG_FLASH_HOPPER=5)
      "backward not pipelined: HS 128 p 0.2: flash TFLOP/s fwd/bwd/both at T 4k:137/86/96 | time / SDPA (median over "
      "T): fwd 1.00 bwd 2.00 both 2.00",
      // the forward on key tiles of 64 (TG_FLASH_HOPPER=6)
      "forward on key tiles of 64: HS 64 p 0: flash TFLOP/s fwd/bwd/both at T 16k:137/172/160 | time / SDPA (median "
      "over T): fwd 2.00 bwd 1.00 both 1.20",
      // the forward with two consumer warpgroups where it takes three (TG_FLASH_HOPPER=7)
      "forward with two consumer warpgroups: HS 64 p 0: flash TFLOP/s fwd/bwd/both at T 4k:275/172/160 | time / SDPA "
      "(median over T): fwd 1.00 bwd 1.00 both 1.00 | time / the default's (median over T): fwd 0.50 bwd 1.00 both "
      "0.83",
      // the forward with its dropout on three consumer warpgroups (TG_FLASH_HOPPER=9)
      "forward with dropout on three consumer warpgroups: HS 64 p 0.2: flash TFLOP/s fwd/bwd/both at T 4k:137/172/160 "
      "| time / SDPA (median over T): fwd 1.00 bwd 0.50 both 0.50",
      // the forward with its consumer warpgroups not taking turns (TG_FLASH_HOPPER=8), a twin's run without SDPA
      // (--peer none): its time over the default's at T 4k alone, and no word of SDPA
      "forward without turns: HS 64 p 0: flash TFLOP/s fwd/bwd/both at T 4k:125/172/155 | time / the default's (median "
      "over T): fwd 1.10 bwd 1.00 both 1.03\n",
  };
  for (const char* line : variants) CHECK_MESSAGE(t.find(line) != std::string::npos, line);
  CHECK(row(t, "train_flash").find("5000 steps in 41.2 s, 7.10 ms/step (median), tokens/s 2307605, MFU 31.5%, "
                                   "peak device memory 3100 MiB (nvidia-smi), model buffers 2048 MiB, best val loss "
                                   "1.4652; attention: flash (Hopper wgmma kernels)") != std::string::npos);
  CHECK(row(t, "train_naive").find("timed-out") != std::string::npos);
  CHECK(row(t, "train_naive").find("did not finish: last logged step 250/5000, ms/step 12.0") != std::string::npos);
  CHECK(row(t, "train_naive").find("best val loss so far 1.80") != std::string::npos);
  // iterations from 100 on: 21, 20, 19, 900, 20 -> 20; our 7.10 over its 20 ms
  CHECK(row(t, "nanogpt").find("stopped at the time limit; last iteration logged 260, 20.00 ms/iteration (median from "
                               "iteration 100), best val loss 1.4697 (step 250), peak device memory 2500 MiB (nvidia-smi); train_gpt flash / nanoGPT ms per "
                               "iteration 0.35") != std::string::npos);
  CHECK(row(t, "sanitize").find("memcheck skipped; racecheck: 0 errors, 2 warnings (2 hazards) (6 passed, 0 failed, 39 skipped); initcheck: "
                                "no sanitizer summary") != std::string::npos);
  CHECK(row(t, "counters").find("skipped") != std::string::npos);
  CHECK(row(t, "counters").find("needs about 90 s, 20 s left") != std::string::npos);

  // a folder that is not a window's logs: one line, exit 2
  const cli::Run bad = cli::run_exe("bash", ".ci/gpu_check.sh summarize " + (d / "nothing").string());
  CHECK(bad.code == 2);
  CHECK(bad.err.find("not a window's log folder") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("GPU window: the counters row compares ncu's global requests and sectors per launch with the emulator's") {
  const fs::path d = cli::fresh_dir("tg_gpu_window_counters");
  fs::create_directories(d);
  write(d / "header.txt", "commit abc1234 (bundle), 2026-11-26 10:00 UTC, deadline 540 s, on the GPU\n");
  write(d / "steps.tsv", "counters\tok\t17\t30\t\n");
  write(d / "counters.log", "[doctest] test cases: 1 | 1 passed | 0 failed | 45 skipped\n");
  // ncu's CSV as it prints it: a header, numbers with thousands separators, names with template
  // arguments and <unnamed>; gelu_kernel launched twice (IDs 0 and 1), flash_kernel once
  const std::string hdr =
      "\"ID\",\"Process ID\",\"Process Name\",\"Host Name\",\"Kernel Name\",\"Context\",\"Stream\",\"Block Size\","
      "\"Grid Size\",\"Device\",\"CC\",\"Section Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n";
  auto row_of = [](int id, const std::string& kernel, const std::string& metric, const std::string& value) {
    return "\"" + std::to_string(id) + "\",\"9\",\"test_gpu\",\"127.0.0.1\",\"" + kernel +
           "\",\"1\",\"13\",\"(256, 1, 1)\",\"(8, 1, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"" + metric +
           "\",\"\",\"" + value + "\"\n";
  };
  const std::string gelu = "void gpu::<unnamed>::gelu_kernel<__nv_bfloat16, 8>(T1 *, const T1 *, int)";
  const std::string flash = "void flash::<unnamed>::flash_kernel<64, 1>(flash::Params)";
  std::string csv = "==PROF== Connected to process 9\n" + hdr;
  for (int id : {0, 1}) {
    csv += row_of(id, gelu, "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "384");
    csv += row_of(id, gelu, "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "3,072");
    csv += row_of(id, gelu, "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "192");
    csv += row_of(id, gelu, "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "3,072");
    csv += row_of(id, gelu, "gpu__time_duration.sum", "5,000");
  }
  csv += row_of(2, flash, "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "576");
  csv += row_of(2, flash, "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "10,368");
  csv += row_of(2, flash, "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "864");
  csv += row_of(2, flash, "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "6,240");
  write(d / "counters_ncu.csv", csv);
  // the emulator's lines: gelu in two instantiations (summed), one launch each; flash's load
  // sectors 9216 where ncu counted 10368
  write(d / "counters_emulated.txt",
        "emulated gelu_kernel<__nv_bfloat16, 8, false> | launches 1 | global ld 384 req 3072 sectors | global st 192 "
        "req 3072 sectors | shared ld 0 wavefronts 0 conflicts | shared st 0 wavefronts 0 conflicts | efficiency 1.0000\n"
        "emulated gelu_kernel<__nv_bfloat16, 8, true> | launches 1 | global ld 384 req 3072 sectors | global st 192 "
        "req 3072 sectors | shared ld 0 wavefronts 0 conflicts | shared st 0 wavefronts 0 conflicts | efficiency 1.0000\n"
        "emulated flash_kernel | launches 1 | global ld 576 req 9216 sectors | global st 864 req 6240 sectors | shared "
        "ld 10368 wavefronts 0 conflicts | shared st 2304 wavefronts 0 conflicts | efficiency 0.8012\n"
        "emulated loss_kernel | launches 1 | global ld 4 req 16 sectors | global st 1 req 1 sectors | shared ld 64 "
        "wavefronts 0 conflicts | shared st 32 wavefronts 0 conflicts | efficiency 0.9485\n");
  const cli::Run r = cli::run_exe("bash", ".ci/gpu_check.sh summarize " + d.string());
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.code == 0);
  // loss_kernel: not profiled by ncu, so not compared; gelu: (384, 3072, 192, 3072) a launch on
  // both sides; the header line is not a launch
  CHECK(row(r.out, "counters").find("ncu: 3 kernel launches profiled (counters_ncu.csv); emulated: 4 kernel lines "
                                    "(counters_emulated.txt); per launch, global requests and sectors equal the "
                                    "emulated ones for 1 of 2 kernels (differ: flash_kernel)") != std::string::npos);
  CHECK(r.out.find("stalls (") == std::string::npos);  // no ncu pass over the backward: no line

  // the backward's stall reasons (stalls_1.csv): per kernel its first launch's duration (ncu's unit
  // beside it) and its three largest reasons, "selected" left out; the dK / dV kernel's second
  // launch (ID 2) is not read
  auto sol = [](int id, const std::string& kernel, const std::string& metric, const std::string& unit,
                const std::string& value) {
    return "\"" + std::to_string(id) + "\",\"9\",\"bench_gpu\",\"127.0.0.1\",\"" + kernel +
           "\",\"1\",\"13\",\"(128, 1, 1)\",\"(64, 64, 1)\",\"0\",\"9.0\",\"GPU Speed Of Light Throughput\",\"" +
           metric + "\",\"" + unit + "\",\"" + value + "\"\n";
  };
  const std::string dkdv = "void flash::<unnamed>::flash_bwd_dkdv_hopper_kernel<128, 0, 0>(flash::BwdParams<__nv_bfloat16>)";
  const std::string dq = "void flash::<unnamed>::flash_bwd_dq_hopper_kernel<128, 0>(flash::BwdParams<__nv_bfloat16>)";
  const std::string st = "smsp__average_warps_issue_stalled_";
  const std::string ratio = "_per_issue_active.ratio";
  write(d / "stalls_1.csv",
        "==PROF== Connected to process 9\n" + hdr + sol(0, dkdv, "Duration", "msecond", "2.02") +
            sol(0, dkdv, st + "barrier" + ratio, "", "1.20") + sol(0, dkdv, st + "selected" + ratio, "", "9.00") +
            sol(0, dkdv, st + "long_scoreboard" + ratio, "", "2.50") + sol(0, dkdv, st + "wait" + ratio, "", "0.80") +
            sol(0, dkdv, st + "math_pipe_throttle" + ratio, "", "0.10") + sol(1, dq, "Duration", "ns", "1,143,200") +
            sol(1, dq, st + "wait" + ratio, "", "1.5") + sol(2, dkdv, "Duration", "msecond", "9.99"));
  const cli::Run s = cli::run_exe("bash", ".ci/gpu_check.sh summarize " + d.string());
  INFO("stdout:\n" << s.out << "\nstderr:\n" << s.err);
  REQUIRE(s.code == 0);
  CHECK(s.out.find("stalls (ncu; cycles a warp waits per instruction issued; HS 128, T 4k, p 0; the two kernels): "
                   "flash_bwd_dkdv_hopper_kernel 2.02 ms: long_scoreboard 2.50, barrier 1.20, wait 0.80; "
                   "flash_bwd_dq_hopper_kernel 1.14 ms: wait 1.50") != std::string::npos);
  CHECK(s.out.find("stall samples per SASS instruction") == std::string::npos);  // none written
  CHECK(s.out.find("the forward") == std::string::npos);  // no pass over the forward: no line
  // the forward's (stalls_fwd2.csv, p 0.2): its stall reasons and its four busiest pipes
  const std::string fwd = "void flash::<unnamed>::flash_fwd_hopper_kernel<64, 128, 2, 1, 0>(flash::FwdParams<__nv_bfloat16>, "
                          "CUtensorMap_st, bool)";
  const std::string pipe = "sm__pipe_", busy = "_cycles_active.avg.pct_of_peak_sustained_active";
  write(d / "stalls_fwd2.csv",
        hdr + sol(0, fwd, "Duration", "msecond", "2.31") + sol(0, fwd, st + "math_pipe_throttle" + ratio, "", "1.40") +
            sol(0, fwd, st + "wait" + ratio, "", "0.90") + sol(0, fwd, pipe + "alu" + busy, "%", "61.2") +
            sol(0, fwd, pipe + "fma" + busy, "%", "48.7") + sol(0, fwd, pipe + "fmaheavy" + busy, "%", "70.4") +
            sol(0, fwd, pipe + "tensor_op_gmma" + busy, "%", "18.0") + sol(0, fwd, pipe + "xu" + busy, "%", "9.5"));
  const cli::Run f2 = cli::run_exe("bash", ".ci/gpu_check.sh summarize " + d.string());
  CHECK(f2.out.find("stalls (ncu; cycles a warp waits per instruction issued; HS 64, T 4k, p 0.2; the forward): "
                    "flash_fwd_hopper_kernel 2.31 ms: math_pipe_throttle 1.40, wait 0.90; pipes busy: fmaheavy 70%, "
                    "alu 61%, fma 49%, tensor_op_gmma 18%") != std::string::npos);
  fs::remove(d / "stalls_fwd2.csv");
  // the source pages (kept whole in the logs; the line counts them), an empty one left out
  write(d / "sass_1.csv", "\"Address\",\"Source\"\n\"0\",\"LDC R1\"\n\"16\",\"S2R R0\"\n");
  write(d / "sass_3.csv", "");
  const cli::Run sass = cli::run_exe("bash", ".ci/gpu_check.sh summarize " + d.string());
  CHECK(sass.out.find("the dK / dV kernels' stall samples per SASS instruction (logs.tar.gz): sass_1.csv 3 lines\n") !=
        std::string::npos);
  fs::remove_all(d);
}
