/*
 * kvserver.c - a Redis-protocol (RESP2) key-value server, roam's service
 * workload.
 *
 * Why this exists: roam migrates running servers, and the claim is only worth
 * something against clients that nobody here wrote. This server speaks enough
 * RESP2 for Debian's unmodified `redis-benchmark` and `redis-cli`, keeps its
 * whole state in linear memory (so a snapshot carries it), and runs one event
 * loop on poll(), which wasi-libc turns into a single `poll_oneoff`: the cell
 * is blocked there, between requests, most of the time, and can be
 * checkpointed there.
 *
 * It is not Redis and shares no code with it. Commands, the digest and the
 * limits are listed in docs/workloads.md ("kvserver").
 *
 * Listening socket: under WASI the program owns no host socket; roam hands it
 * listening sockets as inherited fds (after the preopened directories), and
 * the server takes the first fd whose type is a stream socket. Natively
 * (gcc, for tests and as a baseline) it binds `--listen HOST:PORT` itself.
 *
 * Event loop: non-blocking accept/recv/send. Each client has an input buffer
 * (one command is parsed when it is complete; pipelined commands run in
 * order) and an output buffer. Limits, and what happens past them:
 *   - a client with more than OUT_SOFT bytes of unsent replies is not read
 *     from (and its buffered commands wait) until it drains: a client that
 *     pipelines without reading slows itself down, nobody else;
 *   - a client whose unsent replies exceed OUT_HARD, or whose unsent replies
 *     have not shrunk for STALL_MS, is disconnected;
 *   - one request may not exceed MAX_BULK per argument, MAX_ARGS arguments,
 *     or MAX_QUERY bytes in all: the client gets a protocol error and is
 *     disconnected, as Redis does.
 * Every malloc is checked: a command that cannot get memory answers
 * `-ERR out of memory` and changes nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef __wasi__
#include <wasi/api.h>
#else
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#endif

#define OUT_SOFT (1u << 20)            /* stop reading a client above this much unsent output */
#define OUT_HARD (64u << 20)           /* disconnect a client above this much unsent output */
#define STALL_MS 60000                 /* disconnect a client whose unsent output has not shrunk for this long */
#define MAX_BULK (64u << 20)           /* one argument */
#define MAX_ARGS (1024 * 1024)         /* arguments of one request */
#define MAX_QUERY (128u << 20)         /* bytes of one request */
#define MAX_INLINE (64u << 10)         /* one inline request line */
#define READ_CHUNK (64u << 10)
#define CRON_MS 100
#define DEFAULT_MAX_CLIENTS 10000
#define VERSION "7.0.0"
#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

/* ---- clock ------------------------------------------------------------ */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- memory accounting ------------------------------------------------ */

static uint64_t used_memory; /* bytes held by keys, values, table and client buffers (approximate) */

/* ---- the keyspace: chained hash table that doubles -------------------- */

typedef struct entry {
    struct entry *next;
    uint64_t hash;
    int64_t expire_at; /* monotonic ms, 0 = never */
    uint32_t klen;
    uint32_t vlen;
    uint32_t vcap;
    char data[]; /* key, then value (vcap bytes) */
} entry;

static entry **table;
static uint64_t nbuckets; /* power of two */
static uint64_t nkeys, nvolatile;
static uint64_t hash_seed;
static uint64_t expire_cursor;
static uint64_t stat_expired, stat_commands, stat_connections, stat_rejected;

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t hash_key(const char *p, size_t n) {
    uint64_t h = hash_seed ^ (n * 0x9e3779b97f4a7c15ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
        h ^= h >> 29;
        p += 8, n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
    return mix64(h);
}

static int table_init(uint64_t n) {
    entry **t = calloc(n, sizeof *t);
    if (!t) return -1;
    table = t, nbuckets = n, nkeys = nvolatile = 0, expire_cursor = 0;
    used_memory += n * sizeof *t;
    return 0;
}

/* Doubles the table when the load passes 1. On malloc failure the table just
 * stays smaller (chains get longer), which is slower but correct. */
static void table_maybe_grow(void) {
    if (nkeys < nbuckets || nbuckets >= (UINT64_C(1) << 40)) return;
    uint64_t n = nbuckets * 2;
    entry **t = calloc(n, sizeof *t);
    if (!t) return;
    for (uint64_t i = 0; i < nbuckets; i++) {
        entry *e = table[i];
        while (e) {
            entry *next = e->next;
            uint64_t b = e->hash & (n - 1);
            e->next = t[b];
            t[b] = e;
            e = next;
        }
    }
    free(table);
    used_memory += (n - nbuckets) * sizeof *t;
    table = t, nbuckets = n, expire_cursor = 0;
}

static size_t entry_size(uint32_t klen, uint32_t vcap) { return sizeof(entry) + klen + vcap; }

static void entry_unlink_free(entry **slot) {
    entry *e = *slot;
    *slot = e->next;
    if (e->expire_at) nvolatile--;
    nkeys--;
    used_memory -= entry_size(e->klen, e->vcap);
    free(e);
}

/* Finds the slot pointing at key (or the NULL slot at the chain's end).
 * An expired key found on the way is deleted (lazy expiry). */
static entry **lookup_slot(const char *k, size_t klen, uint64_t h, int64_t now) {
    entry **slot = &table[h & (nbuckets - 1)];
    while (*slot) {
        entry *e = *slot;
        if (e->hash == h && e->klen == klen && memcmp(e->data, k, klen) == 0) {
            if (e->expire_at && e->expire_at <= now) {
                entry_unlink_free(slot);
                stat_expired++;
                return slot;
            }
            return slot;
        }
        slot = &e->next;
    }
    return slot;
}

static entry *lookup(const char *k, size_t klen, int64_t now) {
    return *lookup_slot(k, klen, hash_key(k, klen), now);
}

static void set_expire(entry *e, int64_t at) {
    if (e->expire_at && !at) nvolatile--;
    if (!e->expire_at && at) nvolatile++;
    e->expire_at = at;
}

/* Stores key = value (replacing any value). keep_ttl keeps an existing
 * expiry. Returns the entry, or NULL (nothing changed) when out of memory. */
static entry *store(const char *k, size_t klen, const char *v, size_t vlen, int64_t now, int keep_ttl) {
    uint64_t h = hash_key(k, klen);
    entry **slot = lookup_slot(k, klen, h, now);
    entry *e = *slot;
    if (e && e->vcap >= vlen && e->vcap <= 2 * vlen + 64) {
        memcpy(e->data + klen, v, vlen);
        e->vlen = (uint32_t)vlen;
        if (!keep_ttl) set_expire(e, 0);
        return e;
    }
    uint32_t vcap = (uint32_t)vlen;
    entry *n = malloc(entry_size((uint32_t)klen, vcap));
    if (!n) return NULL;
    n->hash = h;
    n->klen = (uint32_t)klen, n->vlen = (uint32_t)vlen, n->vcap = vcap;
    n->expire_at = 0;
    memcpy(n->data, k, klen);
    memcpy(n->data + klen, v, vlen);
    used_memory += entry_size(n->klen, vcap);
    if (e) {
        if (e->expire_at) {
            if (keep_ttl) n->expire_at = e->expire_at; /* the count of volatile keys is unchanged */
            else nvolatile--;
        }
        n->next = e->next;
        *slot = n;
        used_memory -= entry_size(e->klen, e->vcap);
        free(e);
    } else {
        n->next = NULL;
        *slot = n;
        nkeys++;
        table_maybe_grow();
    }
    return n;
}

static int delete_key(const char *k, size_t klen, int64_t now) {
    entry **slot = lookup_slot(k, klen, hash_key(k, klen), now);
    if (!*slot) return 0;
    entry_unlink_free(slot);
    return 1;
}

static void flush_all(void) {
    for (uint64_t i = 0; i < nbuckets; i++) {
        entry *e = table[i];
        while (e) {
            entry *next = e->next;
            used_memory -= entry_size(e->klen, e->vcap);
            free(e);
            e = next;
        }
        table[i] = NULL;
    }
    nkeys = nvolatile = 0, expire_cursor = 0;
    entry **t = calloc(1024, sizeof *t);
    if (t) { /* otherwise keep the old (now empty) table */
        used_memory -= nbuckets * sizeof *table;
        free(table);
        used_memory += 1024 * sizeof *t;
        table = t, nbuckets = 1024;
    }
}

/* Deletes expired keys in buckets [from, to). Returns how many. */
static uint64_t purge_expired(uint64_t from, uint64_t to, int64_t now) {
    uint64_t n = 0;
    for (uint64_t i = from; i < to && nvolatile; i++) {
        entry **slot = &table[i];
        while (*slot) {
            if ((*slot)->expire_at && (*slot)->expire_at <= now) {
                entry_unlink_free(slot);
                n++;
            } else {
                slot = &(*slot)->next;
            }
        }
    }
    stat_expired += n;
    return n;
}

/* Active expiry, once per cron tick: a bounded slice of the table. */
static void active_expire(int64_t now) {
    if (!nvolatile) return;
    uint64_t step = 4096;
    if (expire_cursor >= nbuckets) expire_cursor = 0;
    uint64_t end = expire_cursor + step < nbuckets ? expire_cursor + step : nbuckets;
    purge_expired(expire_cursor, end, now);
    expire_cursor = end;
}

/* The order-independent digest over all live keys (docs/workloads.md):
 * sum mod 2^64 over keys of mix64(fnv1a64(le32(klen) || key || value)). */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

static uint64_t digest(int64_t now) {
    uint64_t sum = 0;
    for (uint64_t i = 0; i < nbuckets; i++) {
        for (entry *e = table[i]; e; e = e->next) {
            if (e->expire_at && e->expire_at <= now) continue;
            unsigned char len[4] = {(unsigned char)e->klen, (unsigned char)(e->klen >> 8),
                                    (unsigned char)(e->klen >> 16), (unsigned char)(e->klen >> 24)};
            uint64_t h = fnv1a(0xcbf29ce484222325ULL, len, 4);
            h = fnv1a(h, e->data, e->klen + (size_t)e->vlen);
            sum += mix64(h);
        }
    }
    return sum;
}

/* ---- clients ---------------------------------------------------------- */

typedef struct {
    const char *p;
    size_t n;
} arg;

typedef struct client {
    int fd;
    uint64_t id;
    char *in;
    size_t in_len, in_cap;
    char *out;
    size_t out_pos, out_len, out_cap;
    int64_t stall_since; /* when unsent output last shrank (or appeared) */
    int close_after_reply, close_now, oom, eof;
    char name[64];
    arg *argv;
    size_t argv_cap;
} client;

static client **clients;
static size_t nclients, clients_cap, max_clients = DEFAULT_MAX_CLIENTS;
static uint64_t next_client_id = 1;
static int listen_fd = -1;
static int64_t started_ms;

static int out_reserve(client *c, size_t more) {
    if (c->oom) return -1;
    if (c->out_pos && c->out_pos == c->out_len) c->out_pos = c->out_len = 0;
    if (c->out_len + more <= c->out_cap) return 0;
    if (c->out_pos > c->out_cap / 2) { /* compact before growing */
        memmove(c->out, c->out + c->out_pos, c->out_len - c->out_pos);
        c->out_len -= c->out_pos, c->out_pos = 0;
        if (c->out_len + more <= c->out_cap) return 0;
    }
    size_t cap = c->out_cap ? c->out_cap : 16384;
    while (cap < c->out_len + more) cap *= 2;
    char *p = realloc(c->out, cap);
    if (!p) {
        c->oom = 1; /* cannot even say so: the client is disconnected */
        return -1;
    }
    used_memory += cap - c->out_cap;
    c->out = p, c->out_cap = cap;
    return 0;
}

static void add_raw(client *c, const void *p, size_t n) {
    if (out_reserve(c, n) == 0) {
        memcpy(c->out + c->out_len, p, n);
        c->out_len += n;
    }
}

static void add_str(client *c, const char *s) { add_raw(c, s, strlen(s)); }

static void add_fmt(client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_fmt(client *c, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    add_raw(c, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void add_int(client *c, long long v) { add_fmt(c, ":%lld\r\n", v); }
static void add_ok(client *c) { add_raw(c, "+OK\r\n", 5); }
static void add_nil(client *c) { add_raw(c, "$-1\r\n", 5); }
static void add_array(client *c, long long n) { add_fmt(c, "*%lld\r\n", n); }
static void add_err(client *c, const char *msg) { add_fmt(c, "-%s\r\n", msg); }

static void add_bulk(client *c, const char *p, size_t n) {
    add_fmt(c, "$%zu\r\n", n);
    add_raw(c, p, n);
    add_raw(c, "\r\n", 2);
}

static void add_bulk_str(client *c, const char *s) { add_bulk(c, s, strlen(s)); }

static void client_free(client *c) {
    close(c->fd);
    used_memory -= c->in_cap + c->out_cap;
    free(c->in);
    free(c->out);
    free(c->argv);
    free(c);
}

/* ---- argument helpers --------------------------------------------------- */

static int arg_is(const arg *a, const char *s) {
    size_t n = strlen(s);
    return a->n == n && strncasecmp(a->p, s, n) == 0;
}

/* Parses a whole argument as a signed 64-bit decimal, like Redis: no spaces,
 * no '+', no leading zeros. */
static int parse_ll(const char *p, size_t n, long long *out) {
    if (n == 0 || n > 20) return -1;
    size_t i = 0;
    int neg = 0;
    if (p[0] == '-') {
        neg = 1, i = 1;
        if (n == 1) return -1;
    }
    if (p[i] == '0' && n > i + 1) return -1;
    if (neg && p[i] == '0') return -1;
    unsigned long long v = 0;
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        unsigned d = (unsigned)(p[i] - '0');
        if (v > (ULLONG_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    if (neg) {
        if (v > (unsigned long long)LLONG_MAX + 1) return -1;
        *out = v == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)v;
    } else {
        if (v > (unsigned long long)LLONG_MAX) return -1;
        *out = (long long)v;
    }
    return 0;
}

static void err_args(client *c, const char *cmd) {
    add_fmt(c, "-ERR wrong number of arguments for '%s' command\r\n", cmd);
}

#define ERR_NOT_INT "ERR value is not an integer or out of range"
#define ERR_OOM "ERR out of memory"
#define ERR_SYNTAX "ERR syntax error"

/* ---- commands --------------------------------------------------------- */

static void cmd_set(client *c, arg *av, size_t ac, int64_t now) {
    int nx = 0, xx = 0, keep = 0, get = 0;
    int64_t at = 0;
    for (size_t i = 3; i < ac; i++) {
        arg *a = &av[i];
        if (arg_is(a, "NX") && !xx) nx = 1;
        else if (arg_is(a, "XX") && !nx) xx = 1;
        else if (arg_is(a, "KEEPTTL") && !at) keep = 1;
        else if (arg_is(a, "GET")) get = 1;
        else if ((arg_is(a, "EX") || arg_is(a, "PX") || arg_is(a, "EXAT") || arg_is(a, "PXAT")) && !at && !keep &&
                 i + 1 < ac) {
            long long v;
            if (parse_ll(av[i + 1].p, av[i + 1].n, &v) != 0) return add_err(c, ERR_NOT_INT);
            int secs = arg_is(a, "EX") || arg_is(a, "EXAT");
            int abs_unix = arg_is(a, "EXAT") || arg_is(a, "PXAT");
            if (v <= 0 || (secs && v > LLONG_MAX / 1000))
                return add_err(c, "ERR invalid expire time in 'set' command");
            long long ms = secs ? v * 1000 : v;
            if (abs_unix) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                long long unix_ms = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
                ms = ms > unix_ms ? ms - unix_ms : 0;
            }
            if (ms > LLONG_MAX - now) return add_err(c, "ERR invalid expire time in 'set' command");
            at = now + (ms ? ms : 0);
            if (!at) at = 1; /* already expired */
            i++;
        } else {
            return add_err(c, ERR_SYNTAX);
        }
    }
    if (av[1].n > MAX_BULK || av[2].n > MAX_BULK) return add_err(c, "ERR string exceeds maximum allowed size");
    entry *old = lookup(av[1].p, av[1].n, now);
    if (get) {
        if (old) add_bulk(c, old->data + old->klen, old->vlen);
        else add_nil(c);
    }
    if ((nx && old) || (xx && !old)) {
        if (!get) add_nil(c);
        return;
    }
    entry *e = store(av[1].p, av[1].n, av[2].p, av[2].n, now, keep);
    if (!e) {
        if (get) c->close_after_reply = 1; /* the GET half was already answered */
        return add_err(c, ERR_OOM);
    }
    if (at) set_expire(e, at);
    if (!get) add_ok(c);
}

static void cmd_incrby(client *c, arg *key, long long by, int64_t now) {
    entry *e = lookup(key->p, key->n, now);
    long long v = 0;
    if (e && parse_ll(e->data + e->klen, e->vlen, &v) != 0) return add_err(c, ERR_NOT_INT);
    if ((by > 0 && v > LLONG_MAX - by) || (by < 0 && v < LLONG_MIN - by))
        return add_err(c, "ERR increment or decrement would overflow");
    v += by;
    char buf[24];
    int n = snprintf(buf, sizeof buf, "%lld", v);
    if (!store(key->p, key->n, buf, (size_t)n, now, 1)) return add_err(c, ERR_OOM);
    add_int(c, v);
}

static void cmd_info(client *c, arg *av, size_t ac) {
    char buf[2048];
    int all = ac < 2 || arg_is(&av[1], "all") || arg_is(&av[1], "everything") || arg_is(&av[1], "default");
    size_t n = 0;
#define SECTION(name) (all || arg_is(&av[1], name))
#define PUT(...) \
    if (n < sizeof buf) n += (size_t)snprintf(buf + n, sizeof buf - n, __VA_ARGS__)
    int64_t now = now_ms();
    if (SECTION("server"))
        PUT("# Server\r\nredis_version:%s\r\nroam_kvserver:1\r\nredis_mode:standalone\r\n"
            "arch_bits:%d\r\nmultiplexing_api:poll\r\nuptime_in_seconds:%lld\r\n\r\n",
            VERSION, (int)(sizeof(void *) * 8), (long long)((now - started_ms) / 1000));
    if (SECTION("clients")) PUT("# Clients\r\nconnected_clients:%zu\r\nmaxclients:%zu\r\n\r\n", nclients, max_clients);
    if (SECTION("memory")) PUT("# Memory\r\nused_memory:%" PRIu64 "\r\n\r\n", used_memory);
    if (SECTION("persistence")) PUT("# Persistence\r\nloading:0\r\naof_enabled:0\r\n\r\n");
    if (SECTION("stats"))
        PUT("# Stats\r\ntotal_connections_received:%" PRIu64 "\r\ntotal_commands_processed:%" PRIu64
            "\r\nrejected_connections:%" PRIu64 "\r\nexpired_keys:%" PRIu64 "\r\n\r\n",
            stat_connections, stat_commands, stat_rejected, stat_expired);
    if (SECTION("keyspace")) {
        PUT("# Keyspace\r\n");
        if (nkeys) PUT("db0:keys=%" PRIu64 ",expires=%" PRIu64 ",avg_ttl=0\r\n", nkeys, nvolatile);
    }
#undef SECTION
#undef PUT
    if (n >= sizeof buf) n = sizeof buf - 1;
    add_bulk(c, buf, n);
}

static const char *const command_names[] = {
    "ping", "echo", "get", "set", "del", "unlink", "exists", "incr", "decr", "incrby", "decrby", "mget",
    "mset", "msetnx", "dbsize", "flushall", "flushdb", "info", "client", "command", "config", "select",
    "quit", "ttl", "pttl", "expire", "pexpire", "persist", "type", "strlen", "append", "roam.digest",
};
#define NCOMMANDS (sizeof command_names / sizeof command_names[0])

static void cmd_command(client *c, arg *av, size_t ac) {
    if (ac == 1 || arg_is(&av[1], "DOCS") || arg_is(&av[1], "INFO")) {
        /* No command docs: redis-cli then uses its built-in help. COMMAND INFO
         * answers nil per name, as for an unknown command. */
        if (ac > 1 && arg_is(&av[1], "INFO")) {
            add_array(c, (long long)(ac - 2));
            for (size_t i = 2; i < ac; i++) add_nil(c);
        } else {
            add_array(c, 0);
        }
    } else if (arg_is(&av[1], "COUNT")) {
        add_int(c, (long long)NCOMMANDS);
    } else if (arg_is(&av[1], "LIST")) {
        add_array(c, (long long)NCOMMANDS);
        for (size_t i = 0; i < NCOMMANDS; i++) add_bulk_str(c, command_names[i]);
    } else {
        add_err(c, "ERR unknown subcommand for 'command': try COMMAND COUNT, COMMAND LIST, COMMAND DOCS");
    }
}

static void cmd_client(client *c, arg *av, size_t ac) {
    if (ac >= 2 && arg_is(&av[1], "SETNAME")) {
        if (ac != 3) return err_args(c, "client|setname");
        for (size_t i = 0; i < av[2].n; i++)
            if (av[2].p[i] <= ' ' || av[2].p[i] > '~')
                return add_err(c, "ERR Client names cannot contain spaces, newlines or special characters.");
        if (av[2].n >= sizeof c->name) return add_err(c, "ERR client name too long (at most 63 bytes)");
        memcpy(c->name, av[2].p, av[2].n);
        c->name[av[2].n] = 0;
        return add_ok(c);
    }
    if (ac == 2 && arg_is(&av[1], "GETNAME")) {
        if (c->name[0]) add_bulk_str(c, c->name);
        else add_nil(c);
        return;
    }
    if (ac == 2 && arg_is(&av[1], "ID")) return add_int(c, (long long)c->id);
    if (ac >= 2 && (arg_is(&av[1], "LIST") || arg_is(&av[1], "INFO"))) {
        char line[160];
        if (arg_is(&av[1], "INFO")) {
            int n = snprintf(line, sizeof line, "id=%" PRIu64 " fd=%d name=%s db=0\n", c->id, c->fd, c->name);
            return add_bulk(c, line, (size_t)n);
        }
        size_t total = 0;
        for (size_t i = 0; i < nclients; i++)
            total += (size_t)snprintf(line, sizeof line, "id=%" PRIu64 " fd=%d name=%s db=0\n", clients[i]->id,
                                      clients[i]->fd, clients[i]->name);
        add_fmt(c, "$%zu\r\n", total);
        for (size_t i = 0; i < nclients; i++) {
            int n = snprintf(line, sizeof line, "id=%" PRIu64 " fd=%d name=%s db=0\n", clients[i]->id,
                             clients[i]->fd, clients[i]->name);
            add_raw(c, line, (size_t)n);
        }
        return add_raw(c, "\r\n", 2);
    }
    if (ac >= 2 && (arg_is(&av[1], "SETINFO") || arg_is(&av[1], "NO-EVICT") || arg_is(&av[1], "NO-TOUCH") ||
                    arg_is(&av[1], "REPLY")))
        return add_ok(c);
    add_err(c, "ERR unknown subcommand for 'client': try CLIENT SETNAME, GETNAME, ID, INFO, LIST");
}

static void cmd_config(client *c, arg *av, size_t ac) {
    if (ac >= 3 && arg_is(&av[1], "GET")) {
        /* No persistence, so the parameters clients probe have these values. */
        static const char *const known[][2] = {
            {"save", ""}, {"appendonly", "no"}, {"databases", "1"}, {"maxmemory", "0"},
        };
        size_t n = 0;
        for (size_t i = 2; i < ac; i++)
            for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
                if (arg_is(&av[i], known[k][0])) n++;
        add_array(c, (long long)(2 * n));
        for (size_t i = 2; i < ac; i++)
            for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
                if (arg_is(&av[i], known[k][0])) add_bulk_str(c, known[k][0]), add_bulk_str(c, known[k][1]);
        return;
    }
    if (ac == 2 && arg_is(&av[1], "RESETSTAT")) {
        stat_commands = stat_connections = stat_rejected = stat_expired = 0;
        return add_ok(c);
    }
    add_err(c, "ERR CONFIG SET and other CONFIG subcommands are not supported (kvserver has no configuration)");
}

static void cmd_expire(client *c, arg *av, size_t ac, int64_t now, int ms) {
    long long v;
    if (ac != 3) return err_args(c, ms ? "pexpire" : "expire");
    if (parse_ll(av[2].p, av[2].n, &v) != 0) return add_err(c, ERR_NOT_INT);
    entry *e = lookup(av[1].p, av[1].n, now);
    if (!e) return add_int(c, 0);
    if (!ms && (v > LLONG_MAX / 1000 || v < LLONG_MIN / 1000))
        return add_err(c, "ERR invalid expire time in 'expire' command");
    long long d = ms ? v : v * 1000;
    if (d <= 0) {
        delete_key(av[1].p, av[1].n, now);
        return add_int(c, 1);
    }
    if (d > LLONG_MAX - now) return add_err(c, "ERR invalid expire time in 'expire' command");
    set_expire(e, now + d);
    add_int(c, 1);
}

/* Runs one parsed command. */
static void dispatch(client *c, arg *av, size_t ac) {
    int64_t now = now_ms();
    arg *a = &av[0];
    stat_commands++;
#define NEED(cond, name) \
    if (!(cond)) return err_args(c, name)
    if (arg_is(a, "GET")) {
        NEED(ac == 2, "get");
        entry *e = lookup(av[1].p, av[1].n, now);
        if (e) add_bulk(c, e->data + e->klen, e->vlen);
        else add_nil(c);
    } else if (arg_is(a, "SET")) {
        NEED(ac >= 3, "set");
        cmd_set(c, av, ac, now);
    } else if (arg_is(a, "PING")) {
        NEED(ac <= 2, "ping");
        if (ac == 2) add_bulk(c, av[1].p, av[1].n);
        else add_raw(c, "+PONG\r\n", 7);
    } else if (arg_is(a, "INCR") || arg_is(a, "DECR")) {
        NEED(ac == 2, arg_is(a, "INCR") ? "incr" : "decr");
        cmd_incrby(c, &av[1], arg_is(a, "INCR") ? 1 : -1, now);
    } else if (arg_is(a, "INCRBY") || arg_is(a, "DECRBY")) {
        int decr = arg_is(a, "DECRBY");
        NEED(ac == 3, decr ? "decrby" : "incrby");
        long long by;
        if (parse_ll(av[2].p, av[2].n, &by) != 0) return add_err(c, ERR_NOT_INT);
        if (decr) {
            if (by == LLONG_MIN) return add_err(c, "ERR decrement would overflow");
            by = -by;
        }
        cmd_incrby(c, &av[1], by, now);
    } else if (arg_is(a, "ECHO")) {
        NEED(ac == 2, "echo");
        add_bulk(c, av[1].p, av[1].n);
    } else if (arg_is(a, "DEL") || arg_is(a, "UNLINK")) {
        NEED(ac >= 2, "del");
        long long n = 0;
        for (size_t i = 1; i < ac; i++) n += delete_key(av[i].p, av[i].n, now);
        add_int(c, n);
    } else if (arg_is(a, "EXISTS")) {
        NEED(ac >= 2, "exists");
        long long n = 0;
        for (size_t i = 1; i < ac; i++) n += lookup(av[i].p, av[i].n, now) != NULL;
        add_int(c, n);
    } else if (arg_is(a, "MGET")) {
        NEED(ac >= 2, "mget");
        add_array(c, (long long)(ac - 1));
        for (size_t i = 1; i < ac; i++) {
            entry *e = lookup(av[i].p, av[i].n, now);
            if (e) add_bulk(c, e->data + e->klen, e->vlen);
            else add_nil(c);
        }
    } else if (arg_is(a, "MSET") || arg_is(a, "MSETNX")) {
        int nx = arg_is(a, "MSETNX");
        NEED(ac >= 3 && ac % 2 == 1, nx ? "msetnx" : "mset");
        if (nx)
            for (size_t i = 1; i < ac; i += 2)
                if (lookup(av[i].p, av[i].n, now)) return add_int(c, 0);
        for (size_t i = 1; i < ac; i += 2)
            if (!store(av[i].p, av[i].n, av[i + 1].p, av[i + 1].n, now, 0))
                /* Keys before this one are set: MSET is not atomic under memory exhaustion. */
                return add_err(c, "ERR out of memory (MSET stopped part-way: the keys before this one were set)");
        if (nx) add_int(c, 1);
        else add_ok(c);
    } else if (arg_is(a, "DBSIZE")) {
        NEED(ac == 1, "dbsize");
        purge_expired(0, nbuckets, now); /* exact: no expired key is counted */
        add_int(c, (long long)nkeys);
    } else if (arg_is(a, "FLUSHALL") || arg_is(a, "FLUSHDB")) {
        NEED(ac <= 2, "flushall");
        if (ac == 2 && !arg_is(&av[1], "SYNC") && !arg_is(&av[1], "ASYNC")) return add_err(c, ERR_SYNTAX);
        flush_all();
        add_ok(c);
    } else if (arg_is(a, "ROAM.DIGEST")) {
        NEED(ac == 1, "roam.digest");
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, digest(now));
        add_bulk(c, hex, 16);
    } else if (arg_is(a, "TTL") || arg_is(a, "PTTL")) {
        int ms = arg_is(a, "PTTL");
        NEED(ac == 2, ms ? "pttl" : "ttl");
        entry *e = lookup(av[1].p, av[1].n, now);
        if (!e) add_int(c, -2);
        else if (!e->expire_at) add_int(c, -1);
        else add_int(c, ms ? e->expire_at - now : (e->expire_at - now + 500) / 1000);
    } else if (arg_is(a, "EXPIRE") || arg_is(a, "PEXPIRE")) {
        cmd_expire(c, av, ac, now, arg_is(a, "PEXPIRE"));
    } else if (arg_is(a, "PERSIST")) {
        NEED(ac == 2, "persist");
        entry *e = lookup(av[1].p, av[1].n, now);
        int had = e && e->expire_at;
        if (had) set_expire(e, 0);
        add_int(c, had);
    } else if (arg_is(a, "TYPE")) {
        NEED(ac == 2, "type");
        add_str(c, lookup(av[1].p, av[1].n, now) ? "+string\r\n" : "+none\r\n");
    } else if (arg_is(a, "STRLEN")) {
        NEED(ac == 2, "strlen");
        entry *e = lookup(av[1].p, av[1].n, now);
        add_int(c, e ? (long long)e->vlen : 0);
    } else if (arg_is(a, "APPEND")) {
        NEED(ac == 3, "append");
        entry *e = lookup(av[1].p, av[1].n, now);
        size_t old = e ? e->vlen : 0;
        if (old + av[2].n > MAX_BULK) return add_err(c, "ERR string exceeds maximum allowed size");
        char *v = malloc(old + av[2].n + 1);
        if (!v) return add_err(c, ERR_OOM);
        if (e) memcpy(v, e->data + e->klen, old);
        memcpy(v + old, av[2].p, av[2].n);
        e = store(av[1].p, av[1].n, v, old + av[2].n, now, 1);
        free(v);
        if (!e) return add_err(c, ERR_OOM);
        add_int(c, (long long)e->vlen);
    } else if (arg_is(a, "INFO")) {
        NEED(ac <= 2, "info");
        cmd_info(c, av, ac);
    } else if (arg_is(a, "CLIENT")) {
        NEED(ac >= 2, "client");
        cmd_client(c, av, ac);
    } else if (arg_is(a, "COMMAND")) {
        cmd_command(c, av, ac);
    } else if (arg_is(a, "CONFIG")) {
        NEED(ac >= 2, "config");
        cmd_config(c, av, ac);
    } else if (arg_is(a, "SELECT")) {
        NEED(ac == 2, "select");
        if (av[1].n == 1 && av[1].p[0] == '0') add_ok(c);
        else add_err(c, "ERR DB index is out of range (kvserver has one database, 0)");
    } else if (arg_is(a, "QUIT")) {
        add_ok(c);
        c->close_after_reply = 1;
    } else {
        char head[128];
        size_t n = a->n < 64 ? a->n : 64, k = 0;
        for (size_t i = 0; i < n; i++) head[k++] = (a->p[i] >= ' ' && a->p[i] <= '~') ? a->p[i] : '?';
        head[k] = 0;
        add_fmt(c, "-ERR unknown command '%s', with args beginning with: ", head);
        for (size_t i = 1; i < ac && i < 4; i++) {
            size_t m = av[i].n < 32 ? av[i].n : 32;
            add_raw(c, "'", 1);
            for (size_t j = 0; j < m; j++) add_raw(c, (av[i].p[j] >= ' ' && av[i].p[j] <= '~') ? &av[i].p[j] : "?", 1);
            add_raw(c, "' ", 2);
        }
        add_raw(c, "\r\n", 2);
    }
#undef NEED
}

/* ---- request parsing ---------------------------------------------------- */

static int argv_push(client *c, size_t *ac, const char *p, size_t n) {
    if (*ac == c->argv_cap) {
        size_t cap = c->argv_cap ? c->argv_cap * 2 : 16;
        arg *a = realloc(c->argv, cap * sizeof *a);
        if (!a) return -1;
        c->argv = a, c->argv_cap = cap;
    }
    c->argv[*ac].p = p, c->argv[(*ac)++].n = n;
    return 0;
}

/* Reads a decimal line "<digits>\r\n" at p (end e). Returns the length of the
 * line including CRLF, 0 if incomplete, -1 if malformed. */
static long read_num_line(const char *p, const char *e, long long *v) {
    const char *nl = memchr(p, '\n', (size_t)(e - p));
    if (!nl) return (e - p) > 32 ? -1 : 0;
    if (nl == p || nl[-1] != '\r') return -1;
    if (parse_ll(p, (size_t)(nl - 1 - p), v) != 0) return -1;
    return (long)(nl + 1 - p);
}

enum parse_result { PARSE_MORE, PARSE_DONE, PARSE_ERROR };

/* Parses one request at c->in[*pos..]. On PARSE_DONE, c->argv/ac hold it and
 * *pos is past it. On PARSE_ERROR, *err says what. */
static enum parse_result parse_request(client *c, size_t *pos, size_t *ac, const char **err) {
    const char *start = c->in + *pos, *end = c->in + c->in_len, *p = start;
    *ac = 0;
    if (*p == '*') {
        long long n;
        long l = read_num_line(p + 1, end, &n);
        if (l == 0) return PARSE_MORE;
        if (l < 0 || n > MAX_ARGS) return *err = "Protocol error: invalid multibulk length", PARSE_ERROR;
        p += 1 + l;
        for (long long i = 0; i < n; i++) {
            if (p >= end) return PARSE_MORE;
            if (*p != '$') return *err = "Protocol error: expected '$'", PARSE_ERROR;
            long long len;
            l = read_num_line(p + 1, end, &len);
            if (l == 0) return PARSE_MORE;
            if (l < 0 || len < 0 || len > (long long)MAX_BULK)
                return *err = "Protocol error: invalid bulk length", PARSE_ERROR;
            p += 1 + l;
            if ((size_t)(end - p) < (size_t)len + 2) return PARSE_MORE;
            if (p[len] != '\r' || p[len + 1] != '\n') return *err = "Protocol error: bulk not followed by CRLF", PARSE_ERROR;
            if (argv_push(c, ac, p, (size_t)len) != 0) return *err = "ERR out of memory", PARSE_ERROR;
            p += len + 2;
        }
        *pos += (size_t)(p - start);
        return PARSE_DONE;
    }
    /* Inline: one line of space-separated words (no quoting). */
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) return (end - p) > (long)MAX_INLINE ? (*err = "Protocol error: too big inline request", PARSE_ERROR) : PARSE_MORE;
    const char *le = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
    while (p < le) {
        while (p < le && (*p == ' ' || *p == '\t')) p++;
        const char *w = p;
        while (p < le && *p != ' ' && *p != '\t') p++;
        if (p > w && argv_push(c, ac, w, (size_t)(p - w)) != 0) return *err = "ERR out of memory", PARSE_ERROR;
    }
    *pos += (size_t)(nl + 1 - start);
    return PARSE_DONE;
}

static size_t out_pending(const client *c) { return c->out_len - c->out_pos; }

/* Runs the complete requests in c's input buffer, while its output stays
 * under OUT_SOFT. */
static void process_input(client *c) {
    size_t pos = 0;
    while (pos < c->in_len && !c->close_after_reply && !c->close_now && out_pending(c) < OUT_SOFT) {
        size_t ac;
        const char *err = NULL;
        enum parse_result r = parse_request(c, &pos, &ac, &err);
        if (r == PARSE_MORE) {
            if (c->in_len - pos > MAX_QUERY) {
                add_err(c, "ERR Protocol error: request larger than the 128 MiB query limit");
                c->close_after_reply = 1;
            }
            break;
        }
        if (r == PARSE_ERROR) {
            add_fmt(c, "-ERR %s\r\n", err);
            c->close_after_reply = 1;
            break;
        }
        if (ac > 0) dispatch(c, c->argv, ac);
        if (c->oom) {
            c->close_now = 1;
            break;
        }
    }
    if (pos) {
        memmove(c->in, c->in + pos, c->in_len - pos);
        c->in_len -= pos;
    }
}

static void client_write(client *c, int64_t now) {
    while (out_pending(c)) {
        ssize_t n = send(c->fd, c->out + c->out_pos, out_pending(c), MSG_NOSIGNAL);
        if (n > 0) {
            c->out_pos += (size_t)n;
            c->stall_since = now;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n < 0 && errno == EINTR) continue;
        c->close_now = 1;
        return;
    }
    if (!out_pending(c)) {
        c->out_pos = c->out_len = 0;
        if (c->close_after_reply) c->close_now = 1;
        /* Give back a large output buffer once it is empty. */
        if (c->out_cap > (1u << 20)) {
            used_memory -= c->out_cap;
            free(c->out);
            c->out = NULL, c->out_cap = 0;
        }
    }
}

static void client_read(client *c) {
    if (c->in_cap - c->in_len < READ_CHUNK) {
        size_t cap = c->in_cap ? c->in_cap : READ_CHUNK;
        while (cap - c->in_len < READ_CHUNK) cap *= 2;
        char *p = realloc(c->in, cap);
        if (!p) { /* cannot read more: drop the client rather than the server */
            add_err(c, ERR_OOM);
            c->close_after_reply = 1;
            return;
        }
        used_memory += cap - c->in_cap;
        c->in = p, c->in_cap = cap;
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n > 0) {
        c->in_len += (size_t)n;
    } else if (n == 0) {
        c->eof = 1; /* answer what was sent before the half-close, then close */
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        c->close_now = 1;
    }
}

static int set_nonblocking(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        fprintf(stderr, "kvserver: warning: cannot make fd %d non-blocking: %s\n", fd, strerror(errno));
        return -1;
    }
    return 0;
}

static int listener_nonblocking;

static void accept_clients(int64_t now) {
    /* A blocking listener (fcntl refused) gets one accept per readiness. */
    for (int once = 0; !once; once = !listener_nonblocking) {
        int fd = accept(listen_fd, NULL, NULL);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                fprintf(stderr, "kvserver: accept: %s\n", strerror(errno));
            return;
        }
        stat_connections++;
        set_nonblocking(fd);
        client *c = NULL;
        if (nclients < max_clients) {
            if (nclients == clients_cap) {
                size_t cap = clients_cap ? clients_cap * 2 : 64;
                client **cs = realloc(clients, cap * sizeof *cs);
                if (cs) clients = cs, clients_cap = cap;
            }
            if (nclients < clients_cap) c = calloc(1, sizeof *c);
        }
        if (!c) {
            static const char msg[] = "-ERR max number of clients reached\r\n";
            (void)!send(fd, msg, sizeof msg - 1, MSG_NOSIGNAL);
            close(fd);
            stat_rejected++;
            continue;
        }
        c->fd = fd;
        c->id = next_client_id++;
        c->stall_since = now;
        clients[nclients++] = c;
    }
}

/* ---- startup ---------------------------------------------------------- */

#ifdef __wasi__
/* Inherited fds: stdio, the preopened directories, then the listeners. */
static int find_listener(void) {
    for (int fd = 3; fd < 4096; fd++) {
        __wasi_fdstat_t st;
        __wasi_errno_t e = __wasi_fd_fdstat_get((__wasi_fd_t)fd, &st);
        if (e == __WASI_ERRNO_BADF) break;
        if (e == 0 && st.fs_filetype == __WASI_FILETYPE_SOCKET_STREAM) return fd;
    }
    return -1;
}
#else
/* Numeric addresses only ("127.0.0.1:6379", "[::1]:6379", "6379"; "localhost"
 * means 127.0.0.1): no resolver, so static cross builds need no NSS. */
static int bind_listener(const char *spec) {
    char host[64];
    const char *colon = strrchr(spec, ':');
    const char *port_s = colon ? colon + 1 : spec;
    size_t hl = colon ? (size_t)(colon - spec) : 0;
    long long port;
    if (hl >= sizeof host || parse_ll(port_s, strlen(port_s), &port) != 0 || port < 0 || port > 65535) {
        fprintf(stderr, "kvserver: bad --listen '%s': expected [HOST:]PORT with a numeric HOST\n", spec);
        return -1;
    }
    memcpy(host, spec, hl);
    host[hl] = 0;
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') memmove(host, host + 1, hl - 2), host[hl - 2] = 0;
    if (!hl || strcmp(host, "localhost") == 0) strcpy(host, "127.0.0.1");
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET, v4->sin_port = htons((uint16_t)port), sl = sizeof *v4;
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6, v6->sin6_port = htons((uint16_t)port), sl = sizeof *v6;
    } else {
        fprintf(stderr, "kvserver: bad --listen '%s': '%s' is not a numeric IPv4 or IPv6 address\n", spec, host);
        return -1;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM, 0), one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 511) != 0) {
        fprintf(stderr, "kvserver: cannot listen on %s: %s\n", spec, strerror(errno));
        return -1;
    }
    return fd;
}
#endif

static void usage(void) {
    fprintf(stderr,
            "usage: kvserver [--listen [HOST:]PORT] [--max-clients N]\n"
            "  --listen       native builds only: address to bind (default 127.0.0.1:6379);\n"
            "                 under WASI the listening socket is inherited (roam run --listen ADDR)\n"
            "  --max-clients  connections served at once (default %d)\n",
            DEFAULT_MAX_CLIENTS);
    exit(2);
}

int main(int argc, char **argv) {
    const char *listen_spec = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
            listen_spec = argv[++i];
        } else if (strcmp(argv[i], "--max-clients") == 0 && i + 1 < argc) {
            long long v;
            if (parse_ll(argv[i + 1], strlen(argv[i + 1]), &v) != 0 || v < 1 || v > 1000000) usage();
            max_clients = (size_t)v, i++;
        } else {
            usage();
        }
    }
#ifdef __wasi__
    if (listen_spec) {
        fprintf(stderr, "kvserver: --listen is for native builds; under roam give the address to "
                        "'roam run --listen ADDR' and the program inherits the socket\n");
        return 2;
    }
    listen_fd = find_listener();
    if (listen_fd < 0) {
        fprintf(stderr, "kvserver: no listening socket among the inherited fds: run it with "
                        "'roam run --listen HOST:PORT' or behind a gateway with 'roam launch --service NAME'\n");
        return 1;
    }
    fprintf(stderr, "kvserver: serving on inherited fd %d\n", listen_fd);
#else
    signal(SIGPIPE, SIG_IGN);
    listen_fd = bind_listener(listen_spec ? listen_spec : "127.0.0.1:6379");
    if (listen_fd < 0) return 1;
    fprintf(stderr, "kvserver: listening on %s\n", listen_spec ? listen_spec : "127.0.0.1:6379");
#endif
    listener_nonblocking = set_nonblocking(listen_fd) == 0;

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    hash_seed = mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)(uintptr_t)&ts);
    if (table_init(1024) != 0) {
        fprintf(stderr, "kvserver: out of memory at start\n");
        return 1;
    }
    started_ms = now_ms();
    int64_t last_cron = started_ms;

    struct pollfd *pfds = NULL;
    size_t pfds_cap = 0;
    for (;;) {
        if (nclients + 1 > pfds_cap) {
            size_t cap = (nclients + 1) * 2;
            struct pollfd *p = realloc(pfds, cap * sizeof *p);
            if (!p) {
                fprintf(stderr, "kvserver: out of memory for the poll set\n");
                return 1;
            }
            pfds = p, pfds_cap = cap;
        }
        pfds[0].fd = listen_fd, pfds[0].events = POLLIN, pfds[0].revents = 0;
        int any_pending = 0;
        for (size_t i = 0; i < nclients; i++) {
            client *c = clients[i];
            pfds[i + 1].fd = c->fd, pfds[i + 1].revents = 0;
            pfds[i + 1].events = 0;
            if (out_pending(c) < OUT_SOFT && !c->close_after_reply && !c->eof) pfds[i + 1].events |= POLLIN;
            if (out_pending(c)) pfds[i + 1].events |= POLLOUT, any_pending = 1;
        }
        int timeout = nvolatile ? CRON_MS : any_pending ? 1000 : -1;
        int rc = poll(pfds, nclients + 1, timeout);
        if (rc < 0 && errno != EINTR) {
            fprintf(stderr, "kvserver: poll: %s\n", strerror(errno));
            return 1;
        }
        int64_t now = now_ms();
        size_t served = nclients; /* clients accepted below are polled next round */
        for (size_t i = 0; rc > 0 && i < served; i++) {
            client *c = clients[i];
            short re = pfds[i + 1].revents;
            if (re & (POLLIN | POLLHUP | POLLERR)) client_read(c);
            if (!c->close_now) process_input(c);
            if (!c->close_now && (out_pending(c) || (re & POLLOUT))) client_write(c, now);
            /* Output drained below the soft limit: commands left waiting in
             * the input buffer run now (they may not get another POLLIN). */
            if (!c->close_now && c->in_len && out_pending(c) < OUT_SOFT) {
                process_input(c);
                client_write(c, now);
            }
            if (c->eof && !out_pending(c)) c->close_now = 1;
        }
        if (rc > 0 && (pfds[0].revents & POLLIN)) accept_clients(now);
        /* Disconnect rule, then drop closed clients (keeping the order). */
        size_t k = 0;
        for (size_t i = 0; i < nclients; i++) {
            client *c = clients[i];
            if (!out_pending(c)) c->stall_since = now;
            if (out_pending(c) > OUT_HARD || now - c->stall_since > STALL_MS) c->close_now = 1;
            if (c->oom) c->close_now = 1;
            if (c->close_now) client_free(c);
            else clients[k++] = c;
        }
        nclients = k;
        if (now - last_cron >= CRON_MS) {
            active_expire(now);
            last_cron = now;
        }
    }
}
