# Writes OUT = a header defining TESSERA_GIT_COMMIT as the short commit of SRC ("unknown" outside a git checkout).
# Run at every build (not only at configure time), so `tessera --version` names the commit it was built from;
# the header is rewritten only when the commit changes, so an unchanged tree rebuilds nothing.
execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY "${SRC}"
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit unknown)
endif()
set(text "#pragma once\n#define TESSERA_GIT_COMMIT \"${commit}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
