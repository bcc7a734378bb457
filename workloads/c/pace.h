/*
 * Pacing by the monotonic clock, for the workloads that model a rate (dirty,
 * kv): the work is fixed by the arguments and the clock only spreads it out,
 * so a migrated run prints what an uninterrupted one prints. Kept out of
 * common.h because the other workloads read no clock.
 */
#ifndef ROAM_PACE_H
#define ROAM_PACE_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

enum { TICKS_PER_SEC = 100 };
#define TICK_NS (1000000000LL / TICKS_PER_SEC)

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_ns(int64_t ns) {
    struct timespec ts = { (time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL) };
    nanosleep(&ts, NULL);
}

/*
 * Waits until the end of tick `tick` (0-based) of a schedule starting at
 * *base. If the clock is more than 10 ticks off schedule in either
 * direction (a migration, a suspended machine), the schedule is re-based on
 * the current time; a smaller lag is caught up by not sleeping.
 */
static void pace(int64_t *base, int64_t tick) {
    int64_t due = *base + (tick + 1) * TICK_NS, now = now_ns();
    if (now > due + 10 * TICK_NS || due - now > 10 * TICK_NS) {
        *base = now - (tick + 1) * TICK_NS;
        return;
    }
    if (due > now) sleep_ns(due - now);
}

/* Parses a decimal integer in [lo, hi]; returns -1 if it is not one. */
static long parse_arg(const char *s, long lo, long hi) {
    char *end;
    if (!*s || *s == '-' || *s == '+') return -1;
    long v = strtol(s, &end, 10);
    return (*end || v < lo || v > hi) ? -1 : v;
}

#endif
