// tests/cpu/test_plot.cpp: metrics.jsonl -> SVG loss curves.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../../data/errors.h"
#include "../../model/formats/plot.h"

using namespace tg;
namespace fs = std::filesystem;

namespace {
fs::path write_tmp(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / ("tg_plot_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}
size_t chars_of(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
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
  CHECK(count(svg, "<circle") == 3);    // run 0's marker: one per evaluation, one in the legend
  CHECK(count(svg, "<rect x=") == 3 + 1);  // run 1's marker (and the plot frame)
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
  // not a file: a directory (it read as no lines) and a device (/dev/zero: one line without end)
  for (const std::string& path : {fs::temp_directory_path().string(), std::string("/dev/null")}) {
    CAPTURE(path);
    CHECK_THROWS_WITH_AS(read_metrics(path, "x"), doctest::Contains("is not a regular file"), InputError);
  }
  CHECK_THROWS_AS(loss_svg({RunCurves{}}, "empty"), InputError);
  fs::remove(bad);
}

TEST_CASE("plot: any JSON spelling of a line reads; NaN-skipped steps are left out") {
  fs::path a = write_tmp("spelling.jsonl",
                         "{\"train_loss\":4.5,\"step\":0}\n"
                         "{ \"step\" : 1 , \"train_loss\" : null , \"skipped\" : true }\n"
                         "{\"step\": 2, \"train_loss\": 4.25, \"val_loss\": 4.5e0}\n");
  RunCurves r = read_metrics(a.string(), "x");
  REQUIRE(r.train.size() == 2);
  CHECK(r.train[0] == std::make_pair(0.0, 4.5));
  CHECK(r.train[1] == std::make_pair(2.0, 4.25));
  REQUIRE(r.val.size() == 1);
  fs::remove(a);
  for (const char* bad : {"{\"step\": \"0\", \"train_loss\": 1}", "[0, 1]", "{\"step\": 0}", "{\"step\": 0, \"train_loss\": 1"}) {
    CAPTURE(bad);
    fs::path b = write_tmp("bad2.jsonl", std::string(bad) + "\n");
    CHECK_THROWS_AS(read_metrics(b.string(), "x"), InputError);
    fs::remove(b);
  }
}

TEST_CASE("plot: identical runs both show, long names never clip, the legend stays outside the plot") {
  RunCurves a{"flash", {{0, 4.0}, {1, 3.0}, {2, 2.5}}, {{0, 4.1}, {2, 2.6}}};
  RunCurves b = a;
  b.label = "shakespeare-char-naive-attention-fp32-dropout-0.2-seed-1337";
  const std::string svg = loss_svg({a, b}, "t");
  // each run its own dash pattern: run 0 solid, run 1 dashed (4 strokes: 2 curves + 2 legend lines)
  CHECK(count(svg, "stroke-dasharray=\"9 5\"") == 4);
  CHECK(count(svg, "stroke-dasharray") == 4);
  // the long name: shortened in the middle in the legend, whole in the group's title
  const std::string shown = legend_label(b.label, kLegendChars);
  CHECK(shown == "shakespeare-cha\u2026ut-0.2-seed-1337");  // 15 + 1 + 16 characters
  CHECK(svg.find(">" + shown + " val</text>") != std::string::npos);
  CHECK(svg.find("<title>" + b.label + "</title>") != std::string::npos);
  CHECK(legend_label("short", kLegendChars) == "short");
  CHECK(legend_label("\u03b1\u03b2\u03b3\u03b4\u03b5\u03b6", 5) == "\u03b1\u03b2\u2026\u03b5\u03b6");  // characters, not bytes
  // the legend's text starts right of the plot area and the picture is wide enough for it
  const double plot_right = 70 + 630;
  size_t p = svg.find(">flash val</text>");
  REQUIRE(p != std::string::npos);
  const size_t xq = svg.rfind("<text x=\"", p);
  const double legend_x = std::stod(svg.substr(xq + 9));
  CHECK(legend_x > plot_right);
  const double width = std::stod(svg.substr(svg.find("width=\"") + 7));
  CHECK(width >= legend_x + (chars_of(shown) + 6) * 6.0);
}
