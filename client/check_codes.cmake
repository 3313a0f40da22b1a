# Checks, at build time (client/CMakeLists.txt) and as a test (tests/unit/client), that the
# copies of common's code tables outside C agree with them:
#   - every status code zerod/zc.h defines (ZC_OK, ZC_ERR_*, ZC_IN_PROGRESS) and every
#     ZC_DTYPE_* it enumerates is a row of ZS_STATUS_MAP / ZS_DTYPE_MAP with the same value
#     (client/src/codes.c checks the other way round, that zc.h has every row);
#   - the Python package's committed _codes.py is what zs_gen_codes writes from the tables.
#
# cmake -DLIST=<zs_gen_codes list output> -DZC_H=<zc.h> -DPY_GENERATED=<zs_gen_codes python
#       output> -DPY_COMMITTED=<client/python/zerod/_codes.py> -P check_codes.cmake
foreach(_var LIST ZC_H PY_GENERATED PY_COMMITTED)
    if(NOT DEFINED ${_var})
        message(FATAL_ERROR "check_codes.cmake: -D${_var}=... is missing")
    endif()
endforeach()

set(_errors "")

# The tables: "status NAME VALUE" / "dtype NAME VALUE" lines.
file(STRINGS ${LIST} _rows)
foreach(_row IN LISTS _rows)
    if(_row MATCHES "^(status|dtype) ([A-Z0-9_]+) (-?[0-9]+)$")
        set(_table_${CMAKE_MATCH_1}_${CMAKE_MATCH_2} ${CMAKE_MATCH_3})
    else()
        message(FATAL_ERROR "check_codes.cmake: ${LIST}: unexpected line '${_row}'")
    endif()
endforeach()

# zc.h's status codes: #define ZC_OK 0, #define ZC_ERR_X (-n).
file(STRINGS ${ZC_H} _defines REGEX "^[ \t]*#[ \t]*define[ \t]+ZC_(OK|IN_PROGRESS|ERR_[A-Z0-9_]+)[ \t(]")
set(_n_status 0)
foreach(_line IN LISTS _defines)
    if(NOT _line MATCHES "define[ \t]+ZC_([A-Z0-9_]+)[ \t]+\\(?[ \t]*(-?[0-9]+)[ \t]*\\)?[ \t]*(/\\*.*)?$")
        list(APPEND _errors "cannot read the value of '${_line}'")
        continue()
    endif()
    set(_name ${CMAKE_MATCH_1})
    set(_value ${CMAKE_MATCH_2})
    math(EXPR _n_status "${_n_status} + 1")
    if(NOT DEFINED _table_status_${_name})
        list(APPEND _errors "ZC_${_name} (${_value}) is not a row of ZS_STATUS_MAP")
    elseif(NOT _table_status_${_name} EQUAL _value)
        list(APPEND _errors
             "ZC_${_name} is ${_value}, ZS_STATUS_MAP says ${_table_status_${_name}}")
    endif()
endforeach()
if(_n_status EQUAL 0)
    list(APPEND _errors "found no ZC_ status code (has its form changed?)")
endif()

# zc.h's dtypes: ZC_DTYPE_X = n, inside enum zc_dtype.
file(STRINGS ${ZC_H} _dtypes REGEX "ZC_DTYPE_[A-Z0-9_]+[ \t]*=")
set(_n_dtype 0)
foreach(_line IN LISTS _dtypes)
    if(NOT _line MATCHES "ZC_DTYPE_([A-Z0-9_]+)[ \t]*=[ \t]*([0-9]+)[ \t]*,?[ \t]*(/\\*.*)?$")
        list(APPEND _errors "cannot read the value of '${_line}'")
        continue()
    endif()
    set(_name ${CMAKE_MATCH_1})
    set(_value ${CMAKE_MATCH_2})
    math(EXPR _n_dtype "${_n_dtype} + 1")
    if(NOT DEFINED _table_dtype_${_name})
        list(APPEND _errors "ZC_DTYPE_${_name} (${_value}) is not a row of ZS_DTYPE_MAP")
    elseif(NOT _table_dtype_${_name} EQUAL _value)
        list(APPEND _errors
             "ZC_DTYPE_${_name} is ${_value}, ZS_DTYPE_MAP says ${_table_dtype_${_name}}")
    endif()
endforeach()
if(_n_dtype EQUAL 0)
    list(APPEND _errors "found no ZC_DTYPE_ value (has its form changed?)")
endif()

if(_errors)
    list(JOIN _errors "\n  " _text)
    message(FATAL_ERROR "${ZC_H} disagrees with common's code tables "
                        "(common/include/zs/status.h, dtype.h):\n  ${_text}")
endif()

file(READ ${PY_GENERATED} _py_generated)
file(READ ${PY_COMMITTED} _py_committed)
if(NOT _py_generated STREQUAL _py_committed)
    message(FATAL_ERROR "${PY_COMMITTED} is not what zs_gen_codes makes of common's code tables "
                        "(common/include/zs/status.h, dtype.h). After a change to a table, "
                        "rewrite it: cmake --build <build dir> --target zerod_python_codes")
endif()
