# ctest -P script: the README's command lines work from a fresh clone on
# Debian 12. Its Python refuses a system-wide pip install (PEP 668), so every
# `pip install` in a command line must run a virtual environment's pip.
#   cmake -DSOURCE_DIR=repo -P check_readme_commands.cmake
file(STRINGS ${SOURCE_DIR}/README.md lines)
set(offenders "")
foreach(line IN LISTS lines)
  # Command lines are the indented code blocks (4 spaces).
  if(line MATCHES "^    " AND line MATCHES "pip install" AND NOT line MATCHES "/bin/pip install")
    list(APPEND offenders "${line}")
  endif()
endforeach()
if(offenders)
  list(JOIN offenders "\n  " listing)
  message(FATAL_ERROR "README.md runs pip outside a virtual environment (PEP 668 refuses it):\n  ${listing}")
endif()
message(STATUS "README.md: every pip install runs in a virtual environment")
