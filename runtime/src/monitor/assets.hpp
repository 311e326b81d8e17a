#pragma once
// The dashboard's page, its scripts and Chart.js (Debian's libjs-chart.js), built into the
// library: the dashboard needs no file at run time and no network.

#include <array>
#include <string_view>

namespace troupe::detail {

/// dashboard.html: the page (served with the token: it is the dashboard itself).
std::string_view dashboard_html() noexcept;

/// A script the page loads, by the path its <script src> names.
struct DashboardScript {
  std::string_view path;  ///< "/chart.js", "/dashboard_charts.js", ...
  std::string_view body;
};
/// The page's scripts in the order it loads them: chart.min.js, dashboard_charts.js,
/// dashboard_cards.js, dashboard.js. They hold no data (the page fetches it with its token), so a
/// GET of them needs no token: a <script src> carries none of the page's query.
const std::array<DashboardScript, 4>& dashboard_scripts() noexcept;
/// The script served at `path`, or nullptr.
const DashboardScript* dashboard_script(std::string_view path) noexcept;

}  // namespace troupe::detail
