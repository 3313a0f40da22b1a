#define _GNU_SOURCE
#include "zs/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static const char *const zs_log_level_names[ZS_LOG_LEVEL_COUNT] = {"ERROR", "WARN", "INFO", "DEBUG",
                                                                   "TRACE"};
/* syslog priorities for the journald prefix */
static const int zs_log_syslog_prio[ZS_LOG_LEVEL_COUNT] = {3, 4, 6, 7, 7};

static const char *const zs_log_subsys_names[ZS_SUB_COUNT] = {
#define ZS_SUB_NAME_(id, name) name,
    ZS_LOG_SUBSYS_MAP(ZS_SUB_NAME_)
#undef ZS_SUB_NAME_
};

static struct {
    atomic_int level;
    atomic_uint subsys_mask;
    atomic_int rank;
    atomic_int journal;
    atomic_ulong counts[ZS_LOG_LEVEL_COUNT];
    pthread_mutex_t lock;
    zs_log_sink_cb_t sink;
    void *sink_arg;
} zs_log = {
    .level = ZS_LOG_INFO,
    .subsys_mask = (1u << ZS_SUB_COUNT) - 1,
    .rank = -1,
    .lock = PTHREAD_MUTEX_INITIALIZER,
};

const char *zs_log_level_name(zs_log_level_t level)
{
    return (level < ZS_LOG_LEVEL_COUNT) ? zs_log_level_names[level] : "?";
}

int zs_log_level_from_name(const char *name, zs_log_level_t *level_p)
{
    for (int i = 0; i < ZS_LOG_LEVEL_COUNT; i++) {
        if (strcasecmp(name, zs_log_level_names[i]) == 0) {
            *level_p = (zs_log_level_t)i;
            return 0;
        }
    }
    if (strcasecmp(name, "warning") == 0) {
        *level_p = ZS_LOG_WARN;
        return 0;
    }
    return -1;
}

void zs_log_set_level(zs_log_level_t level)
{
    atomic_store(&zs_log.level, (int)level);
}

zs_log_level_t zs_log_get_level(void)
{
    return (zs_log_level_t)atomic_load(&zs_log.level);
}

int zs_log_set_subsys(const char *list)
{
    unsigned mask = 0;
    char buf[256];
    char *save = NULL;

    if (list == NULL || *list == '\0' || strcasecmp(list, "all") == 0) {
        atomic_store(&zs_log.subsys_mask, (1u << ZS_SUB_COUNT) - 1);
        return 0;
    }
    if (strlen(list) >= sizeof(buf)) {
        return -1;
    }
    strcpy(buf, list);
    for (char *tok = strtok_r(buf, ", ", &save); tok != NULL; tok = strtok_r(NULL, ", ", &save)) {
        int found = 0;
        for (int i = 0; i < ZS_SUB_COUNT; i++) {
            if (strcasecmp(tok, zs_log_subsys_names[i]) == 0) {
                mask |= 1u << i;
                found = 1;
            }
        }
        if (strcasecmp(tok, "all") == 0) {
            mask = (1u << ZS_SUB_COUNT) - 1;
            found = 1;
        }
        if (!found) {
            return -1;
        }
    }
    atomic_store(&zs_log.subsys_mask, mask);
    return 0;
}

void zs_log_set_rank(int rank)
{
    atomic_store(&zs_log.rank, rank);
}

void zs_log_set_journal(int on)
{
    atomic_store(&zs_log.journal, on ? 1 : 0);
}

void zs_log_set_sink(zs_log_sink_cb_t cb, void *arg)
{
    pthread_mutex_lock(&zs_log.lock);
    zs_log.sink = cb;
    zs_log.sink_arg = arg;
    pthread_mutex_unlock(&zs_log.lock);
}

unsigned long zs_log_count(zs_log_level_t level)
{
    return (level < ZS_LOG_LEVEL_COUNT) ? atomic_load(&zs_log.counts[level]) : 0;
}

void zs_log_reset_counts(void)
{
    for (int i = 0; i < ZS_LOG_LEVEL_COUNT; i++) {
        atomic_store(&zs_log.counts[i], 0);
    }
}

void zs_log_init_from_env(void)
{
    const char *level = getenv("ZEROD_LOG_LEVEL");
    const char *subsys = getenv("ZEROD_LOG_SUBSYS");
    zs_log_level_t parsed;

    zs_log_set_journal(getenv("JOURNAL_STREAM") != NULL);
    if (level != NULL && *level != '\0') {
        if (zs_log_level_from_name(level, &parsed) == 0) {
            zs_log_set_level(parsed);
        } else {
            zs_warn(ZS_SUB_CFG,
                    "ZEROD_LOG_LEVEL='%s' is not one of error, warn, info, debug, trace; "
                    "keeping info",
                    level);
        }
    }
    if (subsys != NULL && zs_log_set_subsys(subsys) != 0) {
        zs_warn(ZS_SUB_CFG,
                "ZEROD_LOG_SUBSYS='%s' names an unknown subsystem (known: main, ipc, mesh, "
                "coll, engine, mem, cfg, kern, all); logging all",
                subsys);
    }
}

int zs_log_enabled(zs_log_level_t level, zs_log_subsys_t sub)
{
    if ((int)level > atomic_load(&zs_log.level)) {
        return 0;
    }
    if (level == ZS_LOG_ERROR) {
        return 1;
    }
    return (atomic_load(&zs_log.subsys_mask) >> sub) & 1u;
}

bool zs_ratelimit_ok(zs_ratelimit_t *rl, uint64_t *missed_p)
{
    struct timespec ts;
    uint64_t now;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    *missed_p = 0;
    if (rl->begin_ns == 0 || now - rl->begin_ns >= rl->interval_ns) {
        rl->begin_ns = now;
        rl->printed = 0;
    }
    if (rl->printed >= rl->burst) {
        rl->missed++;
        return false;
    }
    rl->printed++;
    *missed_p = rl->missed;
    rl->missed = 0;
    return true;
}

/* Copy src into dst (size len) with control characters escaped: one message, one line. */
static void zs_log_escape(char *dst, size_t len, const char *src)
{
    size_t o = 0;

    for (; *src != '\0' && o + 5 < len; src++) {
        unsigned char c = (unsigned char)*src;
        if (c >= 0x20 && c != 0x7f) {
            dst[o++] = (char)c;
        } else if (c == '\n' || c == '\r' || c == '\t') {
            dst[o++] = '\\';
            dst[o++] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
        } else {
            o += (size_t)snprintf(dst + o, len - o, "\\x%02x", c);
        }
    }
    dst[o] = '\0';
}

void zs_log_emit(zs_log_level_t level, zs_log_subsys_t sub, const char *file, int line,
                 const char *fmt, ...)
{
    int saved_errno = errno;
    char host[64];
    char prefix[192];
    char raw[2048];
    char msg[4096];
    char rank_buf[24] = "";
    const char *base = strrchr(file, '/');
    int rank = atomic_load(&zs_log.rank);
    va_list ap;

    base = (base != NULL) ? base + 1 : file;
    if (gethostname(host, sizeof(host)) != 0) {
        strcpy(host, "?");
    }
    host[sizeof(host) - 1] = '\0';
    if (rank >= 0) {
        snprintf(rank_buf, sizeof(rank_buf), " [rank %d]", rank);
    }

    if (atomic_load(&zs_log.journal)) {
        snprintf(prefix, sizeof(prefix), "<%d>%s:%d:%ld", zs_log_syslog_prio[level], host,
                 (int)getpid(), (long)syscall(SYS_gettid));
    } else {
        struct timespec ts;
        struct tm tm;
        char tbuf[32];
        clock_gettime(CLOCK_REALTIME, &ts);
        localtime_r(&ts.tv_sec, &tm);
        strftime(tbuf, sizeof(tbuf), "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(prefix, sizeof(prefix), "%s.%03ld %s:%d:%ld", tbuf, ts.tv_nsec / 1000000L, host,
                 (int)getpid(), (long)syscall(SYS_gettid));
    }

    errno = saved_errno; /* for %m */
    va_start(ap, fmt);
    vsnprintf(raw, sizeof(raw), fmt, ap);
    va_end(ap);
    zs_log_escape(msg, sizeof(msg), raw);

    atomic_fetch_add(&zs_log.counts[level], 1);
    pthread_mutex_lock(&zs_log.lock);
    if (zs_log.sink != NULL) {
        char full[4608];
        snprintf(full, sizeof(full), "%s%s %s %s:%d %s", prefix, rank_buf,
                 zs_log_level_names[level], base, line, msg);
        zs_log.sink(level, sub, full, zs_log.sink_arg);
    } else {
        fprintf(stderr, "%s%s %s %s:%d %s\n", prefix, rank_buf, zs_log_level_names[level], base,
                line, msg);
    }
    pthread_mutex_unlock(&zs_log.lock);
    errno = saved_errno;
}
