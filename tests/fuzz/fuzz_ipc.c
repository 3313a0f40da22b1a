/* libFuzzer target: the daemon's frame decoder and message validation, fed a byte stream as
 * it would arrive on one connection (docs/architecture.md), plus the JSON config validation that an
 * Attach triggers. */
#include "config/train_config.h"
#include "rpc/rpc_check.h"
#include "zs/frame.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zd_role_t role = ZD_ROLE_NONE;
    size_t off = 0;
    char err[512];

    while (off < size) {
        zd_frame_t *f = NULL;
        size_t used = 0, need = 0;
        zs_status_t st = zs_frame_parse(data + off, size - off, &used, &need, err, sizeof(err));

        if (st != ZS_OK || used == 0) {
            break;
        }
        st = zd_rpc_decode(data + off + ZS_FRAME_HEADER, used - ZS_FRAME_HEADER, &f, err,
                           sizeof(err));
        if (st != ZS_OK) {
            break;
        }
        off += used;
        st = zd_rpc_check(role, f, err, sizeof(err));
        if (st == ZS_OK && f->body_case == ZEROD__IPC__V1__FRAME__BODY_HELLO) {
            role = f->hello->role == ZEROD__IPC__V1__ROLE__ROLE_TRAINER ? ZD_ROLE_TRAINER
                                                                        : ZD_ROLE_CONTROL;
        }
        if (st == ZS_OK && f->body_case == ZEROD__IPC__V1__FRAME__BODY_ATTACH) {
            zd_train_config_t cfg;
            char ignored[256];
            if (zd_train_config_parse(f->attach->config_json, &cfg, ignored, sizeof(ignored), err,
                                      sizeof(err)) == ZS_OK) {
                for (size_t g = 0; g < f->attach->n_groups; g++) {
                    zd_group_opts_t o;
                    zd_group_opts_parse(f->attach->groups[g]->options_json, &cfg.opt, (uint32_t)g,
                                        &o, err, sizeof(err));
                }
            }
        }
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
        if (st != ZS_OK) {
            break; /* the daemon closes the connection here */
        }
    }
    return 0;
}
