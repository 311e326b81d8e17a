#pragma once
// The dashboard's page and Chart.js (Debian's libjs-chart.js), built into the library: the
// dashboard needs no file at run time and no network.

#include <string_view>

namespace troupe::detail {

/// dashboard.html
std::string_view dashboard_html() noexcept;
/// chart.min.js
std::string_view chart_js() noexcept;

}  // namespace troupe::detail
