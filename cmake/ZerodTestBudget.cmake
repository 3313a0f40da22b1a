# The suite's time budget. `make test` is run by newcomers and by CI on 2-core machines, so no
# test may take over ZEROD_TEST_BUDGET seconds (60). ctest stops a test that does, so a test
# that grows past the budget fails on every machine, where it grew, instead of by chance on a
# slow one. Sanitizer builds run the same tests 2-5 times slower and get 5 times the budget.
# Tests labelled `long` (soaks that skip unless ZEROD_LONG_TESTS=1) keep their own limit.
#
# zs_test_budget(): caps the TIMEOUT of every test of the current directory; each directory
# that adds tests calls it last (set_tests_properties reaches only the current directory's
# tests). zs_test_budget_check(DIR): fails the configure if a directory under DIR holds tests
# and never called zs_test_budget().

set(ZEROD_TEST_BUDGET 60 CACHE STRING "seconds any one test of `make test` may take")

function(zs_test_budget)
    if(ZEROD_SANITIZE)
        math(EXPR _limit "${ZEROD_TEST_BUDGET} * 5")
    else()
        set(_limit ${ZEROD_TEST_BUDGET})
    endif()
    get_property(_tests DIRECTORY PROPERTY TESTS)
    foreach(_t IN LISTS _tests)
        get_test_property(${_t} LABELS _labels)
        if(_labels AND "long" IN_LIST _labels)
            continue()
        endif()
        get_test_property(${_t} TIMEOUT _timeout)
        if(NOT _timeout OR _timeout GREATER _limit)
            set_tests_properties(${_t} PROPERTIES TIMEOUT ${_limit})
        endif()
    endforeach()
    set_property(DIRECTORY PROPERTY ZS_TEST_BUDGET_DONE ON)
endfunction()

function(zs_test_budget_check dir)
    get_property(_tests DIRECTORY ${dir} PROPERTY TESTS)
    get_property(_done DIRECTORY ${dir} PROPERTY ZS_TEST_BUDGET_DONE)
    if(_tests AND NOT _done)
        message(FATAL_ERROR "${dir} adds tests but does not call zs_test_budget() after them "
                            "(cmake/ZerodTestBudget.cmake)")
    endif()
    get_property(_subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    foreach(_d IN LISTS _subdirs)
        zs_test_budget_check(${_d})
    endforeach()
endfunction()
