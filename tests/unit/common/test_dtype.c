#include "zs/dtype.h"

#include <criterion/criterion.h>

Test(zs_dtype, wire_values_sizes_and_names_never_change)
{
    /* values go on the wire and into zerod/zc.h's zc_dtype_t: never renumbered */
    cr_assert_eq(ZS_DTYPE_F32, 0);
    cr_assert_eq(ZS_DTYPE_F16, 1);
    cr_assert_eq(ZS_DTYPE_BF16, 2);
    cr_assert_eq(zs_dtype_size(ZS_DTYPE_F32), 4);
    cr_assert_eq(zs_dtype_size(ZS_DTYPE_F16), 2);
    cr_assert_eq(zs_dtype_size(ZS_DTYPE_BF16), 2);
    cr_assert_str_eq(zs_dtype_name(ZS_DTYPE_F32), "fp32");
    cr_assert_str_eq(zs_dtype_name(ZS_DTYPE_F16), "fp16");
    cr_assert_str_eq(zs_dtype_name(ZS_DTYPE_BF16), "bf16");
}

Test(zs_dtype, every_row_of_the_map_is_a_dtype_from_int)
{
    static const int values[] = {
#define V_(name, value, str, bytes) (value),
        ZS_DTYPE_MAP(V_)
#undef V_
    };
    static const size_t sizes[] = {
#define B_(name, value, str, bytes) (bytes),
        ZS_DTYPE_MAP(B_)
#undef B_
    };

    cr_assert_eq(sizeof(values) / sizeof(values[0]), ZS_DTYPE_COUNT);
    for (size_t i = 0; i < ZS_DTYPE_COUNT; i++) {
        zs_dtype_t d = ZS_DTYPE_BF16;

        cr_assert_eq(zs_dtype_from_int(values[i], &d), ZS_OK);
        cr_assert_eq((int)d, values[i]);
        cr_assert_eq(zs_dtype_size(d), sizes[i]);
        cr_assert_str_neq(zs_dtype_name(d), "unknown");
    }
}

Test(zs_dtype, a_number_outside_the_map_is_no_dtype)
{
    zs_dtype_t d = ZS_DTYPE_F16;

    cr_assert_eq(zs_dtype_from_int(-1, &d), ZS_ERR_INVALID);
    cr_assert_eq(zs_dtype_from_int(ZS_DTYPE_COUNT, &d), ZS_ERR_INVALID);
    cr_assert_eq(d, ZS_DTYPE_F16, "written on failure");
    cr_assert_eq(zs_dtype_size((zs_dtype_t)ZS_DTYPE_COUNT), 0);
    cr_assert_str_eq(zs_dtype_name((zs_dtype_t)ZS_DTYPE_COUNT), "unknown");
}
