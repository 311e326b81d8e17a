# Finds the C++ Actor Framework 0.17 as Debian packages it (headers and libcaf_*.so, no CMake
# config, no pkg-config file). Defines CAF::core, CAF::io, ... for the requested components.
find_path(CAF_INCLUDE_DIR caf/config.hpp)
if(CAF_INCLUDE_DIR)
  # CAF_VERSION is encoded as MMmmpp, e.g. 1706 for 0.17.6.
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _caf_v REGEX "^#define CAF_VERSION [0-9]+")
  string(REGEX REPLACE ".*CAF_VERSION ([0-9]+).*" "\\1" _caf_v "${_caf_v}")
  math(EXPR _caf_major "${_caf_v} / 10000")
  math(EXPR _caf_minor "(${_caf_v} / 100) % 100")
  math(EXPR _caf_patch "${_caf_v} % 100")
  set(CAF_VERSION "${_caf_major}.${_caf_minor}.${_caf_patch}")
endif()
if(NOT CAF_FIND_COMPONENTS)
  set(CAF_FIND_COMPONENTS core)
endif()
foreach(_caf_c IN LISTS CAF_FIND_COMPONENTS)
  find_library(CAF_${_caf_c}_LIBRARY NAMES caf_${_caf_c})
  if(CAF_${_caf_c}_LIBRARY)
    set(CAF_${_caf_c}_FOUND TRUE)
    if(NOT TARGET CAF::${_caf_c})
      add_library(CAF::${_caf_c} UNKNOWN IMPORTED)
      set_target_properties(CAF::${_caf_c} PROPERTIES
        IMPORTED_LOCATION "${CAF_${_caf_c}_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}")
      if(NOT _caf_c STREQUAL "core")
        set_property(TARGET CAF::${_caf_c} APPEND PROPERTY INTERFACE_LINK_LIBRARIES CAF::core)
      endif()
    endif()
  endif()
endforeach()
if(TARGET CAF::core)
  find_package(Threads REQUIRED)
  set_property(TARGET CAF::core APPEND PROPERTY INTERFACE_LINK_LIBRARIES Threads::Threads)
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_INCLUDE_DIR
  VERSION_VAR CAF_VERSION
  HANDLE_COMPONENTS)
