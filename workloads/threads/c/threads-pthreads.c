/* threads-pthreads - the POSIX threads API of wasi-libc, phase by phase.
 *
 * Phase 1 (pthread_create/join, C11 atomics, _Thread_local, pthread_once):
 * the threads take tasks from an atomic counter, so which thread runs which
 * task varies from run to run; each result goes to its own slot, and each
 * thread sums into a thread-local total that it adds to an atomic one
 * at the end (wrapping addition: order does not matter).
 * Phase 2 (pthread_mutex, pthread_cond, pthread_key): the main thread
 * produces items into a bounded ring buffer, the threads consume them; two
 * condition variables (not full, not empty). Each consumer counts its items
 * in thread-specific data whose destructor, run at thread exit, adds the
 * count to a mutex-guarded total.
 * Phase 3 (pthread_barrier): an integer stencil over a ring of words, one
 * band per thread, two barrier waits a step; the barrier's serial thread
 * swaps the buffers and hashes the ring at four checkpoints.
 * Every result is independent of the thread count and of the schedule, and
 * is recomputed on one thread at the end.
 */
#include <pthread.h>
#include <stdatomic.h>
#include "threads_common.h"

#define SEED 0x7074687265616473ull
#define TASKS 4096 /* phase 1; fixed, independent of the thread count */
#define QUEUE 8    /* phase 2 ring buffer capacity: small, so both sides wait */
#define CHECKPOINTS 4

struct params {
    unsigned task_rounds; /* phase 1 work per task */
    unsigned items;       /* phase 2 item count */
    unsigned item_rounds; /* phase 2 work per item */
    unsigned ring;        /* phase 3 words */
    unsigned steps;       /* phase 3 steps, a multiple of CHECKPOINTS */
};

struct result {
    uint64_t task_sum, task_hash;
    uint64_t item_max, item_odd, item_hash;
    uint64_t ring_hash[CHECKPOINTS];
};

static struct params P;
static int nthreads;

/* ---- shared by both phases 1 and 2: a table initialised exactly once ---- */
static uint64_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;
static atomic_uint table_inits;
static void init_table(void)
{
    for (unsigned i = 0; i < 256; i++)
        table[i] = mix64(SEED ^ i);
    atomic_fetch_add(&table_inits, 1);
}

static uint64_t kernel(uint64_t x, unsigned rounds)
{
    x = mix64(x ^ SEED);
    for (unsigned r = 0; r < rounds; r++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        x ^= table[x >> 56] ^ (x >> 29);
    }
    return x;
}

/* ---- phase 1: atomics and thread-local storage ---------------------------- */
static uint64_t task_out[TASKS];
static atomic_uint next_task;
static _Atomic uint64_t task_total;
static atomic_uint tasks_done;
static _Thread_local uint64_t tl_sum;
static _Thread_local unsigned tl_done;

static void *phase1(void *arg)
{
    (void)arg;
    pthread_once(&table_once, init_table);
    for (;;) {
        unsigned t = atomic_fetch_add_explicit(&next_task, 1, memory_order_relaxed);
        if (t >= TASKS)
            break;
        uint64_t y = kernel(t, P.task_rounds);
        task_out[t] = y;
        tl_sum += y;
        tl_done++;
    }
    atomic_fetch_add_explicit(&task_total, tl_sum, memory_order_relaxed);
    atomic_fetch_add_explicit(&tasks_done, tl_done, memory_order_relaxed);
    return NULL;
}

/* ---- phase 2: a bounded queue under a mutex and two condition variables ---- */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t not_full, not_empty;
    unsigned buf[QUEUE];
    unsigned head, len;
    int closed;
} q = { .lock = PTHREAD_MUTEX_INITIALIZER,
        .not_full = PTHREAD_COND_INITIALIZER,
        .not_empty = PTHREAD_COND_INITIALIZER };

static uint64_t *item_out;
static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t item_max, item_odd, consumed_total;
static unsigned counters_freed;
static pthread_key_t count_key;

static void push(unsigned item)
{
    pthread_mutex_lock(&q.lock);
    while (q.len == QUEUE)
        pthread_cond_wait(&q.not_full, &q.lock);
    q.buf[(q.head + q.len++) % QUEUE] = item;
    pthread_cond_signal(&q.not_empty);
    pthread_mutex_unlock(&q.lock);
}

static void close_queue(void)
{
    pthread_mutex_lock(&q.lock);
    q.closed = 1;
    pthread_cond_broadcast(&q.not_empty);
    pthread_mutex_unlock(&q.lock);
}

/* Returns 0 once the queue is closed and drained. */
static int pop(unsigned *item)
{
    pthread_mutex_lock(&q.lock);
    while (q.len == 0 && !q.closed)
        pthread_cond_wait(&q.not_empty, &q.lock);
    int got = q.len > 0;
    if (got) {
        *item = q.buf[q.head];
        q.head = (q.head + 1) % QUEUE;
        q.len--;
        pthread_cond_signal(&q.not_full);
    }
    pthread_mutex_unlock(&q.lock);
    return got;
}

/* pthread_key destructor: runs at thread exit with the thread's counter. */
static void count_done(void *p)
{
    pthread_mutex_lock(&stats_lock);
    consumed_total += *(uint64_t *)p;
    counters_freed++;
    pthread_mutex_unlock(&stats_lock);
    free(p);
}

static void *phase2(void *arg)
{
    (void)arg;
    pthread_once(&table_once, init_table);
    uint64_t *count = calloc(1, sizeof *count);
    need(count != NULL, "calloc");
    need(pthread_setspecific(count_key, count) == 0, "pthread_setspecific");
    unsigned i;
    while (pop(&i)) {
        uint64_t y = kernel(mix64(i) + 0x51, P.item_rounds);
        item_out[i] = y;
        ((uint64_t *)pthread_getspecific(count_key))[0]++;
        pthread_mutex_lock(&stats_lock);
        if (y > item_max)
            item_max = y;
        item_odd += y & 1;
        pthread_mutex_unlock(&stats_lock);
    }
    return NULL;
}

/* ---- phase 3: a barrier-synchronised stencil -------------------------------- */
static uint64_t *ring_a, *ring_b;
static pthread_barrier_t barrier;
static uint64_t ring_hash[CHECKPOINTS];

static uint64_t rotl(uint64_t x, unsigned k) { return x << k | x >> (64 - k); }

/* One step over words [lo, hi) of the ring `cur` into `nxt`. */
static void stencil(const uint64_t *cur, uint64_t *nxt, unsigned lo, unsigned hi, unsigned step)
{
    unsigned n = P.ring;
    for (unsigned i = lo; i < hi; i++) {
        uint64_t l = cur[(i + n - 1) % n], c = cur[i], r = cur[(i + 1) % n];
        nxt[i] = mix64((l ^ rotl(c, 7)) + r * 3 + step);
    }
}

static uint64_t hash_words(const uint64_t *v, unsigned n)
{
    uint64_t h = HASH_INIT;
    for (unsigned i = 0; i < n; i++)
        h = hash_add(h, v[i]);
    return h;
}

static void *phase3(void *arg)
{
    unsigned t = (unsigned)(uintptr_t)arg, n = P.ring;
    unsigned lo = (unsigned)((uint64_t)n * t / nthreads), hi = (unsigned)((uint64_t)n * (t + 1) / nthreads);
    for (unsigned s = 0; s < P.steps; s++) {
        /* ring_a/ring_b are only swapped between the two waits. */
        stencil(ring_a, ring_b, lo, hi, s);
        int rc = pthread_barrier_wait(&barrier);
        if (rc == PTHREAD_BARRIER_SERIAL_THREAD) {
            uint64_t *tmp = ring_a;
            ring_a = ring_b;
            ring_b = tmp;
            if ((s + 1) % (P.steps / CHECKPOINTS) == 0)
                ring_hash[(s + 1) / (P.steps / CHECKPOINTS) - 1] = hash_words(ring_a, n);
        } else {
            need(rc == 0, "pthread_barrier_wait");
        }
        pthread_barrier_wait(&barrier);
    }
    return NULL;
}

static void ring_init(uint64_t *v)
{
    for (unsigned i = 0; i < P.ring; i++)
        v[i] = mix64(SEED + i);
}

/* ---- the two runs ------------------------------------------------------------ */
static void run_all(void *(*fn)(void *), pthread_t *th)
{
    for (int t = 0; t < nthreads; t++)
        need(pthread_create(&th[t], NULL, fn, (void *)(uintptr_t)t) == 0, "pthread_create");
}

static void join_all(pthread_t *th)
{
    for (int t = 0; t < nthreads; t++)
        need(pthread_join(th[t], NULL) == 0, "pthread_join");
}

static int parallel(struct result *r)
{
    pthread_t th[8];
    int ok = 1;

    run_all(phase1, th);
    join_all(th);
    uint64_t h = HASH_INIT;
    for (unsigned t = 0; t < TASKS; t++)
        h = hash_add(h, task_out[t]);
    r->task_sum = atomic_load(&task_total);
    r->task_hash = h;
    /* The main thread's thread-locals are its own: untouched by the workers. */
    ok &= atomic_load(&tasks_done) == TASKS && tl_sum == 0 && tl_done == 0;

    item_out = calloc(P.items, sizeof *item_out);
    need(item_out != NULL, "calloc");
    need(pthread_key_create(&count_key, count_done) == 0, "pthread_key_create");
    run_all(phase2, th);
    for (unsigned i = 0; i < P.items; i++)
        push(i);
    close_queue();
    join_all(th);
    h = HASH_INIT;
    for (unsigned i = 0; i < P.items; i++)
        h = hash_add(h, item_out[i]);
    r->item_max = item_max;
    r->item_odd = item_odd;
    r->item_hash = h;
    /* Every consumer's destructor ran, and together they counted every item. */
    ok &= consumed_total == P.items && counters_freed == (unsigned)nthreads;
    pthread_key_delete(count_key);
    free(item_out);

    ring_a = malloc(P.ring * sizeof *ring_a);
    ring_b = malloc(P.ring * sizeof *ring_b);
    need(ring_a && ring_b, "malloc");
    ring_init(ring_a);
    need(pthread_barrier_init(&barrier, NULL, (unsigned)nthreads) == 0, "pthread_barrier_init");
    run_all(phase3, th);
    join_all(th);
    pthread_barrier_destroy(&barrier);
    memcpy(r->ring_hash, ring_hash, sizeof ring_hash);
    free(ring_a);
    free(ring_b);

    ok &= atomic_load(&table_inits) == 1;
    return ok;
}

static void sequential(struct result *r)
{
    uint64_t h = HASH_INIT;
    r->task_sum = 0;
    for (unsigned t = 0; t < TASKS; t++) {
        uint64_t y = kernel(t, P.task_rounds);
        r->task_sum += y;
        h = hash_add(h, y);
    }
    r->task_hash = h;

    r->item_max = r->item_odd = 0;
    h = HASH_INIT;
    for (unsigned i = 0; i < P.items; i++) {
        uint64_t y = kernel(mix64(i) + 0x51, P.item_rounds);
        if (y > r->item_max)
            r->item_max = y;
        r->item_odd += y & 1;
        h = hash_add(h, y);
    }
    r->item_hash = h;

    uint64_t *a = malloc(P.ring * sizeof *a), *b = malloc(P.ring * sizeof *b);
    need(a && b, "malloc");
    ring_init(a);
    for (unsigned s = 0; s < P.steps; s++) {
        stencil(a, b, 0, P.ring, s);
        uint64_t *tmp = a;
        a = b;
        b = tmp;
        if ((s + 1) % (P.steps / CHECKPOINTS) == 0)
            r->ring_hash[(s + 1) / (P.steps / CHECKPOINTS) - 1] = hash_words(a, P.ring);
    }
    free(a);
    free(b);
}

int main(int argc, char **argv)
{
    struct args a = parse_args("threads-pthreads", argc, argv);
    nthreads = a.threads;
    P = a.size == SIZE_S ? (struct params){ 1000, 4096, 1000, 4096, 800 }
                         : (struct params){ 8000, 32768, 3000, 16384, 2400 };
    printf("threads-pthreads: tasks=%u rounds=%u items=%u rounds=%u ring=%u steps=%u\n", TASKS,
           P.task_rounds, P.items, P.item_rounds, P.ring, P.steps);

    struct result p, s;
    int ok = parallel(&p);
    printf("tasks sum: %016llx\n", (unsigned long long)p.task_sum);
    printf("tasks hash: %016llx\n", (unsigned long long)p.task_hash);
    printf("items max: %016llx\n", (unsigned long long)p.item_max);
    printf("items odd: %llu\n", (unsigned long long)p.item_odd);
    printf("items hash: %016llx\n", (unsigned long long)p.item_hash);
    for (int c = 0; c < CHECKPOINTS; c++)
        printf("ring step %u: %016llx\n", (c + 1) * (P.steps / CHECKPOINTS),
               (unsigned long long)p.ring_hash[c]);

    sequential(&s);
    if (!ok)
        fprintf(stderr, "threads-pthreads: a per-thread count or the once-init is wrong\n");
    if (memcmp(&p, &s, sizeof p) != 0) {
        fprintf(stderr, "threads-pthreads: the sequential result differs\n");
        ok = 0;
    }
    return finish(ok);
}
