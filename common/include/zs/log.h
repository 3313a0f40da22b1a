/*
 * Logging: one line per message, each with a level and a subsystem, to stderr or journald.
 *
 *   zs_warn(ZS_SUB_IPC, "peer %d closed: %m", rank);
 *
 * A line is `TIME host:pid:tid [rank 3] WARN ipc.c:142 message`; when JOURNAL_STREAM is set
 * (stderr goes to journald) it is `<4>host:pid:tid [rank 3] WARN ipc.c:142 message` with no
 * timestamp. Level from ZEROD_LOG_LEVEL (error|warn|info|debug|trace, default info),
 * subsystems from ZEROD_LOG_SUBSYS (comma list of ipc,mesh,coll,engine,mem,cfg,kern,main or
 * "all"). Errors are always printed whatever the subsystem filter. Thread-safe.
 * Libraries (libzc, kernels/) never call these.
 *
 * A message is one line whatever it quotes: control characters in it (a newline in a job id a
 * client sent, say) are written as \n, \r, \t or \xNN, so no input can forge a log line.
 * Warnings a client or peer can cause at will go through a rate limiter (zs_warn_limited):
 * a burst, then silence for the rest of the interval, then one line counting what was
 * suppressed.
 */
#ifndef ZS_LOG_H
#define ZS_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zs_log_level {
    ZS_LOG_ERROR = 0,
    ZS_LOG_WARN,
    ZS_LOG_INFO,
    ZS_LOG_DEBUG,
    ZS_LOG_TRACE,
    ZS_LOG_LEVEL_COUNT
} zs_log_level_t;

#define ZS_LOG_SUBSYS_MAP(XX)                                                                      \
    XX(MAIN, "main")                                                                               \
    XX(IPC, "ipc")                                                                                 \
    XX(MESH, "mesh")                                                                               \
    XX(COLL, "coll")                                                                               \
    XX(ENGINE, "engine")                                                                           \
    XX(MEM, "mem")                                                                                 \
    XX(CFG, "cfg")                                                                                 \
    XX(KERN, "kern")

typedef enum zs_log_subsys {
#define ZS_SUB_ENUM_(id, name) ZS_SUB_##id,
    ZS_LOG_SUBSYS_MAP(ZS_SUB_ENUM_)
#undef ZS_SUB_ENUM_
        ZS_SUB_COUNT
} zs_log_subsys_t;

/* Sink for tests: receives the fully formatted line (no trailing newline). */
typedef void (*zs_log_sink_cb_t)(zs_log_level_t level, zs_log_subsys_t sub, const char *line,
                                 void *arg);

/* Read ZEROD_LOG_LEVEL / ZEROD_LOG_SUBSYS / JOURNAL_STREAM. Bad values warn and keep defaults. */
void zs_log_init_from_env(void);
void zs_log_set_level(zs_log_level_t level);
zs_log_level_t zs_log_get_level(void);
/* "ipc,mesh" or "all"; returns -1 naming nothing on an unknown name (filter unchanged). */
int zs_log_set_subsys(const char *list);
void zs_log_set_rank(int rank); /* -1: no rank prefix */
void zs_log_set_journal(int on);
/* NULL restores stderr. */
void zs_log_set_sink(zs_log_sink_cb_t cb, void *arg);
int zs_log_enabled(zs_log_level_t level, zs_log_subsys_t sub);
/* Lines emitted at this level since start (or the last reset). */
unsigned long zs_log_count(zs_log_level_t level);
void zs_log_reset_counts(void);
int zs_log_level_from_name(const char *name, zs_log_level_t *level_p);
const char *zs_log_level_name(zs_log_level_t level);

void zs_log_emit(zs_log_level_t level, zs_log_subsys_t sub, const char *file, int line,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define ZS_LOG_(level, sub, ...)                                                                   \
    do {                                                                                           \
        if (zs_log_enabled((level), (sub))) {                                                      \
            zs_log_emit((level), (sub), __FILE__, __LINE__, __VA_ARGS__);                          \
        }                                                                                          \
    } while (0)

/* At most `burst` messages per `interval_ns`; the rest are counted. One limiter belongs to one
 * thread (or is used under the caller's lock). */
typedef struct zs_ratelimit {
    uint64_t interval_ns;
    uint32_t burst;
    uint32_t printed;  /* in the current interval */
    uint64_t begin_ns; /* start of the current interval; 0 before the first message */
    uint64_t missed;   /* refused since the last message printed */
} zs_ratelimit_t;

#define ZS_RATELIMIT_INIT(interval_ns, burst)                                                      \
    {                                                                                              \
        (interval_ns), (burst), 0, 0, 0                                                            \
    }

/* May a message go out now? When it may and some were refused before it, *missed_p is how
 * many (and the count restarts); otherwise *missed_p is 0. */
bool zs_ratelimit_ok(zs_ratelimit_t *rl, uint64_t *missed_p);

/* zs_warn through a limiter; a line "N similar warnings suppressed" precedes the next one let
 * through after a refusal. */
#define zs_warn_limited(rl, sub, ...)                                                              \
    do {                                                                                           \
        uint64_t zs_missed_;                                                                       \
        if (zs_log_enabled(ZS_LOG_WARN, (sub)) && zs_ratelimit_ok((rl), &zs_missed_)) {            \
            if (zs_missed_ != 0) {                                                                 \
                zs_log_emit(ZS_LOG_WARN, (sub), __FILE__, __LINE__,                                \
                            "%llu similar warnings suppressed (at most %u per %.0f s)",            \
                            (unsigned long long)zs_missed_, (rl)->burst,                           \
                            (double)(rl)->interval_ns * 1e-9);                                     \
            }                                                                                      \
            zs_log_emit(ZS_LOG_WARN, (sub), __FILE__, __LINE__, __VA_ARGS__);                      \
        }                                                                                          \
    } while (0)

#define zs_error(sub, ...) ZS_LOG_(ZS_LOG_ERROR, (sub), __VA_ARGS__)
#define zs_warn(sub, ...)  ZS_LOG_(ZS_LOG_WARN, (sub), __VA_ARGS__)
#define zs_info(sub, ...)  ZS_LOG_(ZS_LOG_INFO, (sub), __VA_ARGS__)
#define zs_debug(sub, ...) ZS_LOG_(ZS_LOG_DEBUG, (sub), __VA_ARGS__)
#define zs_trace(sub, ...) ZS_LOG_(ZS_LOG_TRACE, (sub), __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
