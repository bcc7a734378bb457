/*
 * interp - a small bytecode interpreter running a script, the shape of the
 * programs users bring that hurt migration instrumentation most: a compiler
 * from source text to bytecode, one large `switch` dispatch loop, natives
 * called through a function-pointer table (indirect calls), and a native
 * (`map`) that calls back into the interpreter, so the dispatch loop recurses
 * through an indirect call, as a JavaScript engine's `Array.prototype.map`
 * does.
 *
 * The language: 64-bit integers and arrays; `fn`, `var`, `if`/`else`,
 * `while`, `return`; operators + - * / % & | ^ << >> == != < <= > >= and
 * unary - !. Function-level locals, top-level globals, functions are values.
 *
 * Checks: the script's results are recomputed in C (fibonacci, prime count,
 * sortedness and sum of the sorted array, the mapped sum) and compared; the
 * checksum hashes every round's result.
 */
#include "common.h"

/* ---- values and heap ---------------------------------------------------- */

enum { T_NIL, T_INT, T_ARR, T_FN, T_NATIVE };

typedef struct {
    int32_t tag;
    int64_t v;
} value;

typedef struct {
    int64_t len, cap;
    value *items;
} array;

#define MAX_ARRAYS 4096
static array g_arrays[MAX_ARRAYS];
static int g_narrays;

static void die(const char *what) {
    fprintf(stderr, "interp: %s\n", what);
    exit(1);
}

static value mk_int(int64_t i) { value v = { T_INT, i }; return v; }

static value new_array(int64_t n) {
    if (g_narrays == MAX_ARRAYS) die("too many arrays");
    if (n < 0 || n > (1 << 24)) die("bad array length");
    array *a = &g_arrays[g_narrays];
    a->len = n;
    a->cap = n > 4 ? n : 4;
    a->items = calloc((size_t)a->cap, sizeof(value));
    if (!a->items) die("out of memory");
    for (int64_t i = 0; i < n; i++) a->items[i] = mk_int(0);
    value v = { T_ARR, g_narrays++ };
    return v;
}

static array *as_array(value v) {
    if (v.tag != T_ARR) die("not an array");
    return &g_arrays[v.v];
}

static int64_t as_int(value v) {
    if (v.tag != T_INT) die("not an integer");
    return v.v;
}

/* ---- bytecode ----------------------------------------------------------- */

enum op {
    OP_CONST, OP_NIL, OP_GET_LOCAL, OP_SET_LOCAL, OP_GET_GLOBAL, OP_SET_GLOBAL,
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MOD, OP_BAND, OP_BOR, OP_BXOR, OP_SHL, OP_SHR,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_NEG, OP_NOT,
    OP_JUMP, OP_JUMP_IF_FALSE, OP_LOOP, OP_CALL, OP_RET, OP_POP,
    OP_INDEX, OP_SET_INDEX, OP_NATIVE,
};

typedef struct {
    uint8_t *code;
    int len, cap;
    int64_t *consts;
    int nconsts, cconsts;
    int arity, nlocals;
    char name[32];
} function;

#define MAX_FUNCS 64
static function g_funcs[MAX_FUNCS];
static int g_nfuncs;

static void emit(function *f, int byte) {
    if (f->len == f->cap) {
        f->cap = f->cap ? f->cap * 2 : 256;
        f->code = realloc(f->code, (size_t)f->cap);
        if (!f->code) die("out of memory");
    }
    f->code[f->len++] = (uint8_t)byte;
}

static void emit16(function *f, int op, int arg) {
    if (arg < 0 || arg > 0xffff) die("operand out of range");
    emit(f, op);
    emit(f, arg & 0xff);
    emit(f, arg >> 8);
}

static int add_const(function *f, int64_t c) {
    if (f->nconsts == f->cconsts) {
        f->cconsts = f->cconsts ? f->cconsts * 2 : 16;
        f->consts = realloc(f->consts, sizeof(int64_t) * (size_t)f->cconsts);
        if (!f->consts) die("out of memory");
    }
    f->consts[f->nconsts] = c;
    return f->nconsts++;
}

/* ---- the virtual machine ------------------------------------------------ */

#define STACK_MAX 16384
#define FRAMES_MAX 1024
#define MAX_GLOBALS 128

typedef struct {
    function *fn;
    const uint8_t *ip;
    value *slots;
} frame;

typedef value (*native_fn)(value *args, int argc);

static value g_stack[STACK_MAX], *g_sp = g_stack;
static frame g_frames[FRAMES_MAX];
static int g_depth;
static value g_globals[MAX_GLOBALS];
static char g_global_names[MAX_GLOBALS][32];
static int g_nglobals;
static uint64_t g_steps;

static value run(int base);

/* Calls a script function value from C: the re-entrant path of `map`. */
static value call_value(value fnv, value *args, int argc) {
    if (fnv.tag != T_FN) die("calling a non-function");
    function *fn = &g_funcs[fnv.v];
    if (argc != fn->arity) die("wrong number of arguments");
    if (g_depth == FRAMES_MAX || g_sp + fn->nlocals + 1 >= g_stack + STACK_MAX) die("stack overflow");
    value *slots = g_sp;
    for (int i = 0; i < argc; i++) *g_sp++ = args[i];
    for (int i = argc; i < fn->nlocals; i++) *g_sp++ = mk_int(0);
    g_frames[g_depth++] = (frame){ fn, fn->code, slots };
    return run(g_depth - 1);
}

#define BINARY(expr)                    \
    do {                                \
        int64_t b = as_int(*--sp);      \
        int64_t a = as_int(sp[-1]);     \
        sp[-1] = mk_int(expr);          \
    } while (0)
#define READ16() (ip += 2, (int)(ip[-2] | (ip[-1] << 8)))

/* The dispatch loop: runs until the frame at depth `base` returns. */
static value run(int base) {
    frame *f = &g_frames[g_depth - 1];
    const uint8_t *ip = f->ip;
    value *sp = g_sp;
    for (;;) {
        g_steps++;
        switch ((enum op)*ip++) {
        case OP_CONST: *sp++ = mk_int(f->fn->consts[READ16()]); break;
        case OP_NIL: *sp++ = (value){ T_NIL, 0 }; break;
        case OP_GET_LOCAL: *sp++ = f->slots[READ16()]; break;
        case OP_SET_LOCAL: f->slots[READ16()] = *--sp; break;
        case OP_GET_GLOBAL: *sp++ = g_globals[READ16()]; break;
        case OP_SET_GLOBAL: g_globals[READ16()] = *--sp; break;
        case OP_ADD: BINARY((int64_t)((uint64_t)a + (uint64_t)b)); break;
        case OP_SUB: BINARY((int64_t)((uint64_t)a - (uint64_t)b)); break;
        case OP_MUL: BINARY((int64_t)((uint64_t)a * (uint64_t)b)); break;
        case OP_DIV: BINARY(b == 0 || (a == INT64_MIN && b == -1) ? 0 : a / b); break;
        case OP_MOD: BINARY(b == 0 || (a == INT64_MIN && b == -1) ? 0 : a % b); break;
        case OP_BAND: BINARY(a & b); break;
        case OP_BOR: BINARY(a | b); break;
        case OP_BXOR: BINARY(a ^ b); break;
        case OP_SHL: BINARY((int64_t)((uint64_t)a << (b & 63))); break;
        case OP_SHR: BINARY((int64_t)((uint64_t)a >> (b & 63))); break;
        case OP_EQ: BINARY(a == b); break;
        case OP_NE: BINARY(a != b); break;
        case OP_LT: BINARY(a < b); break;
        case OP_LE: BINARY(a <= b); break;
        case OP_GT: BINARY(a > b); break;
        case OP_GE: BINARY(a >= b); break;
        case OP_NEG: sp[-1] = mk_int((int64_t)(0 - (uint64_t)as_int(sp[-1]))); break;
        case OP_NOT: sp[-1] = mk_int(as_int(sp[-1]) == 0); break;
        case OP_JUMP: { int off = READ16(); ip += off; break; }
        case OP_JUMP_IF_FALSE: {
            int off = READ16();
            if (as_int(*--sp) == 0) ip += off;
            break;
        }
        case OP_LOOP: { int off = READ16(); ip -= off; break; }
        case OP_CALL: {
            int argc = *ip++;
            value callee = sp[-1 - argc];
            if (callee.tag != T_FN) die("calling a non-function");
            function *fn = &g_funcs[callee.v];
            if (argc != fn->arity) die("wrong number of arguments");
            if (g_depth == FRAMES_MAX || sp + fn->nlocals >= g_stack + STACK_MAX) die("stack overflow");
            value *slots = sp - argc;
            /* The callee slot below the arguments is overwritten on return. */
            for (int i = argc; i < fn->nlocals; i++) *sp++ = mk_int(0);
            f->ip = ip;
            f = &g_frames[g_depth++];
            *f = (frame){ fn, fn->code, slots };
            ip = fn->code;
            break;
        }
        case OP_RET: {
            value result = *--sp;
            int callee_slot = g_depth - 1 > base;
            sp = f->slots - callee_slot;
            g_depth--;
            if (g_depth == base) {
                g_sp = sp;
                return result;
            }
            *sp++ = result;
            f = &g_frames[g_depth - 1];
            ip = f->ip;
            break;
        }
        case OP_POP: sp--; break;
        case OP_INDEX: {
            int64_t i = as_int(*--sp);
            array *a = as_array(sp[-1]);
            if (i < 0 || i >= a->len) die("index out of range");
            sp[-1] = a->items[i];
            break;
        }
        case OP_SET_INDEX: {
            value v = *--sp;
            int64_t i = as_int(*--sp);
            array *a = as_array(*--sp);
            if (i < 0 || i >= a->len) die("index out of range");
            a->items[i] = v;
            break;
        }
        case OP_NATIVE: {
            value nv = g_globals[READ16()];
            if (nv.tag != T_NATIVE) die("calling a non-native as a native");
            native_fn fn = (native_fn)(uintptr_t)nv.v;
            int argc = *ip++;
            f->ip = ip;
            g_sp = sp;
            value r = fn(sp - argc, argc); /* an indirect call */
            sp = g_sp - argc;
            *sp++ = r;
            break;
        }
        default: die("bad opcode");
        }
    }
}

/* ---- natives ------------------------------------------------------------ */

static void want(int argc, int n) { if (argc != n) die("wrong number of native arguments"); }

static value nat_array(value *a, int n) { want(n, 1); return new_array(as_int(a[0])); }
static value nat_len(value *a, int n) { want(n, 1); return mk_int(as_array(a[0])->len); }
static value nat_pause(value *a, int n) { (void)a; want(n, 0); wl_pause(); return mk_int(0); }
static value nat_mix(value *a, int n) {
    want(n, 2);
    return mk_int((int64_t)wl_hash_u64((uint64_t)as_int(a[0]), (uint64_t)as_int(a[1])));
}
static value nat_push(value *a, int n) {
    want(n, 2);
    array *arr = as_array(a[0]);
    if (arr->len == arr->cap) {
        if (arr->cap > (1 << 23)) die("array too long");
        arr->cap *= 2;
        arr->items = realloc(arr->items, sizeof(value) * (size_t)arr->cap);
        if (!arr->items) die("out of memory");
    }
    arr->items[arr->len++] = a[1];
    return mk_int(arr->len);
}
static value nat_clear(value *a, int n) { want(n, 1); as_array(a[0])->len = 0; return mk_int(0); }
/* map(src, dst, f): dst[i] = f(src[i]), calling back into the interpreter. */
static value nat_map(value *a, int n) {
    want(n, 3);
    array *src = as_array(a[0]), *dst = as_array(a[1]);
    if (dst->len < src->len) die("map: destination too short");
    value fnv = a[2];
    for (int64_t i = 0; i < src->len; i++) {
        value arg = src->items[i];
        dst->items[i] = call_value(fnv, &arg, 1);
    }
    return mk_int(src->len);
}

static const struct { const char *name; native_fn fn; } NATIVES[] = {
    { "array", nat_array }, { "len", nat_len }, { "pause", nat_pause }, { "mix", nat_mix },
    { "push", nat_push }, { "clear", nat_clear }, { "map", nat_map },
};

/* ---- compiler: source text straight to bytecode ------------------------- */

#include "interp_compile.h"

/* ---- the script --------------------------------------------------------- */

static const char SCRIPT[] =
    "var seed = 12345; var fib_g = 0; var primes_g = 0; var data_g = 0; var out_g = 0;\n"
    "fn rand() { seed = (seed * 6364136223846793005 + 1442695040888963407); return (seed >> 33) & 1048575; }\n"
    "fn fib(n) { if (n < 2) { return n; } return fib(n - 1) + fib(n - 2); }\n"
    "fn sieve(m, flags) {\n"
    "  var i = 0; var count = 0;\n"
    "  while (i < m) { flags[i] = 1; i = i + 1; }\n"
    "  i = 2;\n"
    "  while (i < m) {\n"
    "    if (flags[i]) { count = count + 1; var j = i * i; while (j < m) { flags[j] = 0; j = j + i; } }\n"
    "    i = i + 1;\n"
    "  }\n"
    "  return count;\n"
    "}\n"
    "fn swap(a, i, j) { var t = a[i]; a[i] = a[j]; a[j] = t; return 0; }\n"
    "fn qsort(a, lo, hi) {\n"
    "  if (lo >= hi) { return 0; }\n"
    "  var p = a[(lo + hi) / 2]; var i = lo; var j = hi;\n"
    "  while (i <= j) {\n"
    "    while (a[i] < p) { i = i + 1; }\n"
    "    while (a[j] > p) { j = j - 1; }\n"
    "    if (i <= j) { swap(a, i, j); i = i + 1; j = j - 1; }\n"
    "  }\n"
    "  qsort(a, lo, j); qsort(a, i, hi);\n"
    "  return 0;\n"
    "}\n"
    "fn square_mod(x) { return (x * x + 7) % 1000003; }\n"
    "fn round(r, n, flags, data, out) {\n"
    "  fib_g = fib(n); primes_g = sieve(len(flags), flags);\n"
    "  var h = mix(mix(r, fib_g), primes_g);\n"
    "  var i = 0; while (i < len(data)) { data[i] = rand(); i = i + 1; }\n"
    "  qsort(data, 0, len(data) - 1);\n"
    "  i = 1; var sorted = 1; var sum = data[0];\n"
    "  while (i < len(data)) { if (data[i - 1] > data[i]) { sorted = 0; } sum = sum + data[i]; i = i + 1; }\n"
    "  h = mix(mix(h, sorted), sum);\n"
    "  map(data, out, square_mod);\n"
    "  i = 0; sum = 0; while (i < len(out)) { sum = sum ^ (out[i] << (i & 15)); i = i + 1; }\n"
    "  return mix(h, sum);\n"
    "}\n";

/* Script entry: `rounds` rounds, pausing once half-way; returns the checksum. */
static const char MAIN[] =
    "fn main(rounds, n, m, k) {\n"
    "  var flags = array(m); var data = array(k); var out = array(k);\n"
    "  data_g = data; out_g = out;\n"
    "  var r = 0; var h = 0;\n"
    "  while (r < rounds) {\n"
    "    if (r == rounds / 2) { pause(); }\n"
    "    h = mix(h, round(r, n, flags, data, out));\n"
    "    r = r + 1;\n"
    "  }\n"
    "  return h;\n"
    "}\n";

int main(int argc, char **argv) {
    enum wl_size size = wl_parse_size(argc, argv, "interp");
    static const int64_t rounds[] = { 2, 12, 60 };
    const int64_t n = 22, m = 200000, k = 60000;
    for (size_t i = 0; i < sizeof NATIVES / sizeof NATIVES[0]; i++)
        define_native(NATIVES[i].name, NATIVES[i].fn);
    compile_program(SCRIPT);
    compile_program(MAIN);
    printf("interp: %d functions, %lld rounds\n", g_nfuncs, (long long)rounds[size]);

    value args[4] = { mk_int(rounds[size]), mk_int(n), mk_int(m), mk_int(k) };
    value result = call_value(global_value("main"), args, 4);
    uint64_t sum = wl_hash_u64(WL_FNV_OFFSET, (uint64_t)as_int(result));

    /* Independent checks, in C, of what the last round computed. */
    uint64_t a = 0, b = 1;
    for (int i = 0; i < n; i++) { uint64_t t = a + b; a = b; b = t; }
    char *flags = calloc((size_t)m, 1);
    int64_t primes = 0;
    for (int64_t i = 2; i < m; i++) {
        if (flags[i]) continue;
        primes++;
        for (int64_t j = i * i; j < m; j += i) flags[j] = 1;
    }
    free(flags);
    array *data = as_array(global_value("data_g")), *out = as_array(global_value("out_g"));
    int64_t sorted = 1;
    for (int64_t i = 1; i < data->len; i++)
        if (as_int(data->items[i - 1]) > as_int(data->items[i])) sorted = 0;
    int64_t bad_map = 0;
    for (int64_t i = 0; i < data->len; i++) {
        int64_t x = as_int(data->items[i]);
        if (as_int(out->items[i]) != (x * x + 7) % 1000003) bad_map++;
    }
    int64_t got_fib = as_int(global_value("fib_g")), got_primes = as_int(global_value("primes_g"));
    if (got_fib != (int64_t)a) wl_fail("the script's fib(%lld) is %lld, not %llu", (long long)n, (long long)got_fib, (unsigned long long)a);
    if (got_primes != primes) wl_fail("the script counts %lld primes below %lld, not %lld", (long long)got_primes, (long long)m, (long long)primes);
    if (!sorted) wl_fail("the script's sort left the array unsorted");
    if (bad_map) wl_fail("map produced %lld wrong entries", (long long)bad_map);
    printf("interp: %llu bytecode steps\n", (unsigned long long)g_steps);
    sum = wl_hash_u64(sum, g_steps);
    return wl_finish(sum);
}
