/*
 * Test harness for integration tests against a real zerod (started by the CTest fixture;
 * its socket is $ZEROD_TEST_SOCKET). Includes an independent fp64 model of docs/semantics.md §4
 * (deliberately not sharing code with the daemon) and 16-bit conversions.
 */
#ifndef TH_HARNESS_H
#define TH_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zerod/zc.h>

#include "reference.h"

typedef struct th_session {
    zc_session_t *s;
    zc_attach_info_t info;
    th_model_t model;
    zc_dtype_t dtype;
} th_session_t;

const char *th_socket(void);
/* Open + attach; asserts success. */
void th_attach(th_session_t *ts, const char *job, const th_model_t *model, zc_dtype_t dtype,
               const char *config_json);
/* One attempt, returning the status (no retry while the daemon is busy). */
int th_try_attach_once(th_session_t *ts, const char *job, const th_model_t *model, zc_dtype_t dtype,
                       const char *config_json);
/* Same, returning the status instead of asserting; retries ERR_BUSY for up to 10 s. */
int th_try_attach(th_session_t *ts, const char *job, const th_model_t *model, zc_dtype_t dtype,
                  const char *config_json);
/* Write initial params (flat array over all params in registration order) and confirm. */
void th_init_params(th_session_t *ts, const float *init);
/* Submit one micro-step of gradients (flat, registration order, already scaled). */
void th_submit(th_session_t *ts, const float *grads, uint32_t micro_step);
int th_step(th_session_t *ts, zc_step_result_t *res);
/* Read params (flat, registration order) as floats. */
void th_read_params(th_session_t *ts, float *out);
void th_end(th_session_t *ts);

#endif
