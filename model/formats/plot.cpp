// model/formats/plot.cpp: metrics.jsonl -> SVG loss curves (see model/formats/plot.h). Each line is read with
// nlohmann-json (model/formats/json_io.h); the picture is written by hand (SVG is text).
#include "plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../../data/errors.h"
#include "json_io.h"

namespace tg {

namespace {

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
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

// Characters of UTF-8 text (continuation bytes not counted).
size_t chars(const std::string& s) {
  return (size_t)std::count_if(s.begin(), s.end(), [](char c) { return ((unsigned char)c & 0xC0) != 0x80; });
}

// The first (or, from the end, the last) n characters of UTF-8 text.
std::string first_chars(const std::string& s, size_t n) {
  size_t i = 0;
  for (size_t k = 0; i < s.size() && k <= n; ++i) k += ((unsigned char)s[i] & 0xC0) != 0x80;
  return n >= chars(s) ? s : s.substr(0, i - 1);
}
std::string last_chars(const std::string& s, size_t n) {
  size_t i = s.size();
  for (size_t k = 0; i > 0 && k < n;) k += ((unsigned char)s[--i] & 0xC0) != 0x80;
  return s.substr(i);
}

// A series' number: a finite JSON number, or false.
bool finite_number(const jsonio::Value& j, const char* key, double& out) {
  if (!j.contains(key) || !j[key].is_number()) return false;
  out = j[key].get_double();
  return std::isfinite(out);
}

}  // namespace

std::string legend_label(const std::string& label, size_t max_chars) {
  if (chars(label) <= max_chars) return label;
  const size_t head = (max_chars - 1) / 2, tail = max_chars - 1 - head;
  return first_chars(label, head) + "\u2026" + last_chars(label, tail);
}

RunCurves read_metrics(const std::string& path, const std::string& label) {
  // a directory reads as no lines, /dev/zero as one line without end, a FIFO waits for a writer
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw InputError("metrics file '" + path + "' is not a regular file (a directory, device or FIFO); expected a run's "
                     "metrics.jsonl; pass the path of one (out/<run>/metrics.jsonl)");
  std::ifstream f(path);
  if (!f)
    throw InputError("cannot read metrics file '" + path + "'; expected a run's metrics.jsonl; pass the path of one (out/<run>/metrics.jsonl)");
  RunCurves r;
  r.label = label;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.empty()) continue;
    const jsonio::Value j = jsonio::parse(line);
    const bool ok = j.is_object() && j.contains("step") && j["step"].is_number() && j.contains("train_loss") &&
                    (j["train_loss"].is_number() || j["train_loss"].is_null());
    if (!ok)
      throw InputError("metrics file '" + path + "' line " + std::to_string(n) +
                       " is not a train_gpt metrics object; expected {\"step\": ..., \"train_loss\": ...}; pass a metrics.jsonl written by train_gpt");
    if (j.value("skipped", false)) continue;  // a NaN-guarded step
    const double step = j["step"].get_double();
    double loss, val;
    // the closing evaluation (train_loss null) has no training step
    if (finite_number(j, "train_loss", loss)) r.train.push_back({step, loss});
    if (finite_number(j, "val_loss", val)) r.val.push_back({step, val});
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
  // the legend sits right of the plot, as wide as its longest (shortened) label needs
  std::vector<std::string> labels;
  size_t longest = 0;
  for (const RunCurves& r : runs) {
    labels.push_back(legend_label(r.label, kLegendChars));
    longest = std::max(longest, chars(labels.back()));
  }
  const double char_w = 7.2;  // generous for 12 px sans-serif
  const double L = 70, T = 50, B = 60, pw = 630, ph = 430;  // margins and plot area
  const double legend_x = L + pw + 20, legend_w = 40 + 8 + (longest + 6) * char_w;
  const double W = legend_x + legend_w + 10, H = std::max(T + ph + B, T + 10 + 44.0 * runs.size() + 20);
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * ph; };
  const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
  // one dash pattern per run, so that identical curves both show: the later run's gaps
  // reveal the earlier run's colour under it
  const char* dashes[] = {"", "9 5", "3 4", "12 4 3 4", "6 3 1 3 1 3", "2 7"};
  // one marker shape per run for the evaluations, drawn smaller as runs go on
  auto marker = [&](std::ostream& s, size_t i, double x, double y, const char* c) {
    const double r = 4.5 - 0.5 * (double)(i % 4);
    switch (i % 4) {
      case 0: s << "<circle cx=\"" << num(x) << "\" cy=\"" << num(y) << "\" r=\"" << r << "\" fill=\"" << c << "\"/>"; break;
      case 1: s << "<rect x=\"" << num(x - r) << "\" y=\"" << num(y - r) << "\" width=\"" << 2 * r << "\" height=\"" << 2 * r
                << "\" fill=\"none\" stroke=\"" << c << "\" stroke-width=\"1.5\"/>"; break;
      case 2: s << "<path d=\"M" << num(x) << " " << num(y - r) << "L" << num(x + r) << " " << num(y) << "L" << num(x) << " "
                << num(y + r) << "L" << num(x - r) << " " << num(y) << "Z\" fill=\"" << c << "\"/>"; break;
      default: s << "<path d=\"M" << num(x) << " " << num(y - r) << "L" << num(x + r) << " " << num(y + r) << "L" << num(x - r)
                 << " " << num(y + r) << "Z\" fill=\"none\" stroke=\"" << c << "\" stroke-width=\"1.5\"/>";
    }
  };

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(W) << "\" height=\"" << num(H)
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << L + pw / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" << escape(title) << "</text>\n";
  // axes, ticks and grid
  const double xs = tick_step(x1 - x0, 8), ys = tick_step(y1 - y0, 6);
  for (double x = std::ceil(x0 / xs) * xs; x <= x1 + 1e-9; x += xs)
    s << "<line x1=\"" << num(X(x)) << "\" y1=\"" << T << "\" x2=\"" << num(X(x)) << "\" y2=\"" << T + ph
      << "\" stroke=\"#eee\"/><text x=\"" << num(X(x)) << "\" y=\"" << T + ph + 18 << "\" text-anchor=\"middle\">" << num(x)
      << "</text>\n";
  for (double y = std::ceil(y0 / ys) * ys; y <= y1 + 1e-9; y += ys)
    s << "<line x1=\"" << L << "\" y1=\"" << num(Y(y)) << "\" x2=\"" << L + pw << "\" y2=\"" << num(Y(y))
      << "\" stroke=\"#eee\"/><text x=\"" << L - 8 << "\" y=\"" << num(Y(y) + 4) << "\" text-anchor=\"end\">" << num(y)
      << "</text>\n";
  s << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"black\"/>\n"
    << "<text x=\"" << L + pw / 2 << "\" y=\"" << T + ph + 45 << "\" text-anchor=\"middle\">step</text>\n"
    << "<text x=\"18\" y=\"" << T + ph / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " << T + ph / 2
    << ")\">loss</text>\n";
  // curves, then the legend; each run one group whose <title> is its full name
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunCurves& r = runs[i];
    const char* c = colours[i % 8];
    const char* dash = dashes[i % 6];
    auto stroke = [&](const char* width, const char* opacity) {
      std::string a = " fill=\"none\" stroke=\"" + std::string(c) + "\" stroke-width=\"" + width + "\" stroke-opacity=\"" +
                      opacity + "\"";
      if (*dash) a += " stroke-dasharray=\"" + std::string(dash) + "\"";
      return a;
    };
    auto polyline = [&](const std::vector<std::pair<double, double>>& pts, const char* width, const char* opacity) {
      if (pts.empty()) return;
      s << "<polyline" << stroke(width, opacity) << " points=\"";
      for (auto [x, y] : pts) s << num(X(x)) << "," << num(Y(y)) << " ";
      s << "\"/>\n";
    };
    s << "<g><title>" << escape(r.label) << "</title>\n";
    polyline(r.train, "1", "0.5");
    polyline(r.val, "2.5", "1");
    for (auto [x, y] : r.val) marker(s, i, X(x), Y(y), c), s << "\n";
    const double ly = T + 10 + 44 * i;
    s << "<line x1=\"" << legend_x << "\" y1=\"" << ly << "\" x2=\"" << legend_x + 40 << "\" y2=\"" << ly << "\""
      << stroke("2.5", "1") << "/>";
    marker(s, i, legend_x + 20, ly, c);
    s << "<text x=\"" << legend_x + 48 << "\" y=\"" << ly + 4 << "\">" << escape(labels[i]) << " val</text>\n"
      << "<line x1=\"" << legend_x << "\" y1=\"" << ly + 18 << "\" x2=\"" << legend_x + 40 << "\" y2=\"" << ly + 18 << "\""
      << stroke("1", "0.5") << "/><text x=\"" << legend_x + 48 << "\" y=\"" << ly + 22 << "\">" << escape(labels[i])
      << " train</text>\n</g>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace tg
