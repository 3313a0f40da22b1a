/*
 * zeroctl's export of a checkpoint into one safetensors file (ckpt_export_cmd.c): the
 * parameters' fp32 master (or an Adam moment) from every rank's shard, and, for the master,
 * the module's tied names and buffers that module.safetensors keeps (ckpt_module.h).
 */
#ifndef ZCTL_CKPT_EXPORT_CMD_H
#define ZCTL_CKPT_EXPORT_CMD_H

#include "zs/ckpt.h"

#include <stdbool.h>

/* The checkpoint commands' exit statuses: ok, a bad checkpoint or file, usage. */
enum { ZC_EXIT_OK = 0, ZC_EXIT_BAD = 1, ZC_EXIT_USAGE = 2 };

typedef struct ckpt_export {
    const char *ckpt, *tag, *out, *state, *dtype, *format;
} ckpt_export_t;

/* Export the opened checkpoint (its manifest m) into x->out: tensor `tensor` of
 * zs_ckpt_tensor_names, in bf16 or fp32. Returns the exit status; a failure names the file and
 * leaves no partial OUT. */
int ckpt_export_run(const ckpt_export_t *x, const zs_dir_t *ckpt, const zs_ckpt_manifest_t *m,
                    unsigned tensor, bool bf16);

#endif
