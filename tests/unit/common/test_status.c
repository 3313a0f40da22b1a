#include "zs/status.h"

#include <criterion/criterion.h>
#include <string.h>

Test(zs_status, names_and_strings_round_trip)
{
    static const int values[] = {
#define V_(name, value, str) (value),
        ZS_STATUS_MAP(V_)
#undef V_
    };
    static const char *const strings[] = {
#define S_(name, value, str) str,
        ZS_STATUS_MAP(S_)
#undef S_
    };

    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        zs_status_t back;
        const char *name = zs_status_name(values[i]);
        cr_assert_str_neq(name, "UNKNOWN");
        cr_assert_eq(zs_status_from_name(name, &back), 0, "%s does not parse", name);
        cr_assert_eq((int)back, values[i]);
        cr_assert_str_eq(zs_status_string(values[i]), strings[i]);
        for (size_t j = 0; j < i; j++) {
            cr_assert_neq(values[i], values[j], "value %d used twice", values[i]);
        }
    }
}

Test(zs_status, wire_values_never_change)
{
    /* values go on the wire (docs/architecture.md): these must never be renumbered */
    cr_assert_eq(ZS_OK, 0);
    cr_assert_eq(ZS_ERR_INVALID, -2);
    cr_assert_eq(ZS_ERR_PEER_LOST, -40);
    cr_assert_str_eq(zs_status_name(ZS_ERR_PEER_LOST), "ERR_PEER_LOST");
    cr_assert_str_eq(zs_status_string(ZS_ERR_PEER_LOST), "peer lost");
}

Test(zs_status, unknown_values_and_names)
{
    zs_status_t st = ZS_OK;
    cr_assert_str_eq(zs_status_name(12345), "UNKNOWN");
    cr_assert_str_eq(zs_status_string(12345), "unknown status");
    cr_assert_eq(zs_status_from_name("ERR_NOPE", &st), -1);
    cr_assert_eq(zs_status_from_name("ZS_ERR_BUSY", &st), 0);
    cr_assert_eq(st, ZS_ERR_BUSY);
}
