// Hand-written SVG chart of accuracy by phase. Presentation attributes instead of CSS so that the
// file looks the same standalone, inlined in the HTML report, or opened by a vector editor.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "report/report.h"
#include "util/error.h"

namespace phasekv {

namespace {

// Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
// Longest legend label shown in full; the legend column is sized for it.
constexpr size_t kLegendChars = 40;

// Phases sit at the centres of M equal bands, so band edges are entry boundaries: phase kS - 1
// and kS are in different compressed entries (every S tokens a new entry begins; its W slots
// hold tokens jS + S - W ... jS + S - 1).
struct Frame {
  int modulus = 1;
  double width = 760, height = 420;
  double left = 64, right = 24, top = 56, bottom = 56;
  double plot_w() const { return width - left - right; }
  double plot_h() const { return height - top - bottom; }
  double band() const { return plot_w() / modulus; }
  double edge(int phase) const { return left + phase * band(); }
  double x(double phase) const { return left + (phase + 0.5) * band(); }
  double y(double acc) const { return top + (1.0 - std::clamp(acc, 0.0, 1.0)) * plot_h(); }
};

Frame make_frame(const PhaseSeries& series) {
  Frame f;
  for (const auto& [label, s] : series) f.modulus = std::max(f.modulus, s.modulus);
  if (series.size() > 1) {
    size_t longest = 0;
    for (const auto& [label, s] : series) longest = std::max(longest, label.size());
    // 7.6 px per character: DejaVu Sans (Debian's default sans-serif) at 12 px averages about 7
    // for lowercase letters and digits (measured by tests/browser).
    f.right = 48 + 7.6 * static_cast<double>(std::min(longest, kLegendChars));
    f.width += f.right - 24;
  }
  return f;
}

// The stride drawn as entry boundaries: the one every series that knows its stride agrees on
// (and that fits the axis); none when they disagree, rather than one series' grid for all.
int chart_stride(const PhaseSeries& series, const Frame& f) {
  int stride = 0;
  for (const auto& [label, s] : series) {
    if (s.stride <= 0) continue;
    if (stride > 0 && s.stride != stride) return 0;
    stride = s.stride;
  }
  return stride > 0 && f.modulus % stride == 0 ? stride : 0;
}

std::string svg_open(const Frame& f, const std::string& title) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
      "viewBox=\"0 0 {0:.0f} {1:.0f}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<title>{2}</title>\n"
      "<rect x=\"0\" y=\"0\" width=\"{0:.0f}\" height=\"{1:.0f}\" fill=\"#ffffff\"/>\n"
      "<text x=\"{3:.1f}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{2}</text>\n",
      f.width, f.height, xml_escape(title), f.left);
}

std::string svg_stride_guides(const Frame& f, int stride) {
  if (stride <= 0) return "";
  std::string out;
  for (int r = stride - 1; r < f.modulus; r += stride) {
    out += fmt::format(
        "<rect class=\"boundary\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
        "fill=\"#eeeeee\"/>\n",
        f.edge(r), f.top, f.band(), f.plot_h());
  }
  for (int r = stride; r < f.modulus; r += stride) {
    out += fmt::format(
        "<line class=\"stride\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" "
        "stroke=\"#777777\" stroke-dasharray=\"2,3\"/>\n",
        f.edge(r), f.top, f.top + f.plot_h());
  }
  return out;
}

std::string svg_y_axis(const Frame& f) {
  std::string out;
  for (int i = 0; i <= 5; ++i) {
    const double acc = 0.2 * i;
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{2:.1f}\" x2=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#dddddd\"/>\n"
        "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:.1f}</text>\n",
        f.left, f.left + f.plot_w(), f.y(acc), f.left - 6, f.y(acc) + 4, acc);
  }
  out += fmt::format(
      "<text transform=\"translate({:.1f},{:.1f}) rotate(-90)\" text-anchor=\"middle\">"
      "accuracy</text>\n",
      f.left - 44, f.top + f.plot_h() / 2);
  return out;
}

std::string svg_x_axis(const Frame& f) {
  const double base = f.top + f.plot_h();
  const int every = std::max(1, (f.modulus + 23) / 24);  // at most ~24 labels
  std::string out;
  for (int r = 0; r < f.modulus; r += every) {
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", f.x(r),
                       base + 16, r);
  }
  out += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#333333\"/>\n"
      "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">phase r = target position mod {}"
      "</text>\n",
      f.left, f.top, f.plot_w(), f.plot_h(), f.left + f.plot_w() / 2, base + 40, f.modulus);
  return out;
}

std::string svg_caption(const Frame& f, int stride) {
  std::string text = "bars: 95% Wilson CI; dashed: mean";
  if (stride > 0)
    text += fmt::format(
        "; dotted: entry boundaries (S = {}); shaded: boundary phases, r mod S = S-1", stride);
  return fmt::format("<text x=\"{:.1f}\" y=\"42\" fill=\"#555555\" font-size=\"11\">{}</text>\n",
                     f.left, xml_escape(text));
}

// Error bar with caps as one path, so each phase has exactly one `errbar` element.
std::string svg_error_bar(const Frame& f, double x, const PhaseRow& p, const char* color) {
  const double lo = f.y(p.ci_lo), hi = f.y(p.ci_hi), cap = 3.0;
  return fmt::format(
      "<path class=\"errbar\" d=\"M{0:.1f},{1:.1f}V{2:.1f}M{3:.1f},{1:.1f}H{4:.1f}M{3:.1f},{2:.1f}"
      "H{4:.1f}\" stroke=\"{5}\" fill=\"none\"/>\n",
      x, lo, hi, x - cap, x + cap, color);
}

std::string svg_series(const Frame& f, const std::string& label, const PhaseSummary& s,
                       const char* color, double offset) {
  std::string out = fmt::format("<g class=\"series\" data-label=\"{}\">\n", xml_escape(label));
  out += fmt::format(
      "<line class=\"mean\" x1=\"{0:.1f}\" y1=\"{2:.1f}\" x2=\"{1:.1f}\" y2=\"{2:.1f}\" "
      "stroke=\"{3}\" stroke-dasharray=\"6,4\"/>\n",
      f.left, f.left + f.plot_w(), f.y(s.mean_acc), color);
  for (const PhaseRow& p : s.phases) {
    const double x = f.x(p.r + offset);
    out += svg_error_bar(f, x, p, color);
    out += fmt::format(
        "<circle class=\"point\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\">"
        "<title>{} r={}: {:.3f} [{:.3f}, {:.3f}], n={}</title></circle>\n",
        x, f.y(p.acc), color, xml_escape(label), p.r, p.acc, p.ci_lo, p.ci_hi, p.n);
  }
  return out + "</g>\n";
}

// Legend text of at most kLegendChars characters: longer labels keep their end (for paths, the
// distinctive part) after an ellipsis; the full label stays in the entry's tooltip.
std::string legend_text(const std::string& label) {
  if (label.size() <= kLegendChars) return label;
  size_t start = label.size() - (kLegendChars - 1);
  while (start < label.size() && (static_cast<unsigned char>(label[start]) & 0xC0) == 0x80) {
    ++start;  // not in the middle of a UTF-8 sequence
  }
  return "\u2026" + label.substr(start);
}

std::string svg_legend(const Frame& f, const PhaseSeries& series) {
  const double x = f.left + f.plot_w() + 16;
  std::string out = "<g class=\"legend\">\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const double y = f.top + 8 + 20.0 * static_cast<double>(i);
    const char* color = kPalette[i % kPaletteSize];
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"{3}\"/>"
        "<circle cx=\"{4:.1f}\" cy=\"{1:.1f}\" r=\"3.5\" fill=\"{3}\"/>"
        "<text x=\"{5:.1f}\" y=\"{6:.1f}\"><title>{7}</title>{8}</text>\n",
        x, y, x + 18, color, x + 9, x + 24, y + 4, xml_escape(series[i].first),
        xml_escape(legend_text(series[i].first)));
  }
  return out + "</g>\n";
}

}  // namespace

std::string phase_svg(const PhaseSeries& series, const std::string& title) {
  if (series.empty()) throw Error("phase_svg: no series to plot");
  const Frame f = make_frame(series);
  const int stride = chart_stride(series, f);
  std::string out = svg_open(f, title);
  out += svg_caption(f, stride);
  out += svg_stride_guides(f, stride);
  out += svg_y_axis(f);
  out += svg_x_axis(f);
  // Side-by-side offsets keep overlapping error bars of several series apart.
  const double step = std::min(0.12, 0.6 / static_cast<double>(series.size()));
  for (size_t i = 0; i < series.size(); ++i) {
    const double offset = (static_cast<double>(i) - (series.size() - 1) / 2.0) * step;
    out += svg_series(f, series[i].first, series[i].second, kPalette[i % kPaletteSize], offset);
  }
  if (series.size() > 1) out += svg_legend(f, series);
  return out + "</svg>\n";
}

}  // namespace phasekv

// -------------------------------------------------------------------------------------------------
// Explanation charts.

namespace phasekv {
namespace {

// White at t = 0, red (#B2182B) at t = -1, blue (#2166AC) at t = +1, linear in RGB.
std::string diverging_colour(double t) {
  if (std::isnan(t)) return "#cccccc";
  t = std::clamp(t, -1.0, 1.0);
  const int end[2][3] = {{0xB2, 0x18, 0x2B}, {0x21, 0x66, 0xAC}};
  const int* e = end[t < 0 ? 0 : 1];
  const double a = std::abs(t);
  auto mix = [&](int c) { return static_cast<int>(std::lround(255.0 + a * (c - 255.0))); };
  return fmt::format("#{:02X}{:02X}{:02X}", mix(e[0]), mix(e[1]), mix(e[2]));
}

std::string format_value(double v, int decimals) {
  return std::isnan(v) ? std::string("-") : fmt::format("{:.{}f}", v, decimals);
}

}  // namespace

std::string heatmap_svg(const Heatmap& h) {
  if (h.rows.empty() || h.cols.empty()) throw Error("heatmap_svg: no rows or columns");
  if (h.values.size() != h.rows.size())
    throw Error("heatmap_svg: values has " + std::to_string(h.values.size()) + " rows, expected " +
                std::to_string(h.rows.size()));
  for (const auto& row : h.values)
    if (row.size() != h.cols.size())
      throw Error("heatmap_svg: a row has " + std::to_string(row.size()) + " values, expected " +
                  std::to_string(h.cols.size()));
  if (!(h.limit > 0.0)) throw Error("heatmap_svg: limit must be > 0");
  size_t label_chars = 0;
  for (const auto& r : h.rows) label_chars = std::max(label_chars, r.size());
  Frame f;
  f.left = 24 + 7.6 * static_cast<double>(std::min<size_t>(label_chars, 24));
  const double cell_w = std::clamp(560.0 / static_cast<double>(h.cols.size()), 28.0, 64.0);
  const double cell_h = 26.0;
  f.top = 72;
  f.width = std::max(640.0, f.left + cell_w * static_cast<double>(h.cols.size()) + 110);
  f.height = f.top + cell_h * static_cast<double>(h.rows.size()) + 56;
  std::string out = svg_open(f, h.title);
  if (!h.caption.empty())
    out += fmt::format("<text x=\"{:.1f}\" y=\"42\" fill=\"#555555\" font-size=\"11\">{}</text>\n",
                       f.left, xml_escape(h.caption));
  for (size_t c = 0; c < h.cols.size(); ++c) {
    const bool shaded =
        std::find(h.shaded_cols.begin(), h.shaded_cols.end(), static_cast<int>(c)) !=
        h.shaded_cols.end();
    const double x = f.left + cell_w * static_cast<double>(c);
    if (shaded)
      out += fmt::format(
          "<rect class=\"shaded\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"16\" "
          "fill=\"#dddddd\"/>\n",
          x, f.top - 18, cell_w);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                       x + cell_w / 2, f.top - 6, xml_escape(h.cols[c]));
  }
  for (size_t r = 0; r < h.rows.size(); ++r) {
    const double y = f.top + cell_h * static_cast<double>(r);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
                       f.left - 6, y + cell_h / 2 + 4, xml_escape(h.rows[r]));
    for (size_t c = 0; c < h.cols.size(); ++c) {
      const double v = h.values[r][c];
      const double t = (v - h.center) / h.limit;
      const std::string fill = diverging_colour(t);
      const std::string ink = std::abs(t) > 0.6 ? "#ffffff" : "#000000";
      const double x = f.left + cell_w * static_cast<double>(c);
      out += fmt::format(
          "<g class=\"cell\"><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
          "fill=\"{}\" stroke=\"#ffffff\"><title>{} {}: {}{}</title></rect>"
          "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\" fill=\"{}\">{}"
          "</text></g>\n",
          x, y, cell_w, cell_h, fill, xml_escape(h.rows[r]), xml_escape(h.cols[c]),
          format_value(v, h.decimals), xml_escape(h.unit), x + cell_w / 2, y + cell_h / 2 + 4, ink,
          format_value(v, h.decimals));
    }
  }
  const double grid_bottom = f.top + cell_h * static_cast<double>(h.rows.size());
  if (!h.x_label.empty())
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                       f.left + cell_w * static_cast<double>(h.cols.size()) / 2, grid_bottom + 22,
                       xml_escape(h.x_label));
  if (!h.y_label.empty())
    out += fmt::format("<text x=\"8\" y=\"{:.1f}\" font-size=\"11\" fill=\"#555555\">{}</text>\n",
                       f.top - 6, xml_escape(h.y_label));
  // Colour scale: center + limit (blue) at the top, center - limit (red) at the bottom.
  const double sx = f.left + cell_w * static_cast<double>(h.cols.size()) + 24;
  const double sh = std::max(80.0, grid_bottom - f.top);
  for (int i = 0; i < 20; ++i) {
    const double t = 1.0 - (i + 0.5) / 10.0;  // +1 at the top, -1 at the bottom
    out += fmt::format(
        "<rect class=\"scale\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"14\" height=\"{:.2f}\" "
        "fill=\"{}\"/>\n",
        sx, f.top + sh * i / 20.0, sh / 20.0 + 0.5, diverging_colour(t));
  }
  const double labels[3] = {h.center + h.limit, h.center, h.center - h.limit};
  for (int i = 0; i < 3; ++i)
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\">{}{}</text>\n", sx + 18,
                       f.top + sh * i / 2.0 + 4, format_value(labels[i], h.decimals),
                       xml_escape(h.unit));
  return out + "</svg>\n";
}

std::string plane_svg(const PlaneChart& c) {
  if (!(c.hi > c.lo)) throw Error("plane_svg: need hi > lo");
  Frame f;
  f.width = 520;
  f.height = 500;
  f.left = 64;
  f.top = 56;
  f.bottom = 56;
  size_t longest = 0;
  for (const auto& s : c.series) longest = std::max(longest, s.label.size());
  f.right = c.series.size() > 1 ? 48 + 7.6 * static_cast<double>(std::min(longest, kLegendChars))
                                : 24.0;
  f.width += f.right - 24;
  const double side = std::min(f.plot_w(), f.plot_h());
  auto px = [&](double v) { return f.left + (std::clamp(v, c.lo, c.hi) - c.lo) / (c.hi - c.lo) * side; };
  auto py = [&](double v) {
    return f.top + side - (std::clamp(v, c.lo, c.hi) - c.lo) / (c.hi - c.lo) * side;
  };
  std::string out = svg_open(f, c.title);
  if (!c.caption.empty())
    out += fmt::format("<text x=\"{:.1f}\" y=\"42\" fill=\"#555555\" font-size=\"11\">{}</text>\n",
                       f.left, xml_escape(c.caption));
  for (int i = 0; i <= 4; ++i) {
    const double v = c.lo + (c.hi - c.lo) * i / 4.0;
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{2:.1f}\" x2=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#eeeeee\"/>"
        "<line x1=\"{3:.1f}\" y1=\"{4:.1f}\" x2=\"{3:.1f}\" y2=\"{5:.1f}\" stroke=\"#eeeeee\"/>\n"
        "<text x=\"{6:.1f}\" y=\"{7:.1f}\" text-anchor=\"end\">{8:.2g}</text>"
        "<text x=\"{3:.1f}\" y=\"{9:.1f}\" text-anchor=\"middle\">{8:.2g}</text>\n",
        f.left, f.left + side, py(v), px(v), f.top, f.top + side, f.left - 6, py(v) + 4, v,
        f.top + side + 16);
  }
  out += fmt::format(
      "<rect x=\"{0:.1f}\" y=\"{1:.1f}\" width=\"{2:.1f}\" height=\"{2:.1f}\" fill=\"none\" "
      "stroke=\"#333333\"/>\n"
      "<line class=\"diagonal\" x1=\"{0:.1f}\" y1=\"{3:.1f}\" x2=\"{4:.1f}\" y2=\"{1:.1f}\" "
      "stroke=\"#999999\" stroke-dasharray=\"4,3\"/>\n"
      "<text x=\"{5:.1f}\" y=\"{6:.1f}\" text-anchor=\"middle\">{7}</text>\n"
      "<text transform=\"translate({8:.1f},{9:.1f}) rotate(-90)\" text-anchor=\"middle\">{10}"
      "</text>\n",
      f.left, f.top, side, f.top + side, f.left + side, f.left + side / 2, f.top + side + 40,
      xml_escape(c.x_label), f.left - 44, f.top + side / 2, xml_escape(c.y_label));
  PhaseSeries legend;  // labels only, for svg_legend's layout
  for (size_t i = 0; i < c.series.size(); ++i) {
    const PlaneSeries& s = c.series[i];
    const char* colour = kPalette[i % kPaletteSize];
    out += fmt::format("<g class=\"series\" data-label=\"{}\">\n", xml_escape(s.label));
    if (s.connect && s.points.size() > 1) {
      std::string d;
      for (size_t k = 0; k < s.points.size(); ++k)
        d += fmt::format("{}{:.1f},{:.1f}", k ? "L" : "M", px(s.points[k].x), py(s.points[k].y));
      out += fmt::format("<path d=\"{}\" stroke=\"{}\" fill=\"none\" stroke-width=\"1.5\"/>\n", d,
                         colour);
    }
    for (size_t k = 0; k < s.points.size(); ++k) {
      const PlanePoint& p = s.points[k];
      const bool last = s.connect && k + 1 == s.points.size();
      out += fmt::format(
          "<circle class=\"point\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\" stroke=\"{}\" "
          "stroke-width=\"1.5\"><title>{}</title></circle>\n",
          px(p.x), py(p.y), last ? 5.0 : 3.5, p.hollow ? "#ffffff" : colour, colour,
          xml_escape(p.tip.empty() ? s.label : p.tip));
    }
    out += "</g>\n";
    legend.emplace_back(s.label, PhaseSummary{});
  }
  if (c.series.size() > 1) {
    Frame lf = f;
    lf.width = f.left + side + f.right;  // the legend sits right of the square
    lf.right = f.right;
    out += svg_legend(lf, legend);
  }
  return out + "</svg>\n";
}

}  // namespace phasekv

// -------------------------------------------------------------------------------------------------
// Line charts (`phasekv theory`: trajectories over flow time, coverage against heads).

namespace phasekv {
namespace {

// Tick step 1, 2 or 5 x 10^k giving about `target` intervals over span > 0.
double nice_step(double span, int target) {
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * mag * 1.0000001) return m * mag;
  return 10.0 * mag;
}

// [lo, hi] from the data when a bound is NaN; a degenerate range is widened around its value.
std::pair<double, double> axis_range(double lo, double hi, double data_lo, double data_hi) {
  if (std::isnan(lo)) lo = data_lo;
  if (std::isnan(hi)) hi = data_hi;
  if (!(hi > lo)) {
    const double pad = lo == 0.0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  return {lo, hi};
}

std::string tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-9) v = 0.0;
  const int decimals = step >= 1.0 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  return fmt::format("{:.{}f}", v, decimals);
}

// The plot area's border and the two axis titles (line and scatter charts).
std::string svg_plot_border(const Frame& f, const std::string& x_label, const std::string& y_label) {
  return fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#333333\"/>\n"
      "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n"
      "<text transform=\"translate({:.1f},{:.1f}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
      f.left, f.top, f.plot_w(), f.plot_h(), f.left + f.plot_w() / 2, f.top + f.plot_h() + 40,
      xml_escape(x_label), f.left - 44, f.top + f.plot_h() / 2, xml_escape(y_label));
}

}  // namespace

std::string line_svg(const LineChart& c) {
  if (c.series.empty()) throw Error("line_svg: no series to plot");
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  size_t longest = 0;
  for (const LineSeries& s : c.series) {
    if (s.x.size() != s.y.size())
      throw Error("line_svg: series '" + s.label + "' has " + std::to_string(s.x.size()) +
                  " x values and " + std::to_string(s.y.size()) + " y values");
    if ((!s.lo.empty() && s.lo.size() != s.y.size()) || s.lo.size() != s.hi.size())
      throw Error("line_svg: series '" + s.label + "' has error bars of the wrong length");
    for (size_t i = 0; i < s.x.size(); ++i) {
      xmin = std::min(xmin, s.x[i]);
      xmax = std::max(xmax, s.x[i]);
      ymin = std::min(ymin, s.lo.empty() ? s.y[i] : s.lo[i]);
      ymax = std::max(ymax, s.hi.empty() ? s.y[i] : s.hi[i]);
    }
    longest = std::max(longest, s.label.size());
  }
  if (!(xmax >= xmin)) xmin = xmax = ymin = ymax = 0.0;  // no points at all
  // Plain doubles, not structured bindings: clang 14 (the sanitizer build) cannot capture those
  // in the lambdas below.
  const std::pair<double, double> xr = axis_range(c.x_lo, c.x_hi, xmin, xmax);
  const std::pair<double, double> yr = axis_range(c.y_lo, c.y_hi, ymin, ymax);
  const double x0 = xr.first, x1 = xr.second, y0 = yr.first, y1 = yr.second;
  Frame f;
  f.right = 48 + 7.6 * static_cast<double>(std::min(longest, kLegendChars));
  f.width += f.right - 24;
  auto px = [&](double v) { return f.left + (std::clamp(v, x0, x1) - x0) / (x1 - x0) * f.plot_w(); };
  auto py = [&](double v) {
    return f.top + f.plot_h() - (std::clamp(v, y0, y1) - y0) / (y1 - y0) * f.plot_h();
  };
  std::string out = svg_open(f, c.title);
  if (!c.caption.empty())
    out += fmt::format("<text x=\"{:.1f}\" y=\"42\" fill=\"#555555\" font-size=\"11\">{}</text>\n",
                       f.left, xml_escape(c.caption));
  const double ys = nice_step(y1 - y0, 5);
  for (double v = std::ceil(y0 / ys - 1e-9) * ys; v <= y1 + ys * 1e-9; v += ys)
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{2:.1f}\" x2=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#dddddd\"/>\n"
        "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        f.left, f.left + f.plot_w(), py(v), f.left - 6, py(v) + 4, tick_label(v, ys));
  const double xs = c.x_integer_ticks ? std::max(1.0, nice_step(x1 - x0, 8)) : nice_step(x1 - x0, 8);
  const double base = f.top + f.plot_h();
  for (double v = std::ceil(x0 / xs - 1e-9) * xs; v <= x1 + xs * 1e-9; v += xs)
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#333333\"/>"
        "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4}</text>\n",
        px(v), base, base + 4, base + 16, tick_label(v, xs));
  for (double v : c.x_marks)
    if (v >= x0 && v <= x1)
      out += fmt::format("<line class=\"x-mark\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" "
                         "y2=\"{2:.1f}\" stroke=\"#999999\" stroke-dasharray=\"2,3\"/>\n",
                         px(v), f.top, base);
  out += svg_plot_border(f, c.x_label, c.y_label);
  std::string legend = "<g class=\"legend\">\n";
  for (size_t i = 0; i < c.series.size(); ++i) {
    const LineSeries& s = c.series[i];
    const char* colour = kPalette[(s.colour >= 0 ? static_cast<size_t>(s.colour) : i) % kPaletteSize];
    const char* dash = s.dashed ? " stroke-dasharray=\"6,4\"" : "";
    out += fmt::format("<g class=\"series\" data-label=\"{}\">\n", xml_escape(s.label));
    if (s.x.size() > 1) {
      std::string d;
      for (size_t k = 0; k < s.x.size(); ++k)
        d += fmt::format("{}{:.1f},{:.1f}", k ? "L" : "M", px(s.x[k]), py(s.y[k]));
      out += fmt::format("<path class=\"line\" d=\"{}\" stroke=\"{}\" fill=\"none\" "
                         "stroke-width=\"1.5\"{}/>\n",
                         d, colour, dash);
    }
    for (size_t k = 0; k < s.x.size(); ++k) {
      if (!s.lo.empty())
        out += fmt::format(
            "<path class=\"errbar\" d=\"M{0:.1f},{1:.1f}V{2:.1f}M{3:.1f},{1:.1f}H{4:.1f}M{3:.1f},"
            "{2:.1f}H{4:.1f}\" stroke=\"{5}\" fill=\"none\"/>\n",
            px(s.x[k]), py(s.lo[k]), py(s.hi[k]), px(s.x[k]) - 3, px(s.x[k]) + 3, colour);
      if (s.markers || s.x.size() == 1)
        out += fmt::format(
            "<circle class=\"point\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\">"
            "<title>{}: ({:.4g}, {:.4g})</title></circle>\n",
            px(s.x[k]), py(s.y[k]), colour, xml_escape(s.label), s.x[k], s.y[k]);
    }
    out += "</g>\n";
    const double lx = f.left + f.plot_w() + 16, ly = f.top + 8 + 20.0 * static_cast<double>(i);
    legend += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"{3}\" "
        "stroke-width=\"1.5\"{4}/><text x=\"{5:.1f}\" y=\"{6:.1f}\"><title>{7}</title>{8}</text>\n",
        lx, ly, lx + 18, colour, dash, lx + 24, ly + 4, xml_escape(s.label),
        xml_escape(legend_text(s.label)));
  }
  return out + legend + "</g>\n</svg>\n";
}

}  // namespace phasekv

// -------------------------------------------------------------------------------------------------
// Scatter charts (`phasekv mitigations report`: the Pareto chart of the candidates).

namespace phasekv {
namespace {

// A linear or log10 axis mapping data to pixels in [p0, p1].
struct Axis {
  double lo = 0.0, hi = 1.0;  // data bounds (log10 of them when log)
  bool log = false;
  double p0 = 0.0, p1 = 1.0;
  double operator()(double v) const {
    const double t = ((log ? std::log10(v) : v) - lo) / (hi - lo);
    return p0 + std::clamp(t, 0.0, 1.0) * (p1 - p0);
  }
  // Tick values: 1, 2, 5 x 10^k on a log axis, nice steps on a linear one.
  std::vector<double> ticks() const {
    std::vector<double> out;
    if (log) {
      for (int k = static_cast<int>(std::floor(lo)); k <= static_cast<int>(std::ceil(hi)); ++k)
        for (double m : {1.0, 2.0, 5.0}) {
          const double v = m * std::pow(10.0, k);
          if (std::log10(v) >= lo - 1e-9 && std::log10(v) <= hi + 1e-9) out.push_back(v);
        }
      return out;
    }
    const double step = nice_step(hi - lo, 5);
    for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
      out.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
    return out;
  }
  std::string label(double v) const {
    return log ? fmt::format("{:g}", v) : tick_label(v, nice_step(hi - lo, 5));
  }
};

// The nearest value 1, 2 or 5 x 10^k at or below v (at or above when up), v > 0.
double snap_125(double v, bool up) {
  const double mag = std::pow(10.0, std::floor(std::log10(v)));
  double best = up ? 10.0 * mag : mag;
  for (double m : {1.0, 2.0, 5.0}) {
    if (up && m * mag >= v * (1 - 1e-12)) best = std::min(best, m * mag);
    if (!up && m * mag <= v * (1 + 1e-12)) best = std::max(best, m * mag);
  }
  return best;
}

// Bounds of one axis: the caller's, or the data's widened by 8 % of the span on each side.
Axis make_axis(double lo, double hi, bool log, std::vector<double> values) {
  double dmin = INFINITY, dmax = -INFINITY;
  for (double v : values) {
    const double t = log ? std::log10(v) : v;
    dmin = std::min(dmin, t);
    dmax = std::max(dmax, t);
  }
  if (!(dmax >= dmin)) dmin = dmax = 0.0;
  const double pad = dmax > dmin ? 0.08 * (dmax - dmin) : 0.3;
  Axis a;
  a.log = log;
  std::tie(a.lo, a.hi) = axis_range(std::isnan(lo) ? dmin - pad : (log ? std::log10(lo) : lo),
                                    std::isnan(hi) ? dmax + pad : (log ? std::log10(hi) : hi),
                                    dmin, dmax);
  // A log axis from data ends on tick values, so that its first and last points can be read.
  if (log && std::isnan(lo)) a.lo = std::min(a.lo, std::log10(snap_125(std::pow(10.0, a.lo), false)));
  if (log && std::isnan(hi)) a.hi = std::max(a.hi, std::log10(snap_125(std::pow(10.0, a.hi), true)));
  return a;
}

// Label boxes placed so far; a new label moves up or down in steps of a line until it overlaps
// none (markers sharing an x, such as every 1-KV-head W8/S8 variant, would print on each other).
struct LabelPlacer {
  struct Box {
    double x0, y0, x1, y1;
  };
  double top, bottom;  // baselines stay inside the plot
  std::vector<Box> boxes;
  double place(double x, double y, size_t chars) {
    const double w = 6.0 * static_cast<double>(chars), h = 11.0;
    for (int k = 0; k < 16; ++k) {
      const double dy = (k % 2 ? -1.0 : 1.0) * h * ((k + 1) / 2);
      if (y + dy - h + 2 < top || y + dy > bottom) continue;
      const Box b{x, y + dy - h + 2, x + w, y + dy + 2};
      bool free = true;
      for (const Box& o : boxes)
        free = free && (b.x1 <= o.x0 || b.x0 >= o.x1 || b.y1 <= o.y0 || b.y0 >= o.y1);
      if (free) {
        boxes.push_back(b);
        return y + dy;
      }
    }
    return y;
  }
};

}  // namespace

std::string scatter_svg(const ScatterChart& c) {
  std::vector<double> xs, ys;
  for (const ScatterPoint& p : c.points) {
    if (c.log_x && !(p.x > 0))
      throw Error(fmt::format("scatter_svg: point '{}' has x = {} on a log axis", p.label, p.x));
    if (p.group < 0 || static_cast<size_t>(p.group) >= c.groups.size())
      throw Error(fmt::format("scatter_svg: point '{}' has group {} of {}", p.label, p.group,
                              c.groups.size()));
    xs.push_back(p.x);
    ys.push_back(p.y);
  }
  size_t longest = 0;
  for (const auto& g : c.groups) longest = std::max(longest, g.size());
  for (const auto& n : c.notes) longest = std::max(longest, n.size());
  Frame f;
  f.height = 480;
  f.right = 48 + 7.6 * static_cast<double>(std::min(longest, kLegendChars));
  f.width += f.right - 24;
  Axis ax = make_axis(c.x_lo, c.x_hi, c.log_x, xs), ay = make_axis(c.y_lo, c.y_hi, false, ys);
  ax.p0 = f.left;
  ax.p1 = f.left + f.plot_w();
  ay.p0 = f.top + f.plot_h();
  ay.p1 = f.top;
  std::string out = svg_open(f, c.title);
  if (!c.caption.empty())
    out += fmt::format("<text x=\"{:.1f}\" y=\"42\" fill=\"#555555\" font-size=\"11\">{}</text>\n",
                       f.left, xml_escape(c.caption));
  for (const ScatterRegion& r : c.regions) {
    const double x0 = std::isnan(r.x_lo) ? ax.p0 : ax(r.x_lo), x1 = std::isnan(r.x_hi) ? ax.p1 : ax(r.x_hi);
    const double y0 = std::isnan(r.y_hi) ? ay.p1 : ay(r.y_hi), y1 = std::isnan(r.y_lo) ? ay.p0 : ay(r.y_lo);
    if (!(x1 >= x0) || !(y1 >= y0)) throw Error("scatter_svg: region '" + r.label + "' is empty");
    out += fmt::format(
        "<rect class=\"region\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
        "fill=\"#d9f0d3\" stroke=\"#5aae61\" stroke-dasharray=\"4,3\"/>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#1b7837\" font-size=\"11\">{}</text>\n",
        x0, y0, x1 - x0, y1 - y0, x0 + 4, y1 - 6, xml_escape(r.label));
  }
  for (double v : ay.ticks())
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{2:.1f}\" x2=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#dddddd\"/>\n"
        "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        ax.p0, ax.p1, ay(v), f.left - 6, ay(v) + 4, ay.label(v));
  const double base = ay.p0;
  for (double v : ax.ticks())
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#dddddd\"/>"
        "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4}</text>\n",
        ax(v), f.top, base + 4, base + 16, ax.label(v));
  out += svg_plot_border(f, c.x_label, c.y_label);
  // Largest markers first, so that a small one on top of a big one stays visible.
  std::vector<size_t> order(c.points.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return c.points[a].area > c.points[b].area; });
  auto radius = [&](const ScatterPoint& p) {
    return std::clamp(c.unit_radius * std::sqrt(std::max(p.area, 0.0)), 2.5, 40.0);
  };
  // Labels are placed in the caller's order (the first point keeps its place beside its marker);
  // one moved off its marker's line gets a leader line back to the marker.
  LabelPlacer labels{ay.p1 + 2, ay.p0 + 5, {}};
  std::vector<double> label_y(c.points.size());
  for (size_t i = 0; i < c.points.size(); ++i) {
    const ScatterPoint& p = c.points[i];
    label_y[i] = labels.place(ax(p.x) + radius(p) + 3, ay(p.y) + 3.5, p.label.size());
  }
  for (size_t i : order) {
    const ScatterPoint& p = c.points[i];
    const char* colour = kPalette[static_cast<size_t>(p.group) % kPaletteSize];
    const double r = radius(p), x = ax(p.x), y = ay(p.y);
    out += fmt::format(
        "<circle class=\"marker\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{:.1f}\" fill=\"{}\" "
        "fill-opacity=\"{}\" stroke=\"{}\" stroke-width=\"{}\"><title>{}</title></circle>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\">{}</text>\n",
        x, y, r, p.ring ? "#ffffff" : colour, p.ring ? "0" : "0.45", colour, p.ring ? 3 : 1.5,
        xml_escape(p.tip.empty() ? p.label : p.tip), x + r + 3, label_y[i], xml_escape(p.label));
    if (std::abs(label_y[i] - (y + 3.5)) > 0.5)
      out += fmt::format(
          "<line class=\"leader\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
          "stroke=\"#888888\" stroke-width=\"0.7\"/>\n",
          x + r * 0.7, y + (label_y[i] > y ? r * 0.7 : -r * 0.7), x + r + 2, label_y[i] - 3.5);
  }
  std::string legend = "<g class=\"legend\">\n";
  const double lx = f.left + f.plot_w() + 16;
  double ly = f.top + 8;
  for (size_t g = 0; g < c.groups.size(); ++g, ly += 20)
    legend += fmt::format(
        "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"5\" fill=\"{}\" fill-opacity=\"0.45\" "
        "stroke=\"{}\"/><text x=\"{:.1f}\" y=\"{:.1f}\"><title>{}</title>{}</text>\n",
        lx + 6, ly, kPalette[g % kPaletteSize], kPalette[g % kPaletteSize], lx + 18, ly + 4,
        xml_escape(c.groups[g]), xml_escape(legend_text(c.groups[g])));
  for (const auto& n : c.notes) {
    ly += 4;
    legend += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" fill=\"#555555\">"
                          "<title>{}</title>{}</text>\n",
                          lx, ly + 4, xml_escape(n), xml_escape(legend_text(n)));
    ly += 16;
  }
  return out + legend + "</g>\n</svg>\n";
}

}  // namespace phasekv
