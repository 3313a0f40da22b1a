/*
 * module.safetensors of a checkpoint (docs/checkpoints.md): what the module's state_dict() holds
 * beyond the trained parameters (buffers, frozen parameters, tied names), which `zeroctl export`
 * writes beside them so that a strict load_state_dict() of its file works.
 */
#ifndef ZCTL_CKPT_MODULE_H
#define ZCTL_CKPT_MODULE_H

#include "zs/ckpt.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#define CKPT_MODULE "module.safetensors"

/* One more tensor of the export: a tied name of parameter `param` (>= 0), written as the
 * parameter is; or a buffer or frozen parameter of module.safetensors (dtype, at `at` of its
 * data), written as fp32. */
typedef struct ckpt_extra {
    const char *name;
    int64_t param;
    const char *dtype;
    uint64_t at, numel;
    uint32_t ndim;
    uint64_t dims[ZS_CKPT_MAX_DIMS];
} ckpt_extra_t;

typedef struct ckpt_module {
    char *file; /* module.safetensors, whole (verified against the manifest) */
    size_t len;
    uint64_t data;
    cJSON *header, *aliases;
    ckpt_extra_t *x;
    unsigned n;
} ckpt_module_t;

/* module.safetensors of the checkpoint (none when its manifest lists none: mod->n 0), verified
 * against the manifest and parsed, its tied names matched to the checkpoint's parameters; 0, or
 * -1 with err. ckpt_module_close() it either way. */
int ckpt_module_open(const zs_dir_t *ckpt, const zs_ckpt_manifest_t *m, ckpt_module_t *mod,
                     char *err, size_t errlen);
void ckpt_module_close(ckpt_module_t *mod);
/* Element i of extra e (not a tied name) as fp32: integers and bools by value. */
float ckpt_extra_float(const ckpt_module_t *mod, const ckpt_extra_t *e, uint64_t i);

#endif
