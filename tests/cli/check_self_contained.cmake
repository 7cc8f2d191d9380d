# ctest -P script: no file of the repository points outside it. Docs, scripts
# and sources name no path of one machine and no path under someone's home:
#   - home-relative paths: a tilde followed by a slash, or the HOME variable
#     in either shell form (every file type checked below);
#   - absolute paths of a machine: a path beginning with the home, root,
#     Users, work, mnt or tmp folder of the file system's root (docs and
#     scripts: .md .sh .py .cmake .txt .toml .json .yml .yaml);
#   - the sibling folder "shared" next to the repository (every file type).
# What a command needs outside the sources goes under the repository's ignored
# build/ folder (build/peers/, build/shims/, ...); scratch files come from
# mktemp, which names no path and so needs no exception. The few allowed uses
# are listed below, each with its reason.
#   cmake -DSOURCE_DIR=repo -P check_self_contained.cmake
# Every pattern and allowed text is assembled with string(CONCAT), so that
# this file does not match itself.

string(CONCAT home_tilde "~" "/")
string(CONCAT home_var "$" "HOME")
string(CONCAT home_var_braced "$" "{HOME}")
string(CONCAT sibling ".." "/shared")
# An absolute path: one of these root folders, not preceded by a character
# that would make it part of a relative path, a URL's path or a variable's
# path (build/tmp/, $TMPDIR/tmp/ and ${root}/tmp/ are fine).
string(CONCAT machine_regex "(^|[^A-Za-z0-9_./~$}-])" "/" "(home|root|Users|work|mnt|tmp)" "/")

# Allowed uses: file (relative to SOURCE_DIR), then the exact text that may
# appear in it.
set(allowed_files "")
set(allowed_texts "")
function(allow file text)  # a function: a macro would expand the text again
  set(allowed_files ${allowed_files} "${file}" PARENT_SCOPE)
  set(allowed_texts ${allowed_texts} "${text}" PARENT_SCOPE)
endfunction()
# The documented default cache of downloaded test models, a user-facing default
# like pip's cache (overridden by PAGEDATTN_MODEL_CACHE), not a path of one
# machine.
string(CONCAT model_cache_tilde "~" "/.cache/pagedattn/models")
string(CONCAT model_cache_var "$" "{HOME}/.cache/pagedattn/models")
allow(scripts/get_test_model.sh "${model_cache_tilde}")
allow(scripts/get_test_model.sh "${model_cache_var}")
allow(docs/models.md "${model_cache_tilde}")
allow(bench/bench_gguf.cc "${model_cache_tilde}")
# A tokenizer test input: the shell variable's name, quoted, as text to
# tokenize.
string(CONCAT quoted_home_var "\"" "$" "HOME" "\"")
allow(python/tests/test_tokenizer.py "${quoted_home_var}")

# Top-level files, then the source folders (never build/, which holds venvs,
# peers and build trees).
file(GLOB files LIST_DIRECTORIES false ${SOURCE_DIR}/*)
foreach(dir bench cmake docs examples include perf python scripts src tests tools)
  file(GLOB_RECURSE more LIST_DIRECTORIES false ${SOURCE_DIR}/${dir}/*)
  list(APPEND files ${more})
endforeach()
list(FILTER files INCLUDE REGEX "\\.(md|h|cc|c|py|pyi|sh|txt|cmake|in|toml|json|yml|yaml)$")
set(doc_or_script_regex "\\.(md|sh|py|cmake|txt|toml|json|yml|yaml)$")

# Appends "file:line: what: the line" to offenders for the text at `at`.
function(report rel text at what)
  string(SUBSTRING "${text}" 0 ${at} before)
  string(REGEX MATCHALL "\n" newlines "${before}")
  list(LENGTH newlines line)
  math(EXPR line "${line} + 1")
  string(FIND "${before}" "\n" start REVERSE)
  math(EXPR start "${start} + 1")
  string(SUBSTRING "${text}" ${start} -1 rest)
  string(FIND "${rest}" "\n" end)
  string(SUBSTRING "${rest}" 0 ${end} content)
  string(STRIP "${content}" content)
  string(REPLACE ";" "," content "${content}")
  set(offenders ${offenders} "${rel}:${line}: ${what}: ${content}" PARENT_SCOPE)
endfunction()

set(offenders "")
list(LENGTH allowed_files n_allowed)
foreach(file IN LISTS files)
  file(RELATIVE_PATH rel ${SOURCE_DIR} ${file})
  file(READ ${file} text)
  # Blank out the allowed texts of this file (same length, so that line
  # numbers stay right).
  if(n_allowed GREATER 0)
    math(EXPR last "${n_allowed} - 1")
    foreach(i RANGE ${last})
      list(GET allowed_files ${i} allowed_file)
      if(rel STREQUAL allowed_file)
        list(GET allowed_texts ${i} allowed_text)
        string(REGEX REPLACE "." "_" blank "${allowed_text}")
        string(REPLACE "${allowed_text}" "${blank}" text "${text}")
      endif()
    endforeach()
  endif()
  foreach(needle IN ITEMS "${home_tilde}" "${home_var}" "${home_var_braced}" "${sibling}")
    string(FIND "${text}" "${needle}" at)
    if(NOT at EQUAL -1)
      report(${rel} "${text}" ${at} "${needle}")
    endif()
  endforeach()
  if(rel MATCHES "${doc_or_script_regex}")
    string(REGEX MATCH "${machine_regex}" found "${text}")
    if(found)
      string(FIND "${text}" "${found}" at)
      string(REGEX REPLACE "^[^/]" "" path "${found}")
      string(FIND "${found}" "/" slash)
      math(EXPR at "${at} + ${slash}")
      report(${rel} "${text}" ${at} "absolute path ${path}")
    endif()
  endif()
endforeach()
if(offenders)
  list(JOIN offenders "\n  " listing)
  message(FATAL_ERROR "files pointing outside the repository (home-relative "
    "paths, absolute paths of a machine, sibling folders):\n  ${listing}\n"
    "Put such things under the ignored build/ folder, or list a justified "
    "exception in ${CMAKE_CURRENT_LIST_FILE}.")
endif()
list(LENGTH files n)
message(STATUS "${n} files checked: the repository is self-contained")
