/* Monotonic time and deadlines: every wait in zerod has one. */
#ifndef ZS_TIME_H
#define ZS_TIME_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZS_NSEC_PER_USEC 1000ull
#define ZS_NSEC_PER_MSEC 1000000ull
#define ZS_NSEC_PER_SEC  1000000000ull

typedef struct zs_deadline {
    uint64_t at_ns; /* CLOCK_MONOTONIC; UINT64_MAX = never */
} zs_deadline_t;

static inline uint64_t zs_time_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * ZS_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

static inline double zs_time_now_s(void)
{
    return (double)zs_time_now_ns() * 1e-9;
}

/* timeout_ns == UINT64_MAX: no deadline (only for waits that another deadline bounds). */
static inline zs_deadline_t zs_deadline_in_ns(uint64_t timeout_ns)
{
    zs_deadline_t d;
    uint64_t now = zs_time_now_ns();
    d.at_ns = (timeout_ns == UINT64_MAX || now + timeout_ns < now) ? UINT64_MAX : now + timeout_ns;
    return d;
}

static inline zs_deadline_t zs_deadline_in_ms(uint64_t timeout_ms)
{
    return zs_deadline_in_ns(
        timeout_ms > UINT64_MAX / ZS_NSEC_PER_MSEC ? UINT64_MAX : timeout_ms * ZS_NSEC_PER_MSEC);
}

static inline bool zs_deadline_expired(zs_deadline_t d)
{
    return d.at_ns != UINT64_MAX && zs_time_now_ns() >= d.at_ns;
}

/* Nanoseconds left, 0 when expired, UINT64_MAX when there is no deadline. */
static inline uint64_t zs_deadline_remaining_ns(zs_deadline_t d)
{
    uint64_t now;
    if (d.at_ns == UINT64_MAX) {
        return UINT64_MAX;
    }
    now = zs_time_now_ns();
    return (now >= d.at_ns) ? 0 : d.at_ns - now;
}

/* Milliseconds left for poll(): rounded up, capped at INT32_MAX, -1 never returned. */
static inline int zs_deadline_poll_ms(zs_deadline_t d)
{
    uint64_t ns = zs_deadline_remaining_ns(d);
    uint64_t ms = (ns == UINT64_MAX) ? INT32_MAX : (ns + ZS_NSEC_PER_MSEC - 1) / ZS_NSEC_PER_MSEC;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/* Absolute CLOCK_REALTIME timespec for pthread_cond_timedwait on a CLOCK_MONOTONIC condvar. */
static inline struct timespec zs_deadline_timespec(zs_deadline_t d)
{
    struct timespec ts;
    uint64_t at = (d.at_ns == UINT64_MAX) ? zs_time_now_ns() + 3600ull * ZS_NSEC_PER_SEC : d.at_ns;
    ts.tv_sec = (time_t)(at / ZS_NSEC_PER_SEC);
    ts.tv_nsec = (long)(at % ZS_NSEC_PER_SEC);
    return ts;
}

#ifdef __cplusplus
}
#endif
#endif
