#include "monitor/assets.hpp"

#include <cstddef>

// The files are assembled into .rodata (.incbin); CMake passes their paths and makes this object
// depend on them, so editing the page or a script rebuilds it.
#ifndef TROUPE_DASHBOARD_HTML
#error "TROUPE_DASHBOARD_HTML (the page's path) must be defined by the build"
#endif
#if !defined(TROUPE_DASHBOARD_CHARTS_JS) || !defined(TROUPE_DASHBOARD_CARDS_JS) || !defined(TROUPE_DASHBOARD_JS)
#error "TROUPE_DASHBOARD_CHARTS_JS, _CARDS_JS and _JS (the page's scripts' paths) must be defined by the build"
#endif
#ifndef TROUPE_CHART_JS
#error "TROUPE_CHART_JS (the path of Debian's chart.min.js) must be defined by the build"
#endif

#define TROUPE_ASSET(sym, path)                      \
  ".section .rodata\n"                               \
  ".balign 16\n"                                     \
  ".hidden " #sym "_begin\n"                         \
  ".hidden " #sym "_end\n"                           \
  #sym "_begin:\n"                                   \
  ".incbin \"" path "\"\n"                           \
  #sym "_end:\n"                                     \
  ".byte 0\n"                                        \
  ".previous\n"

asm(TROUPE_ASSET(troupe_asset_dashboard_html, TROUPE_DASHBOARD_HTML));
asm(TROUPE_ASSET(troupe_asset_dashboard_charts_js, TROUPE_DASHBOARD_CHARTS_JS));
asm(TROUPE_ASSET(troupe_asset_dashboard_cards_js, TROUPE_DASHBOARD_CARDS_JS));
asm(TROUPE_ASSET(troupe_asset_dashboard_js, TROUPE_DASHBOARD_JS));
asm(TROUPE_ASSET(troupe_asset_chart_js, TROUPE_CHART_JS));

#define TROUPE_ASSET_SYMBOLS(sym)                                        \
  extern const char sym##_begin[] __attribute__((visibility("hidden"))); \
  extern const char sym##_end[] __attribute__((visibility("hidden")));

extern "C" {
TROUPE_ASSET_SYMBOLS(troupe_asset_dashboard_html)
TROUPE_ASSET_SYMBOLS(troupe_asset_dashboard_charts_js)
TROUPE_ASSET_SYMBOLS(troupe_asset_dashboard_cards_js)
TROUPE_ASSET_SYMBOLS(troupe_asset_dashboard_js)
TROUPE_ASSET_SYMBOLS(troupe_asset_chart_js)
}

namespace troupe::detail {

namespace {

std::string_view between(const char* begin, const char* end) noexcept {
  return {begin, static_cast<std::size_t>(end - begin)};
}

}  // namespace

#define TROUPE_ASSET_BYTES(sym) between(sym##_begin, sym##_end)

std::string_view dashboard_html() noexcept { return TROUPE_ASSET_BYTES(troupe_asset_dashboard_html); }

const std::array<DashboardScript, 4>& dashboard_scripts() noexcept {
  static const std::array<DashboardScript, 4> scripts = {{
      {"/chart.js", TROUPE_ASSET_BYTES(troupe_asset_chart_js)},
      {"/dashboard_charts.js", TROUPE_ASSET_BYTES(troupe_asset_dashboard_charts_js)},
      {"/dashboard_cards.js", TROUPE_ASSET_BYTES(troupe_asset_dashboard_cards_js)},
      {"/dashboard.js", TROUPE_ASSET_BYTES(troupe_asset_dashboard_js)},
  }};
  return scripts;
}

const DashboardScript* dashboard_script(std::string_view path) noexcept {
  for (const DashboardScript& s : dashboard_scripts()) {
    if (s.path == path) return &s;
  }
  return nullptr;
}

}  // namespace troupe::detail
