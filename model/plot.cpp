// model/plot.cpp: metrics.jsonl -> SVG loss curves (see model/plot.h). No dependency: the
// JSON lines are train_gpt's own flat objects of numbers, read field by field.
#include "plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "errors.h"

namespace tg {

namespace {

// The number after "key": in a flat JSON object line; false when the key is absent.
bool json_number(const std::string& line, const std::string& key, double& out) {
  const std::string k = "\"" + key + "\":";
  size_t p = line.find(k);
  if (p == std::string::npos) return false;
  const char* s = line.c_str() + p + k.size();
  char* end = nullptr;
  out = std::strtod(s, &end);
  return end != s && std::isfinite(out);
}

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", x);
  return b;
}

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about n ticks over span.
double tick_step(double span, int n) {
  double raw = span / n, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

}  // namespace

RunCurves read_metrics(const std::string& path, const std::string& label) {
  std::ifstream f(path);
  if (!f)
    throw InputError("cannot read metrics file '" + path + "'; expected a run's metrics.jsonl; pass the path of one (out/<run>/metrics.jsonl)");
  RunCurves r;
  r.label = label;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.empty() || line.find("\"skipped\": true") != std::string::npos) continue;  // NaN-guarded step
    double step, loss, val;
    const bool has_loss = json_number(line, "train_loss", loss) || line.find("\"train_loss\": null") != std::string::npos;
    if (line.front() != '{' || !json_number(line, "step", step) || !has_loss)
      throw InputError("metrics file '" + path + "' line " + std::to_string(n) +
                       " is not a train_gpt metrics object; expected {\"step\": ..., \"train_loss\": ...}; pass a metrics.jsonl written by train_gpt");
    // the closing evaluation (train_loss null) has no training step
    if (json_number(line, "train_loss", loss)) r.train.push_back({step, loss});
    if (json_number(line, "val_loss", val)) r.val.push_back({step, val});
  }
  return r;
}

std::string loss_svg(const std::vector<RunCurves>& runs, const std::string& title) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const RunCurves& r : runs)
    for (const auto* pts : {&r.train, &r.val})
      for (auto [x, y] : *pts) {
        x0 = std::min(x0, x); x1 = std::max(x1, x);
        y0 = std::min(y0, y); y1 = std::max(y1, y);
      }
  if (!(x0 <= x1))
    throw InputError("no loss values to plot; expected metrics.jsonl files with logged steps; train a run first");
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double W = 900, H = 540, L = 70, R = 200, T = 50, B = 60;  // canvas and margins
  const double pw = W - L - R, ph = H - T - B;
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * ph; };
  const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << L + pw / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" << escape(title) << "</text>\n";
  // axes, ticks and grid
  const double xs = tick_step(x1 - x0, 8), ys = tick_step(y1 - y0, 6);
  for (double x = std::ceil(x0 / xs) * xs; x <= x1 + 1e-9; x += xs)
    s << "<line x1=\"" << X(x) << "\" y1=\"" << T << "\" x2=\"" << X(x) << "\" y2=\"" << T + ph
      << "\" stroke=\"#eee\"/><text x=\"" << X(x) << "\" y=\"" << T + ph + 18 << "\" text-anchor=\"middle\">" << num(x)
      << "</text>\n";
  for (double y = std::ceil(y0 / ys) * ys; y <= y1 + 1e-9; y += ys)
    s << "<line x1=\"" << L << "\" y1=\"" << Y(y) << "\" x2=\"" << L + pw << "\" y2=\"" << Y(y)
      << "\" stroke=\"#eee\"/><text x=\"" << L - 8 << "\" y=\"" << Y(y) + 4 << "\" text-anchor=\"end\">" << num(y)
      << "</text>\n";
  s << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"black\"/>\n"
    << "<text x=\"" << L + pw / 2 << "\" y=\"" << H - 15 << "\" text-anchor=\"middle\">step</text>\n"
    << "<text x=\"18\" y=\"" << T + ph / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " << T + ph / 2
    << ")\">loss</text>\n";
  // curves and legend
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunCurves& r = runs[i];
    const char* c = colours[i % 6];
    auto polyline = [&](const std::vector<std::pair<double, double>>& pts, const char* width, const char* opacity) {
      if (pts.empty()) return;
      s << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"" << width << "\" stroke-opacity=\"" << opacity
        << "\" points=\"";
      for (auto [x, y] : pts) s << num(X(x)) << "," << num(Y(y)) << " ";
      s << "\"/>\n";
    };
    polyline(r.train, "1", "0.45");
    polyline(r.val, "2.5", "1");
    for (auto [x, y] : r.val) s << "<circle cx=\"" << num(X(x)) << "\" cy=\"" << num(Y(y)) << "\" r=\"3\" fill=\"" << c << "\"/>\n";
    const double ly = T + 10 + 40 * i;
    s << "<line x1=\"" << L + pw + 15 << "\" y1=\"" << ly << "\" x2=\"" << L + pw + 40 << "\" y2=\"" << ly << "\" stroke=\"" << c
      << "\" stroke-width=\"2.5\"/><text x=\"" << L + pw + 46 << "\" y=\"" << ly + 4 << "\">" << escape(r.label)
      << " val</text>\n"
      << "<line x1=\"" << L + pw + 15 << "\" y1=\"" << ly + 16 << "\" x2=\"" << L + pw + 40 << "\" y2=\"" << ly + 16
      << "\" stroke=\"" << c << "\" stroke-opacity=\"0.45\"/><text x=\"" << L + pw + 46 << "\" y=\"" << ly + 20 << "\">"
      << escape(r.label) << " train</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace tg
