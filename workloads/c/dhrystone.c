/*
 * dhrystone - a synthetic integer benchmark in the style of Dhrystone 2.
 *
 * Each run of the main loop does the same mix of small procedure calls,
 * record copies through pointers, enum switches, fixed-size string copies
 * and comparisons, character tests and 1-D/2-D array updates. Because every
 * run performs identical work, the global state after the last run must equal
 * the state after the first, and the per-run accumulator must have grown by
 * the same amount each run; one array cell counts the runs. Those are the
 * checks (an independent statement of Dhrystone's "expected final values").
 */
#include "common.h"

typedef enum { RED, GREEN, BLUE, CYAN, MAGENTA } hue;

typedef struct rec {
    struct rec *link;
    hue tint;
    int32_t num, val;
    char label[32];
} rec;

typedef struct {
    int32_t g_int, g_flag, a, b, c, a1[50], head_num, head_val, spare_num;
    hue tint, head_tint;
    char c1, c2, label[32], spare_label[32];
} state;

static rec *g_head, *g_spare;
static int32_t g_int, g_flag;
static char g_c1, g_c2, g_label1[32];
static int32_t g_a1[50], g_a2[50][50];

static const char LABEL1[32] = "ROAM SYNTHETIC RECORD, NUMBER 1";
static const char LABEL2[32] = "ROAM SYNTHETIC RECORD, NUMBER 2";
static const char LABEL3[32] = "ROAM SYNTHETIC RECORD, NUMBER 3";

__attribute__((noinline)) static hue shade(hue h, int32_t k) {
    switch (h) {
    case RED: return k > 2 ? BLUE : GREEN;
    case GREEN: return CYAN;
    case BLUE: return (k & 1) ? MAGENTA : RED;
    case CYAN: return BLUE;
    default: return RED;
    }
}

__attribute__((noinline)) static int32_t same_char(char x, char y) {
    if (x != y) return 0;
    g_c1 = x;
    return 1;
}

/* Nonzero when s sorts after t; also disturbs g_int like a side-effecting compare. */
__attribute__((noinline)) static int32_t label_after(const char *s, const char *t) {
    int32_t i = 1;
    char seen = 0;
    while (i < 3) {
        if (!same_char(s[i], t[i + 1])) seen = 'K';
        i++;
    }
    if (seen == 'K') i += 4;
    if (strcmp(s, t) > 0) {
        g_int = i + 1;
        return 1;
    }
    return 0;
}

__attribute__((noinline)) static void set_chars(void) {
    g_flag = g_c1 == 'A';
    g_c1 = 'A';
    g_c2 = 'B';
}

__attribute__((noinline)) static int32_t combine(int32_t x, int32_t y) { return x + y + 2; }

__attribute__((noinline)) static void fill_arrays(int32_t *a1, int32_t (*a2)[50], int32_t x, int32_t y) {
    int32_t at = x + 5;
    a1[at] = y;
    a1[at + 1] = a1[at];
    a1[at + 30] = at;
    for (int32_t i = at; i <= at + 1; i++) a2[at][i] = at;
    a2[at][at - 1] += 1;
    a2[at + 20][at] = a1[at];
    g_int = 5;
}

__attribute__((noinline)) static void bump(int32_t *x) {
    int32_t local = *x + 10;
    if (g_c1 == 'A') {
        local -= 1;
        *x = local - g_int;
    }
}

__attribute__((noinline)) static void refresh(rec *r) {
    rec *next = r->link;
    *next = *g_head;
    r->num = 5;
    next->num = r->num;
    next->link = r->link;
    next->tint = shade(r->tint, next->num);
    if (next->tint == BLUE) {
        next->num = 6;
        next->val = combine(next->num, 10);
        next->link = g_head->link;
    } else {
        *r = *next;
    }
}

static void snapshot(state *s, int32_t a, int32_t b, int32_t c, hue t) {
    memset(s, 0, sizeof *s);
    s->g_int = g_int, s->g_flag = g_flag, s->a = a, s->b = b, s->c = c, s->tint = t;
    memcpy(s->a1, g_a1, sizeof g_a1);
    s->head_num = g_head->num, s->head_val = g_head->val, s->head_tint = g_head->tint;
    s->spare_num = g_spare->num;
    s->c1 = g_c1, s->c2 = g_c2;
    memcpy(s->label, g_label1, 32);
    memcpy(s->spare_label, g_spare->label, 32);
}

int main(int argc, char **argv) {
    enum wl_size size = wl_parse_size(argc, argv, "dhrystone");
    static const int32_t runs_by_size[] = { 500000, 60000000, 450000000 };
    const int32_t runs = runs_by_size[size];
    static rec r1, r2;
    g_head = &r1, g_spare = &r2;
    r1.link = &r2, r1.tint = RED, r1.num = 40, r1.val = 2;
    memcpy(r1.label, LABEL1, 32);
    memcpy(g_label1, LABEL1, 32);
    g_a2[8][7] = 10;
    printf("dhrystone: %d runs\n", (int)runs);

    state first, last;
    uint64_t acc = 0, first_delta = 0;
    int32_t a = 0, b = 0, c = 0;
    hue t = RED;
    char text[32];
    for (int32_t run = 1; run <= runs; run++) {
        uint64_t before = acc;
        set_chars();
        a = 2, b = 3;
        memcpy(text, LABEL2, 32);
        t = BLUE;
        g_flag = !label_after(g_label1, text);
        while (a < b) {
            c = 5 * a - b;
            c = combine(a, c);
            a++;
        }
        fill_arrays(g_a1, g_a2, a, c);
        refresh(g_head);
        for (char ch = 'A'; ch <= g_c2; ch++)
            if (same_char(ch, 'C') == 0 && t != shade(t, 3)) {
                t = shade(t, ch);
                memcpy(text, LABEL3, 32);
                b = c;
            }
        b = b * a;
        a = b / (c + 1);
        b = 7 * (b - a) - c;
        bump(&a);
        memcpy(g_spare->label, text, 32);
        acc += (uint64_t)(uint32_t)(a + b + c + (int32_t)t + g_int + g_flag);
        if (run == 1) {
            first_delta = acc - before;
            snapshot(&first, a, b, c, t);
        }
        if (run == runs / 2) {
            wl_pause();
            printf("dhrystone: %d runs done\n", (int)run);
        }
    }
    snapshot(&last, a, b, c, t);
    if (memcmp(&first, &last, sizeof first) != 0) wl_fail("final state differs from the state after the first run");
    if (acc != first_delta * (uint64_t)runs) wl_fail("accumulator %llu != %d runs x %llu", (unsigned long long)acc, (int)runs, (unsigned long long)first_delta);
    if (g_a2[8][7] != runs + 10) wl_fail("run counter cell is %d, expected %d", (int)g_a2[8][7], (int)(runs + 10));
    printf("dhrystone: g_int %d flag %d chars %c%c a %d b %d c %d tint %d\n", (int)g_int, (int)g_flag, g_c1, g_c2, (int)a, (int)b, (int)c, (int)t);
    printf("dhrystone: head num %d val %d, spare label \"%s\"\n", (int)g_head->num, (int)g_head->val, g_spare->label);

    uint64_t h = wl_hash_u64(WL_FNV_OFFSET, acc);
    h = wl_hash_bytes(h, &last, sizeof last);
    h = wl_hash_u64(h, (uint32_t)g_a2[8][7]);
    return wl_finish(h);
}
