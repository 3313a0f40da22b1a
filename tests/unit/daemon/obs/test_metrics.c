/* The metrics snapshot and its text (daemon/src/obs/metrics.c, docs/metrics.md): metrics_listen
 * values, histogram buckets, the Prometheus text of a job (labels escaped, cumulative buckets,
 * NaN for a skipped step's norm), and the rules of /healthz and /readyz. The text format itself
 * is checked by promtool in tests/integration/metrics.sh. */
#include "job/job.h"
#include "obs/metrics.h"
#include "zs/time.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(zd_listen, parses_each_form)
{
    zd_listen_t l;
    char err[256];

    cr_assert_eq(zd_listen_parse("", &l, err, sizeof(err)), ZS_OK);
    cr_assert_eq(l.kind, ZD_LISTEN_OFF);
    cr_assert_eq(zd_listen_parse("127.0.0.1:9400", &l, err, sizeof(err)), ZS_OK);
    cr_assert_eq(l.kind, ZD_LISTEN_TCP);
    cr_assert_str_eq(l.host, "127.0.0.1");
    cr_assert_str_eq(l.port, "9400");
    cr_assert_eq(zd_listen_parse("[::1]:65535", &l, err, sizeof(err)), ZS_OK);
    cr_assert_str_eq(l.host, "::1");
    cr_assert_str_eq(l.port, "65535");
    cr_assert_eq(zd_listen_parse("/run/zerod/metrics-cpu0.sock", &l, err, sizeof(err)), ZS_OK);
    cr_assert_eq(l.kind, ZD_LISTEN_UNIX);
    cr_assert_str_eq(l.path, "/run/zerod/metrics-cpu0.sock");
    cr_assert_eq(zd_listen_parse("auto", &l, err, sizeof(err)), ZS_OK);
    cr_assert_eq(l.kind, ZD_LISTEN_AUTO);
    cr_assert_eq(zd_listen_parse("off", &l, err, sizeof(err)), ZS_OK);
    cr_assert_eq(l.kind, ZD_LISTEN_OFF);
    cr_assert_eq(zd_listen_parse("none", &l, err, sizeof(err)), ZS_OK);
    cr_assert_eq(l.kind, ZD_LISTEN_OFF);
}

/* auto: beside the daemon socket, so that daemons of one directory never share it */
Test(zd_listen, derives_the_auto_path_from_the_daemon_socket)
{
    char out[108], err[512], longsock[104];

    cr_assert_eq(
        zd_listen_auto_path("/run/zerod/zerod-cpu0.sock", out, sizeof(out), err, sizeof(err)),
        ZS_OK);
    cr_assert_str_eq(out, "/run/zerod/zerod-cpu0.metrics.sock");
    cr_assert_eq(zd_listen_auto_path("/tmp/x/zerod", out, sizeof(out), err, sizeof(err)), ZS_OK);
    cr_assert_str_eq(out, "/tmp/x/zerod.metrics.sock");
    cr_assert_eq(zd_listen_auto_path("/tmp/.sock", out, sizeof(out), err, sizeof(err)), ZS_OK);
    cr_assert_str_eq(out, "/tmp/.metrics.sock");
    /* a daemon socket of 103 bytes fits sun_path; its metrics socket would not */
    memset(longsock, 'a', sizeof(longsock) - 1);
    longsock[0] = '/';
    longsock[sizeof(longsock) - 1] = '\0';
    cr_assert_eq(zd_listen_auto_path(longsock, out, sizeof(out), err, sizeof(err)), ZS_ERR_INVALID);
    cr_assert_not_null(strstr(err, "config key 'metrics_listen' (auto)"), "%s", err);
}

Test(zd_listen, refuses_naming_key_and_value)
{
    static const char *const bad[] = {"9400",       "127.0.0.1:", "127.0.0.1:0", "host:65536",
                                      ":9400",      "::1:9400",   "[::1]9400",   "a b:80",
                                      "rel/x.sock", "h:12ab"};
    char err[256], longpath[200];
    zd_listen_t l;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(zd_listen_parse(bad[i], &l, err, sizeof(err)), ZS_ERR_CONFIG, "%s", bad[i]);
        cr_assert_not_null(strstr(err, "config key 'metrics_listen'"), "%s", err);
        cr_assert_not_null(strstr(err, bad[i]), "%s", err);
    }
    memset(longpath, 'a', sizeof(longpath) - 1);
    longpath[0] = '/';
    longpath[sizeof(longpath) - 1] = '\0';
    cr_assert_eq(zd_listen_parse(longpath, &l, err, sizeof(err)), ZS_ERR_CONFIG);
}

Test(zd_hist, counts_each_observation_in_its_bucket)
{
    zd_hist_t h;

    memset(&h, 0, sizeof(h));
    zd_hist_observe(&h, 0.0);    /* first bucket */
    zd_hist_observe(&h, 0.0001); /* on the bound: le is inclusive */
    zd_hist_observe(&h, 0.3);    /* (0.25, 0.5] */
    zd_hist_observe(&h, 1000.0); /* only +Inf */
    cr_assert_eq(h.count, 4);
    cr_assert_eq(h.in[0], 2);
    cr_assert_eq(h.in[11], 1);
    cr_assert_float_eq(zd_hist_bounds[11], 0.5, 0);
    cr_assert_float_eq(h.sum, 1000.3001, 1e-9);
}

#define SEC ZS_NSEC_PER_SEC

/* The step rate of Status (docs/metrics.md "Step rate"): exact counts over exact spans, so the
 * expected rates are exact in double. */
Test(zd_step_rate, counts_the_steps_of_the_window)
{
    zd_step_stats_t s;
    const uint64_t t0 = 1000 * SEC; /* the job's creation */

    memset(&s, 0, sizeof(s));
    cr_assert_float_eq(zd_step_rate(&s, t0, t0 + SEC), 0.0, 0, "no step: 0");
    for (uint64_t k = 1; k <= 4; k++) { /* steps end at t0 + 1, 2, 3, 4 s */
        zd_step_rate_note(&s, t0 + k * SEC);
    }
    cr_assert_eq(s.n_step_ends, 4);
    /* since the job began (4 s ago, less than the window): 4 steps in 4 s */
    cr_assert_float_eq(zd_step_rate(&s, t0, t0 + 4 * SEC), 1.0, 0);
    /* 12 s after: the window is the last 10 s, (t0 + 2, t0 + 12]: steps 3 and 4 */
    cr_assert_float_eq(zd_step_rate(&s, t0, t0 + 12 * SEC), 0.2, 1e-15);
    /* idle for longer than the window: 0 */
    cr_assert_float_eq(zd_step_rate(&s, t0, t0 + 15 * SEC), 0.0, 0);
    /* a job created after the window opened: the window starts at its creation */
    cr_assert_float_eq(zd_step_rate(&s, t0 + 2 * SEC, t0 + 6 * SEC), 0.5, 0);
}

Test(zd_step_rate, holds_more_steps_than_its_ring)
{
    zd_step_stats_t s;
    const uint64_t t0 = 1000 * SEC, ms = SEC / 1000;

    memset(&s, 0, sizeof(s));
    for (uint64_t k = 1; k <= 3 * ZD_RATE_STEPS; k++) { /* one step every millisecond */
        zd_step_rate_note(&s, t0 + k * ms);
    }
    /* the window holds 192 steps, the ring the last 64: 63 steps in the 63 ms after the oldest */
    cr_assert_float_eq(zd_step_rate(&s, t0, t0 + 3 * ZD_RATE_STEPS * ms), 1000.0, 1e-9);
    /* exactly a ring's worth since the job began: every one of them counts */
    memset(&s, 0, sizeof(s));
    for (uint64_t k = 1; k <= ZD_RATE_STEPS; k++) {
        zd_step_rate_note(&s, t0 + k * ms);
    }
    cr_assert_float_eq(zd_step_rate(&s, t0, t0 + ZD_RATE_STEPS * ms), 1000.0, 1e-9);
}

static zd_job_status_t a_job(void)
{
    zd_job_status_t j;

    memset(&j, 0, sizeof(j));
    snprintf(j.job_id, sizeof(j.job_id), "%s", "a\"b\\c");
    j.rank = 1;
    j.world = 2;
    j.stage = 2;
    j.dtype = ZS_DTYPE_F32;
    j.step = 7;
    j.grad_norm = -1; /* the last step was skipped */
    j.loss_scale = 65536;
    j.mesh_up = true;
    j.mem_bytes[ZD_MEM_M] = 4096;
    zd_hist_observe(&j.stats.phase[ZD_PHASE_ADAM], 0.002);
    zd_hist_observe(&j.stats.phase[ZD_PHASE_ADAM], 0.02);
    snprintf(j.collectives, sizeof(j.collectives), "%s", "direct");
    return j;
}

static char *format(zd_metrics_t *m)
{
    char *text = NULL;
    size_t len = 0;

    cr_assert_eq(zd_metrics_format(m, &text, &len), ZS_OK);
    cr_assert_eq(strlen(text), len);
    cr_assert_eq(text[len - 1], '\n');
    return text;
}

Test(zd_metrics, formats_a_job_with_escaped_labels)
{
    zd_metrics_t *m = NULL;
    zd_job_status_t j = a_job();
    const char *lab = "job=\"a\\\"b\\\\c\",rank=\"1\",device=\"cpu:1\"";
    char want[512], *text;

    cr_assert_eq(zd_metrics_create("cpu:1", &m), ZS_OK);
    text = format(m);
    cr_assert_not_null(strstr(text, "zerod_jobs{device=\"cpu:1\"} 0\n"));
    cr_assert_null(strstr(text, "zerod_steps_total"), "no job: no job series");
    free(text);

    zd_metrics_publish_job(m, &j);
    zd_metrics_protocol_error(m);
    text = format(m);
    snprintf(want, sizeof(want), "zerod_steps_total{%s} 7\n", lab);
    cr_assert_not_null(strstr(text, want), "%s", text);
    snprintf(want, sizeof(want), "zerod_grad_norm{%s} NaN\n", lab);
    cr_assert_not_null(strstr(text, want));
    snprintf(want, sizeof(want), "zerod_memory_bytes{%s,term=\"m\"} 4096\n", lab);
    cr_assert_not_null(strstr(text, want));
    snprintf(want, sizeof(want), "zerod_mesh_peers_up{%s} 1\n", lab);
    cr_assert_not_null(strstr(text, want));
    /* cumulative: 0.002 is in le=0.0025, both in le=0.025 and +Inf */
    snprintf(want, sizeof(want),
             "zerod_step_phase_duration_seconds_bucket{%s,phase=\"adam\",le=\"0.0025\"} 1\n", lab);
    cr_assert_not_null(strstr(text, want));
    snprintf(want, sizeof(want),
             "zerod_step_phase_duration_seconds_bucket{%s,phase=\"adam\",le=\"0.025\"} 2\n", lab);
    cr_assert_not_null(strstr(text, want));
    snprintf(want, sizeof(want),
             "zerod_step_phase_duration_seconds_bucket{%s,phase=\"adam\",le=\"+Inf\"} 2\n", lab);
    cr_assert_not_null(strstr(text, want));
    cr_assert_not_null(strstr(text, "zerod_protocol_errors_total{device=\"cpu:1\"} 1\n"));
    free(text);
    zd_metrics_destroy(m);
}

Test(zd_metrics, reports_collective_wait_apart_from_bandwidth)
{
    zd_metrics_t *m = NULL;
    zd_job_status_t j = a_job();
    const char *lab = "job=\"a\\\"b\\\\c\",rank=\"1\",device=\"cpu:1\"";
    char want[512], *text;

    j.stats.xfer_bytes[ZD_XFER_REDUCE_SCATTER] = 1000;
    j.stats.xfer_wait_ns[ZD_XFER_REDUCE_SCATTER] = 1500000000; /* 1.5 s */
    j.stats.xfer_busy_ns[ZD_XFER_REDUCE_SCATTER] = 250000000;
    j.stats.xfer_wait_ns[ZD_XFER_ALL_GATHER] = 2000000;
    j.stats.busbw[ZD_XFER_REDUCE_SCATTER] = 2e9;
    j.stats.last_wait_s[ZD_XFER_REDUCE_SCATTER] = 0.5;
    cr_assert_eq(zd_metrics_create("cpu:1", &m), ZS_OK);
    zd_metrics_publish_job(m, &j);
    text = format(m);
    snprintf(want, sizeof(want),
             "zerod_collective_wait_seconds_total{%s,collective=\"reduce_scatter\"} 1.5\n", lab);
    cr_assert_not_null(strstr(text, want), "%s", text);
    snprintf(want, sizeof(want),
             "zerod_collective_transfer_seconds_total{%s,collective=\"reduce_scatter\"} 0.25\n",
             lab);
    cr_assert_not_null(strstr(text, want), "%s", text);
    snprintf(want, sizeof(want),
             "zerod_collective_bus_bandwidth_bytes_per_second{%s,collective=\"reduce_scatter\"} "
             "2000000000\n",
             lab);
    cr_assert_not_null(strstr(text, want), "%s", text);
    snprintf(want, sizeof(want),
             "zerod_collective_last_wait_seconds{%s,collective=\"reduce_scatter\"} 0.5\n", lab);
    cr_assert_not_null(strstr(text, want), "%s", text);
    snprintf(want, sizeof(want),
             "zerod_collective_bus_bandwidth_bytes_per_second{%s,collective=\"all_gather\"} 0\n",
             lab);
    cr_assert_not_null(strstr(text, want), "one region per rank: an all_gather series");
    snprintf(want, sizeof(want), "zerod_params_region_shared{%s} 0\n", lab);
    cr_assert_not_null(strstr(text, want), "%s", text);
    free(text);

    /* a shared params region: the all-gather is a barrier, all wait, no bandwidth series */
    j.params_shared = true;
    zd_metrics_publish_job(m, &j);
    text = format(m);
    snprintf(want, sizeof(want),
             "zerod_collective_bus_bandwidth_bytes_per_second{%s,collective=\"all_gather\"}", lab);
    cr_assert_null(strstr(text, want), "%s", text);
    snprintf(want, sizeof(want),
             "zerod_collective_wait_seconds_total{%s,collective=\"all_gather\"} 0.002\n", lab);
    cr_assert_not_null(strstr(text, want), "%s", text);
    snprintf(want, sizeof(want), "zerod_params_region_shared{%s} 1\n", lab);
    cr_assert_not_null(strstr(text, want), "%s", text);
    free(text);
    zd_metrics_destroy(m);
}

Test(zd_metrics, healthz_follows_the_loop_heartbeat)
{
    zd_metrics_t *m = NULL;
    char why[256];

    cr_assert_eq(zd_metrics_create("cpu:0", &m), ZS_OK);
    cr_assert_not(zd_metrics_healthy(m, 1000, why, sizeof(why)), "no heartbeat yet");
    zd_metrics_heartbeat(m, 1000);
    cr_assert(zd_metrics_healthy(m, 1000 + ZD_METRICS_HEALTH_STALE_NS, why, sizeof(why)));
    cr_assert_not(zd_metrics_healthy(m, 1001 + ZD_METRICS_HEALTH_STALE_NS, why, sizeof(why)));
    cr_assert_not_null(strstr(why, "last heartbeat"), "%s", why);
    zd_metrics_destroy(m);
}

Test(zd_metrics, readyz_wants_listening_and_every_peer_up)
{
    zd_metrics_t *m = NULL;
    zd_job_status_t j = a_job();
    char why[1024];

    cr_assert_eq(zd_metrics_create("cpu:0", &m), ZS_OK);
    cr_assert_not(zd_metrics_ready(m, why, sizeof(why)), "not listening yet");
    zd_metrics_set_listening(m, true);
    cr_assert(zd_metrics_ready(m, why, sizeof(why)), "%s", why); /* no job */
    zd_metrics_publish_job(m, &j);
    cr_assert(zd_metrics_ready(m, why, sizeof(why)), "%s", why);
    j.mesh_up = false; /* forming */
    zd_metrics_publish_job(m, &j);
    cr_assert_not(zd_metrics_ready(m, why, sizeof(why)));
    cr_assert_not_null(strstr(why, "0 of 1 peers up"), "%s", why);
    j.mesh_lost = true;
    zd_metrics_publish_job(m, &j);
    cr_assert_not(zd_metrics_ready(m, why, sizeof(why)));
    j.world = 1; /* world 1: no peers to wait for */
    j.mesh_lost = false;
    zd_metrics_publish_job(m, &j);
    cr_assert(zd_metrics_ready(m, why, sizeof(why)), "%s", why);
    zd_metrics_publish_job(m, NULL);
    zd_metrics_set_listening(m, false); /* stopping */
    cr_assert_not(zd_metrics_ready(m, why, sizeof(why)));
    zd_metrics_destroy(m);
}
