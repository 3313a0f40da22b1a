/* Build-time generator: prints proto/zerod/common/v1/status.proto from ZS_STATUS_MAP. */
#include "zs/status.h"

#include <stdio.h>

int main(void)
{
    printf("// Generated from common/include/zs/status.h (ZS_STATUS_MAP). Do not edit.\n");
    printf("syntax = \"proto3\";\n\npackage zerod.common.v1;\n\n");
    printf("enum Status {\n");
#define ZS_STATUS_PROTO_(name, value, str) printf("  ZS_%s = %d; // %s\n", #name, (value), str);
    ZS_STATUS_MAP(ZS_STATUS_PROTO_)
#undef ZS_STATUS_PROTO_
    printf("}\n");
    return 0;
}
