// model/formats/plot.h: loss curves as an SVG picture, from one or more runs' metrics.jsonl
// (train_gpt --plot OUT.svg RUN/metrics.jsonl ...; make plot RUNS="out/a out/b").
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace tg {

// One run's curves: the training loss of every logged step, and the evaluations.
struct RunCurves {
  std::string label;                          // shown in the legend
  std::vector<std::pair<double, double>> train;  // (step, train_loss) of the training steps
  std::vector<std::pair<double, double>> val;    // (step, val_loss) where evaluated
};

// Reads a metrics.jsonl written by train(). Throws InputError (missing, unreadable, or a
// line that is not one of train_gpt's JSON objects: says which line).
RunCurves read_metrics(const std::string& path, const std::string& label);

// The SVG text: train loss (thin line) and val loss (thick line with markers) against step,
// axes with ticks. Each run has its own colour, dash pattern and marker shape, so that runs
// with identical curves (flash and naive, same seed) all show. The legend sits right of the
// plot area and is as wide as its labels need: a label longer than kLegendChars characters is
// shortened in the middle (legend_label); each run is one <g> whose <title> holds its full
// name. Throws InputError when no run has a point.
std::string loss_svg(const std::vector<RunCurves>& runs, const std::string& title);

// label shortened to at most max_chars characters (UTF-8) by an ellipsis in its middle.
constexpr size_t kLegendChars = 32;
std::string legend_label(const std::string& label, size_t max_chars);

}  // namespace tg
