// The public header is plain C99 that also compiles as C++:
// this file must build with -Wall -Wextra -Werror as C++, and the names must link.
#include <zerod/zc.h>

#include <cstdio>
#include <cstring>

int main()
{
    zc_open_params_t op = {};
    op.field_mask = ZC_OPEN_FIELD_SOCKET_PATH;
    op.socket_path = "/nonexistent/zerod.sock";
    zc_session_t *s = nullptr;
    int st = zc_session_open(&op, &s);
    if (st != ZC_ERR_UNREACHABLE || s != nullptr) {
        std::printf("expected ZC_ERR_UNREACHABLE, got %s\n", zc_status_name(st));
        return 1;
    }
    if (std::strstr(zc_last_error(), "/nonexistent/zerod.sock") == nullptr) {
        std::printf("the error does not name the socket: %s\n", zc_last_error());
        return 1;
    }
    return 0;
}
