# zerorun (client/zerorun), the local launcher: one CTest per behaviour of test_zerorun.sh,
# with real zerod daemons, train_mlp and sh trainers. Included from
# tests/integration/CMakeLists.txt: include(${CMAKE_CURRENT_SOURCE_DIR}/zerorun.cmake)
foreach(_case usage train failure term_grace env sigint daemon_killed)
    add_test(NAME integration/zerorun/${_case}
             COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_zerorun.sh ${_case} $<TARGET_FILE:zerorun>
                     $<TARGET_FILE:zerod> $<TARGET_FILE:train_mlp>)
    set_tests_properties(integration/zerorun/${_case} PROPERTIES TIMEOUT 60)
endforeach()
