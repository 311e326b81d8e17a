#include "monitor/assets.hpp"

// The files are assembled into .rodata (.incbin); CMake passes their paths and makes this object
// depend on them, so editing the page rebuilds it.
#ifndef TROUPE_DASHBOARD_HTML
#error "TROUPE_DASHBOARD_HTML (the page's path) must be defined by the build"
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
asm(TROUPE_ASSET(troupe_asset_chart_js, TROUPE_CHART_JS));

extern "C" {
extern const char troupe_asset_dashboard_html_begin[] __attribute__((visibility("hidden")));
extern const char troupe_asset_dashboard_html_end[] __attribute__((visibility("hidden")));
extern const char troupe_asset_chart_js_begin[] __attribute__((visibility("hidden")));
extern const char troupe_asset_chart_js_end[] __attribute__((visibility("hidden")));
}

namespace troupe::detail {

std::string_view dashboard_html() noexcept {
  return {troupe_asset_dashboard_html_begin,
          static_cast<std::size_t>(troupe_asset_dashboard_html_end - troupe_asset_dashboard_html_begin)};
}

std::string_view chart_js() noexcept {
  return {troupe_asset_chart_js_begin, static_cast<std::size_t>(troupe_asset_chart_js_end - troupe_asset_chart_js_begin)};
}

}  // namespace troupe::detail
