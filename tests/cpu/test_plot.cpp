// tests/cpu/test_plot.cpp: metrics.jsonl -> SVG loss curves.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../../model/errors.h"
#include "../../model/plot.h"

using namespace tg;
namespace fs = std::filesystem;

namespace {
fs::path write_tmp(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / ("tg_plot_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}
size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("plot: reads train_gpt's metrics and draws every run") {
  fs::path a = write_tmp("a.jsonl",
                         "{\"step\": 0, \"train_loss\": 4.2, \"val_loss\": 4.19, \"eval_train_loss\": 4.2, \"lr\": 1e-05, "
                         "\"grad_norm\": 1.0, \"ms\": 50.0, \"tokens_per_s\": 15000.0}\n"
                         "{\"step\": 1, \"train_loss\": 3.9, \"lr\": 2e-05, \"grad_norm\": 1.0, \"ms\": 49.0, \"tokens_per_s\": 15000.0}\n"
                         "{\"step\": 2, \"train_loss\": null, \"val_loss\": 3.6, \"eval_train_loss\": 3.5, \"lr\": 3e-05, "
                         "\"ms\": null, \"tokens_per_s\": null, \"final\": true}\n");
  RunCurves r = read_metrics(a.string(), "flash");
  REQUIRE(r.train.size() == 2);  // the closing evaluation (train_loss null) is not a training step
  CHECK(r.train[1] == std::make_pair(1.0, 3.9));
  REQUIRE(r.val.size() == 2);
  CHECK(r.val[1] == std::make_pair(2.0, 3.6));
  RunCurves b = r;
  b.label = "naive & <co>";
  std::string svg = loss_svg({r, b}, "baby");
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(count(svg, "<polyline") == 4);  // train and val of two runs
  CHECK(count(svg, "<circle") == 4);    // one dot per evaluation
  CHECK(svg.find("naive &amp; &lt;co&gt; val") != std::string::npos);
  CHECK(svg.find("nan") == std::string::npos);
  fs::remove(a);
}

TEST_CASE("plot: bad metrics are refused with the line number") {
  fs::path bad = write_tmp("bad.jsonl", "{\"step\": 0, \"train_loss\": 4.2, \"ms\": 1}\nnot json\n");
  try {
    read_metrics(bad.string(), "x");
    FAIL("no error");
  } catch (const InputError& e) {
    std::string m = e.what();
    CHECK(m.find("line 2") != std::string::npos);
    CHECK(m.find("expected") != std::string::npos);
  }
  CHECK_THROWS_AS(read_metrics("/nonexistent/metrics.jsonl", "x"), InputError);
  CHECK_THROWS_AS(loss_svg({RunCurves{}}, "empty"), InputError);
  fs::remove(bad);
}
