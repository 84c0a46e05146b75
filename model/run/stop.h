// model/run/stop.h: stopping a run on SIGINT / SIGTERM. The handler (model/run/stop.cpp) only
// sets a flag; the places that take time poll it: the training loop before every step, the CPU
// model between layers (forward and backward), the evaluation between batches, sampling before
// every token. A training step or an evaluation cut short throws Interrupted; the loop then
// stops as if the signal had come before that step (a step changes no weight before its
// update), so a stop is honoured within a fraction of a second wherever the run is, and resumes
// bitwise.
// A contract of the run with the network: the CPU model (model/net/gpt_cpu.cpp) polls the flag
// through it.
#pragma once

namespace tg {

// Asks a running train() to stop (it writes a checkpoint first) and sample() before its next
// token: the SIGINT / SIGTERM handler calls it. Async-signal-safe.
void request_stop();
bool stop_requested();
void forget_stop_request();  // for tests: the next train() runs again
// Installs that handler for SIGINT and SIGTERM (for good: a repeated signal does not kill the
// run as it checkpoints; SIGKILL does), and ignores SIGXFSZ, so that a write past the file
// size limit fails with EFBIG and is reported like any other failed write. main() calls it
// before anything slow.
void install_stop_handler();

// Thrown by work that polls stop_requested() and gives up part-way (a training step, an
// evaluation); train() catches it.
struct Interrupted {};

// A data-parallel run (model/run/dist.h): from this call on, a signal only marks a stop as
// pending (stop_pending()) instead of requesting it. The training loop agrees on it with the
// other ranks inside its step's all-reduce and then calls request_stop() on every rank at the
// same step, so that no rank leaves a collective the others wait in.
void defer_stop_requests();
bool stop_pending();

// Throws Interrupted when a stop has been requested.
inline void throw_if_stop_requested() {
  if (stop_requested()) throw Interrupted{};
}

}  // namespace tg
