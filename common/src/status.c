#include "zs/status.h"

#include <string.h>

static const struct {
    int value;
    const char *name;
    const char *str;
} zs_status_table[] = {
#define ZS_STATUS_ROW_(name, value, str) {(value), #name, (str)},
    ZS_STATUS_MAP(ZS_STATUS_ROW_)
#undef ZS_STATUS_ROW_
};

#define ZS_N_STATUS (sizeof(zs_status_table) / sizeof(zs_status_table[0]))

const char *zs_status_name(int status)
{
    for (size_t i = 0; i < ZS_N_STATUS; i++) {
        if (zs_status_table[i].value == status) {
            return zs_status_table[i].name;
        }
    }
    return "UNKNOWN";
}

const char *zs_status_string(int status)
{
    for (size_t i = 0; i < ZS_N_STATUS; i++) {
        if (zs_status_table[i].value == status) {
            return zs_status_table[i].str;
        }
    }
    return "unknown status";
}

int zs_status_from_name(const char *name, zs_status_t *status_p)
{
    if (name == NULL) {
        return -1;
    }
    if (strncmp(name, "ZS_", 3) == 0) {
        name += 3;
    }
    for (size_t i = 0; i < ZS_N_STATUS; i++) {
        if (strcmp(zs_status_table[i].name, name) == 0) {
            *status_p = (zs_status_t)zs_status_table[i].value;
            return 0;
        }
    }
    return -1;
}
