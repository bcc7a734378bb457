/*
 * interp_compile.h - the compiler of the `interp` workload: one pass from
 * source text to bytecode (no syntax tree), with precedence climbing for
 * expressions. Included once, by interp.c, after the VM's definitions.
 */

/* ---- globals ------------------------------------------------------------ */

static int find_global(const char *name) {
    for (int i = 0; i < g_nglobals; i++)
        if (strcmp(g_global_names[i], name) == 0) return i;
    return -1;
}

static int define_global(const char *name) {
    int i = find_global(name);
    if (i >= 0) return i;
    if (g_nglobals == MAX_GLOBALS || strlen(name) >= 32) die("too many globals or name too long");
    strcpy(g_global_names[g_nglobals], name);
    g_globals[g_nglobals] = (value){ T_NIL, 0 };
    return g_nglobals++;
}

static void define_native(const char *name, native_fn fn) {
    g_globals[define_global(name)] = (value){ T_NATIVE, (int64_t)(uintptr_t)fn };
}

static value global_value(const char *name) {
    int i = find_global(name);
    if (i < 0) die("no such global");
    return g_globals[i];
}

/* ---- lexer -------------------------------------------------------------- */

enum tok { K_EOF, K_NUM, K_NAME, K_FN, K_VAR, K_IF, K_ELSE, K_WHILE, K_RETURN, K_PUNCT };

typedef struct {
    const char *src;
    enum tok kind;
    char text[32];
    int64_t num;
    int line;
} lexer;

static lexer L;

static void syntax_error(const char *what) {
    fprintf(stderr, "interp: line %d: %s near '%s'\n", L.line, what, L.text);
    exit(1);
}

static void next_token(void) {
    const char *s = L.src;
    while (*s == ' ' || *s == '\n' || *s == '\t') L.line += *s++ == '\n';
    L.text[0] = '\0';
    if (*s == '\0') { L.kind = K_EOF; L.src = s; return; }
    if (*s >= '0' && *s <= '9') {
        uint64_t v = 0;
        while (*s >= '0' && *s <= '9') v = v * 10 + (uint64_t)(*s++ - '0');
        L.kind = K_NUM;
        L.num = (int64_t)v;
    } else if ((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_') {
        int n = 0;
        while ((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_') {
            if (n == 31) syntax_error("name too long");
            L.text[n++] = *s++;
        }
        L.text[n] = '\0';
        static const struct { const char *w; enum tok k; } KW[] = {
            { "fn", K_FN }, { "var", K_VAR }, { "if", K_IF }, { "else", K_ELSE },
            { "while", K_WHILE }, { "return", K_RETURN },
        };
        L.kind = K_NAME;
        for (size_t i = 0; i < sizeof KW / sizeof KW[0]; i++)
            if (strcmp(L.text, KW[i].w) == 0) L.kind = KW[i].k;
    } else {
        static const char *TWO[] = { "==", "!=", "<=", ">=", "<<", ">>" };
        L.kind = K_PUNCT;
        L.text[0] = *s;
        L.text[1] = '\0';
        for (size_t i = 0; i < sizeof TWO / sizeof TWO[0]; i++)
            if (s[0] == TWO[i][0] && s[1] == TWO[i][1]) { L.text[1] = s[1]; L.text[2] = '\0'; }
        s += strlen(L.text);
    }
    L.src = s;
}

static int is_punct(const char *p) { return L.kind == K_PUNCT && strcmp(L.text, p) == 0; }

static void expect(const char *p) {
    if (!is_punct(p)) syntax_error("unexpected token");
    next_token();
}

/* ---- compiler state ----------------------------------------------------- */

static function *C_fn;         /* function being compiled */
static char C_locals[64][32];  /* its locals, parameters first */
static int C_nlocals;
static int C_toplevel;         /* compiling top-level statements */

static int find_local(const char *name) {
    if (C_toplevel) return -1;
    for (int i = C_nlocals - 1; i >= 0; i--)
        if (strcmp(C_locals[i], name) == 0) return i;
    return -1;
}

static int add_local(const char *name) {
    if (C_nlocals == 64) syntax_error("too many locals");
    strcpy(C_locals[C_nlocals], name);
    if (C_nlocals + 1 > C_fn->nlocals) C_fn->nlocals = C_nlocals + 1;
    return C_nlocals++;
}

static void emit_get(const char *name) {
    int i = find_local(name);
    if (i >= 0) { emit16(C_fn, OP_GET_LOCAL, i); return; }
    i = find_global(name);
    if (i < 0) syntax_error("unknown name");
    emit16(C_fn, OP_GET_GLOBAL, i);
}

static void emit_set(const char *name) {
    int i = find_local(name);
    if (i >= 0) { emit16(C_fn, OP_SET_LOCAL, i); return; }
    i = find_global(name);
    if (i < 0) syntax_error("assignment to an undeclared name");
    emit16(C_fn, OP_SET_GLOBAL, i);
}

static int emit_jump(int op) {
    emit16(C_fn, op, 0);
    return C_fn->len;
}

static void patch_jump(int at) {
    int off = C_fn->len - at;
    if (off > 0xffff) syntax_error("jump too long");
    C_fn->code[at - 2] = (uint8_t)(off & 0xff);
    C_fn->code[at - 1] = (uint8_t)(off >> 8);
}

/* ---- expressions -------------------------------------------------------- */

static void expression(int min_prec);

static int call_args(void) {
    int argc = 0;
    expect("(");
    if (!is_punct(")")) {
        do {
            if (argc) next_token();
            expression(0);
            argc++;
        } while (is_punct(","));
    }
    expect(")");
    if (argc > 255) syntax_error("too many arguments");
    return argc;
}

static void primary(void) {
    if (L.kind == K_NUM) {
        emit16(C_fn, OP_CONST, add_const(C_fn, L.num));
        next_token();
    } else if (L.kind == K_NAME) {
        char name[32];
        strcpy(name, L.text);
        next_token();
        int g = find_local(name) < 0 ? find_global(name) : -1;
        if (is_punct("(") && g >= 0 && g_globals[g].tag == T_NATIVE) {
            int argc = call_args();
            emit16(C_fn, OP_NATIVE, g);
            emit(C_fn, argc);
        } else if (is_punct("(")) {
            emit_get(name);
            int argc = call_args();
            emit(C_fn, OP_CALL);
            emit(C_fn, argc);
        } else {
            emit_get(name);
        }
    } else if (is_punct("(")) {
        next_token();
        expression(0);
        expect(")");
    } else if (is_punct("-") || is_punct("!")) {
        int op = is_punct("-") ? OP_NEG : OP_NOT;
        next_token();
        primary();
        emit(C_fn, op);
        return;
    } else {
        syntax_error("expected an expression");
    }
    while (is_punct("[")) {
        next_token();
        expression(0);
        expect("]");
        emit(C_fn, OP_INDEX);
    }
}

static const struct { const char *p; int prec, op; } BINOPS[] = {
    { "|", 1, OP_BOR }, { "^", 2, OP_BXOR }, { "&", 3, OP_BAND },
    { "==", 4, OP_EQ }, { "!=", 4, OP_NE },
    { "<", 5, OP_LT }, { "<=", 5, OP_LE }, { ">", 5, OP_GT }, { ">=", 5, OP_GE },
    { "<<", 6, OP_SHL }, { ">>", 6, OP_SHR },
    { "+", 7, OP_ADD }, { "-", 7, OP_SUB },
    { "*", 8, OP_MUL }, { "/", 8, OP_DIV }, { "%", 8, OP_MOD },
};

static void expression(int min_prec) {
    primary();
    for (;;) {
        int found = -1;
        for (size_t i = 0; i < sizeof BINOPS / sizeof BINOPS[0]; i++)
            if (is_punct(BINOPS[i].p) && BINOPS[i].prec > min_prec) found = (int)i;
        if (found < 0) return;
        next_token();
        expression(BINOPS[found].prec);
        emit(C_fn, BINOPS[found].op);
    }
}

/* ---- statements --------------------------------------------------------- */

static void statement(void);

static void block(void) {
    expect("{");
    while (!is_punct("}")) {
        if (L.kind == K_EOF) syntax_error("unterminated block");
        statement();
    }
    next_token();
}

static void statement(void) {
    if (L.kind == K_VAR) {
        next_token();
        if (L.kind != K_NAME) syntax_error("expected a name");
        char name[32];
        strcpy(name, L.text);
        next_token();
        expect("=");
        expression(0);
        if (C_toplevel) emit16(C_fn, OP_SET_GLOBAL, define_global(name));
        else emit16(C_fn, OP_SET_LOCAL, find_local(name) >= 0 ? find_local(name) : add_local(name));
        expect(";");
    } else if (L.kind == K_IF) {
        next_token();
        expect("(");
        expression(0);
        expect(")");
        int skip = emit_jump(OP_JUMP_IF_FALSE);
        block();
        if (L.kind == K_ELSE) {
            next_token();
            int end = emit_jump(OP_JUMP);
            patch_jump(skip);
            block();
            patch_jump(end);
        } else {
            patch_jump(skip);
        }
    } else if (L.kind == K_WHILE) {
        next_token();
        int top = C_fn->len;
        expect("(");
        expression(0);
        expect(")");
        int exit_jump = emit_jump(OP_JUMP_IF_FALSE);
        block();
        emit16(C_fn, OP_LOOP, C_fn->len + 3 - top);
        patch_jump(exit_jump);
    } else if (L.kind == K_RETURN) {
        next_token();
        expression(0);
        emit(C_fn, OP_RET);
        expect(";");
    } else if (L.kind == K_NAME) {
        char name[32];
        strcpy(name, L.text);
        next_token();
        if (is_punct("=")) {
            next_token();
            expression(0);
            emit_set(name);
        } else if (is_punct("[")) {
            emit_get(name);
            next_token();
            expression(0);
            expect("]");
            expect("=");
            expression(0);
            emit(C_fn, OP_SET_INDEX);
        } else {
            /* A call for its effect: compile it as an expression, drop the result. */
            int g = find_local(name) < 0 ? find_global(name) : -1;
            if (!is_punct("(")) syntax_error("expected '=', '[' or '('");
            if (g >= 0 && g_globals[g].tag == T_NATIVE) {
                int argc = call_args();
                emit16(C_fn, OP_NATIVE, g);
                emit(C_fn, argc);
            } else {
                emit_get(name);
                int argc = call_args();
                emit(C_fn, OP_CALL);
                emit(C_fn, argc);
            }
            emit(C_fn, OP_POP);
        }
        expect(";");
    } else {
        syntax_error("expected a statement");
    }
}

static function *new_function(const char *name) {
    if (g_nfuncs == MAX_FUNCS) die("too many functions");
    function *f = &g_funcs[g_nfuncs++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    return f;
}

/* `fn name(params) { body }` at top level. */
static void function_definition(void) {
    next_token();
    if (L.kind != K_NAME) syntax_error("expected a function name");
    function *fn = new_function(L.text);
    g_globals[define_global(L.text)] = (value){ T_FN, fn - g_funcs };
    next_token();
    function *outer = C_fn;
    C_fn = fn;
    C_toplevel = 0;
    C_nlocals = 0;
    expect("(");
    while (!is_punct(")")) {
        if (L.kind != K_NAME) syntax_error("expected a parameter name");
        add_local(L.text);
        fn->arity++;
        next_token();
        if (is_punct(",")) next_token();
    }
    next_token();
    block();
    emit(fn, OP_NIL);
    emit(fn, OP_RET);
    C_fn = outer;
    C_toplevel = 1;
}

/* Compile a program and run its top-level statements. */
static void compile_program(const char *src) {
    L = (lexer){ .src = src, .line = 1 };
    next_token();
    function *top = new_function("<top>");
    C_fn = top;
    C_toplevel = 1;
    while (L.kind != K_EOF) {
        if (L.kind == K_FN) function_definition();
        else statement();
    }
    emit(top, OP_NIL);
    emit(top, OP_RET);
    value tv = { T_FN, top - g_funcs };
    call_value(tv, NULL, 0);
}
