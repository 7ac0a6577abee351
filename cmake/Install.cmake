# `cmake --install <build> --prefix P` makes Octet a package an out-of-tree training program uses with
#   find_package(octet REQUIRED)                      # CMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE octet::octet)
# It installs the static libraries to P/lib, the headers to P/include/octet/<folder>/ (code includes
# "core/tensor.h"), and the exported targets (octet::octet, octet::octet_core, ...) with
# octetConfig.cmake and octetConfigVersion.cmake to P/lib/cmake/octet. tests/install/ checks it.
include(CMakePackageConfigHelpers)

set(OCTET_INSTALL_CMAKEDIR lib/cmake/octet)
if(PROJECT_VERSION)
  set(OCTET_PACKAGE_VERSION ${PROJECT_VERSION})
else()
  set(OCTET_PACKAGE_VERSION 0.1.0)  # until project() states a version
endif()

set(OCTET_INSTALLED_LIBRARIES octet_core octet_kernels octet_autograd octet_nn octet_optim octet_distributed
    octet_models octet_data octet_training)
set(OCTET_HEADER_FOLDERS core kernels autograd nn optim distributed models data)

# Static libraries carry their PRIVATE link dependencies into the export as link-only entries, so
# the INTERFACE helpers they link (warning flags, cuDNN and NCCL locations) are exported with them.
# octet_warnings only adds compile flags, which link-only use never passes on.
set(OCTET_INSTALLED_HELPERS octet_warnings)
foreach(helper octet_cudnn octet_nccl)
  if(TARGET ${helper})
    list(APPEND OCTET_INSTALLED_HELPERS ${helper})
  endif()
endforeach()

if(OCTET_SANITIZE)
  # Sanitized static libraries need the sanitizer runtimes in whatever program links them.
  target_link_options(octet_core INTERFACE $<INSTALL_INTERFACE:-fsanitize=address,undefined>)
endif()

install(TARGETS ${OCTET_INSTALLED_LIBRARIES} octet ${OCTET_INSTALLED_HELPERS}
  EXPORT octetTargets
  ARCHIVE DESTINATION lib
  LIBRARY DESTINATION lib)

foreach(folder ${OCTET_HEADER_FOLDERS})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${folder}/ DESTINATION include/octet/${folder}
    FILES_MATCHING PATTERN "*.h")
endforeach()

install(FILES ${PROJECT_SOURCE_DIR}/apps/checkpoint.h DESTINATION include/octet/apps)

install(EXPORT octetTargets NAMESPACE octet:: DESTINATION ${OCTET_INSTALL_CMAKEDIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/octetConfig.cmake.in
  ${PROJECT_BINARY_DIR}/octetConfig.cmake
  INSTALL_DESTINATION ${OCTET_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so only the same major.minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/octetConfigVersion.cmake
  VERSION ${OCTET_PACKAGE_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/octetConfig.cmake ${PROJECT_BINARY_DIR}/octetConfigVersion.cmake
  DESTINATION ${OCTET_INSTALL_CMAKEDIR})
