/* Writes a seed corpus for fuzz_ipc: valid conversations a trainer and zeroctl would send. */
#include "zerod/ipc/v1/ipc.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t put_frame(uint8_t *out, const Zerod__Ipc__V1__Frame *f)
{
    size_t n = zerod__ipc__v1__frame__get_packed_size(f);
    out[0] = (uint8_t)n;
    out[1] = (uint8_t)(n >> 8);
    out[2] = (uint8_t)(n >> 16);
    out[3] = (uint8_t)(n >> 24);
    zerod__ipc__v1__frame__pack(f, out + 4);
    return n + 4;
}

static void write_seed(const char *dir, const char *name, const uint8_t *buf, size_t len)
{
    char path[4096];
    FILE *fp;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fp = fopen(path, "wb");
    if (fp == NULL || fwrite(buf, 1, len, fp) != len) {
        perror(path);
        exit(1);
    }
    fclose(fp);
}

int main(int argc, char **argv)
{
    static uint8_t buf[1 << 16];
    Zerod__Ipc__V1__Frame f;
    Zerod__Ipc__V1__Hello h = ZEROD__IPC__V1__HELLO__INIT;
    Zerod__Ipc__V1__Attach a = ZEROD__IPC__V1__ATTACH__INIT;
    Zerod__Ipc__V1__Group g = ZEROD__IPC__V1__GROUP__INIT;
    Zerod__Ipc__V1__Group *gp = &g;
    Zerod__Ipc__V1__BucketReady br = ZEROD__IPC__V1__BUCKET_READY__INIT;
    Zerod__Ipc__V1__Step st = ZEROD__IPC__V1__STEP__INIT;
    Zerod__Ipc__V1__StatusRequest sr = ZEROD__IPC__V1__STATUS_REQUEST__INIT;
    uint64_t numel[] = {37, 100, 5};
    double lr[] = {0.01};
    size_t n = 0;

    if (argc != 2) {
        fprintf(stderr, "usage: gen_seeds DIR\n");
        return 2;
    }
    /* trainer conversation */
    zerod__ipc__v1__frame__init(&f);
    h.protocol = 1;
    h.version = "0.1.0";
    h.role = ZEROD__IPC__V1__ROLE__ROLE_TRAINER;
    f.seq = 1;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_HELLO;
    f.hello = &h;
    n += put_frame(buf + n, &f);
    g.n_numel = 3;
    g.numel = numel;
    g.options_json = "{\"lr\": 0.005, \"weight_decay\": 0.1, \"betas\": [0.9, 0.99]}";
    a.job_id = "fuzz";
    a.world = 1;
    a.n_groups = 1;
    a.groups = &gp;
    a.config_json = "{\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 64}, "
                    "\"fp16\": {\"enabled\": false}, \"gradient_clipping\": 1.0, "
                    "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}}";
    f.seq = 2;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_ATTACH;
    f.attach = &a;
    n += put_frame(buf + n, &f);
    br.slot = 1;
    br.bucket = 2;
    f.seq = 3;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY;
    f.bucket_ready = &br;
    n += put_frame(buf + n, &f);
    st.n_group_lr = 1;
    st.group_lr = lr;
    f.seq = 4;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_STEP;
    f.step = &st;
    n += put_frame(buf + n, &f);
    write_seed(argv[1], "trainer", buf, n);

    /* control conversation */
    n = 0;
    h.role = ZEROD__IPC__V1__ROLE__ROLE_CONTROL;
    f.seq = 1;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_HELLO;
    f.hello = &h;
    n += put_frame(buf + n, &f);
    f.seq = 2;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_STATUS;
    f.status = &sr;
    n += put_frame(buf + n, &f);
    write_seed(argv[1], "control", buf, n);
    return 0;
}
