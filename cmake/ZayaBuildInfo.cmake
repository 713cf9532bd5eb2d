# Writes OUT (a header) with the source's git commit, run at every build (a custom target), so
# `zaya --version` names the commit it was built from. configure_file rewrites OUT only when the
# text changes, so an unchanged commit recompiles nothing. Without git, or outside a checkout,
# the commit is "unknown".
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12 --match=NO-TAGS
                OUTPUT_VARIABLE ZAYA_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE git_result ERROR_QUIET)
if(NOT git_result EQUAL 0 OR ZAYA_GIT_COMMIT STREQUAL "")
  set(ZAYA_GIT_COMMIT "unknown")
endif()
file(WRITE "${OUT}.in" "#pragma once\n#define ZAYA_GIT_COMMIT \"@ZAYA_GIT_COMMIT@\"\n")
configure_file("${OUT}.in" "${OUT}" @ONLY)
