// model/run/stop.cpp: the SIGINT / SIGTERM handler and the flag it sets (see model/run/stop.h).
#include "stop.h"

#include <signal.h>

#include <csignal>

namespace tg {

namespace {

// the stop requested; the ranks' stops deferred (a data-parallel run); a signal while deferred
volatile std::sig_atomic_t g_stop = 0, g_defer = 0, g_pending = 0;

}  // namespace

void request_stop() { g_stop = 1; }
bool stop_requested() { return g_stop != 0; }
void forget_stop_request() { g_stop = 0; }
void defer_stop_requests() { g_defer = 1; }
bool stop_pending() { return g_pending != 0; }

void install_stop_handler() {
  struct sigaction sa = {};
  sa.sa_handler = [](int) {
    if (g_defer) g_pending = 1;
    else request_stop();
  };
  // it stays installed: a signal often comes twice (timeout and Ctrl-C signal the whole process
  // group as well), and the second must not kill the run as it writes its checkpoint
  sa.sa_flags = 0;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGXFSZ, SIG_IGN);
}

}  // namespace tg
